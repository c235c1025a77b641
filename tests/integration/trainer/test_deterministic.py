"""The trainer's ``deterministic`` setting is in force in the trainer (torch says so in the run's
replay config) and in its replay, which reports the comparison it owes the run: bit for bit on CPU,
with both differences zero."""

from __future__ import annotations

from tests.integration.trainer.replay_run import train_and_replay


def test_a_deterministic_run_and_its_replay_compute_with_deterministic_algorithms(
    redis_server, tiny_model_dir, tmp_path
):
    got = train_and_replay(redis_server.url, tiny_model_dir, tmp_path, deterministic=True)
    assert got.config["settings"]["deterministic"] is True
    assert got.config["deterministic_algorithms"] is True, "the trainer process ran without them"
    assert got.returncode == 0, got.stderr[-3000:]
    report = got.report
    assert report["deterministic"] is True, "the replay ran without them"
    assert (report["device"], report["comparison"], report["tolerance"]) == ("cpu", "bitwise", None)
    assert [c["step"] for c in report["checkpoints"]] == [2, 4]
    for checkpoint in report["checkpoints"]:
        assert checkpoint["equal"] and checkpoint["within"], checkpoint
        assert checkpoint["max_abs_diff"] == checkpoint["max_rel_diff"] == 0.0
    assert report["all_equal"] and report["reproduced"]
