"""Where a replica receives versions: shared memory where the directory exists, else its weights_dir."""

from services.rollout.config import RolloutSettings
from services.rollout.weight_sync import versions_dir


def test_versions_go_to_the_shared_memory_directory_when_it_exists(tmp_path):
    settings = RolloutSettings(replica_id="r7", weights_shm_dir=str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    assert versions_dir(settings, tmp_path / "weights") == tmp_path / "shm" / "relayrl-weights-r7"


def test_without_the_shared_memory_directory_versions_go_to_weights_dir(tmp_path):
    missing = RolloutSettings(replica_id="r7", weights_shm_dir=str(tmp_path / "no-shm"))
    off = RolloutSettings(replica_id="r7", weights_shm_dir="")
    for settings in (missing, off):
        assert versions_dir(settings, tmp_path / "weights") == tmp_path / "weights" / "relayrl-weights-r7"
