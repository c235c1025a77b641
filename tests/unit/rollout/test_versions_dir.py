"""Where a replica receives versions: shared memory where the directory exists, else its weights_dir."""

from services.rollout.config import RolloutSettings
from services.rollout.weight_sync import versions_dir


def test_versions_go_to_the_shared_memory_directory_when_it_exists(tmp_path):
    settings = RolloutSettings(replica_id="r7", weights_shm_dir=str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    where = versions_dir(settings, tmp_path / "weights")
    assert where.parent == tmp_path / "shm" and where.name.startswith("relayrl-weights-r7-")


def test_without_the_shared_memory_directory_versions_go_to_weights_dir(tmp_path):
    missing = RolloutSettings(replica_id="r7", weights_shm_dir=str(tmp_path / "no-shm"))
    off = RolloutSettings(replica_id="r7", weights_shm_dir="")
    for settings in (missing, off):
        where = versions_dir(settings, tmp_path / "weights")
        assert where.parent == tmp_path / "weights" and where.name.startswith("relayrl-weights-r7-")


def test_two_runs_with_the_same_replica_id_never_share_a_directory(tmp_path):
    # Every local stack has a rollout-0; a restarted replica must find its own files again.
    settings = RolloutSettings(replica_id="rollout-0", weights_shm_dir=str(tmp_path))
    run_a, run_b = tmp_path / "run-a" / "weights", tmp_path / "run-b" / "weights"
    assert versions_dir(settings, run_a) != versions_dir(settings, run_b)
    assert versions_dir(settings, run_a) == versions_dir(settings, run_a)
