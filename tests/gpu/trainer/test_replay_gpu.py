"""`relayrl replay` of a CUDA run (`make test-gpu`): with ``deterministic: true`` every checkpoint
replays bit for bit; without it the replay compares within the stated tolerance of max_rel_diff
and reproduces the run within it. The run is the real trainer on the test stack (queue, paramsync,
synthetic rollout), on one GPU."""

from __future__ import annotations

import pytest

from services.trainer.replay import CUDA_TOLERANCE
from tests.integration.trainer.replay_run import train_and_replay

pytestmark = pytest.mark.gpu


def test_a_deterministic_cuda_run_replays_bit_for_bit(redis_server, tiny_model_dir, tmp_path):
    got = train_and_replay(redis_server.url, tiny_model_dir, tmp_path, device="cuda", deterministic=True)
    assert got.config["deterministic_algorithms"] is True
    assert got.returncode == 0, got.stderr[-3000:]
    report = got.report
    assert report["deterministic"] is True and report["comparison"] == "bitwise", report
    assert [c["step"] for c in report["checkpoints"]] == [2, 4]
    assert all(c["equal"] and c["max_abs_diff"] == 0.0 for c in report["checkpoints"]), report["checkpoints"]
    assert report["reproduced"]


def test_a_cuda_run_without_deterministic_algorithms_replays_within_the_stated_tolerance(
    redis_server, tiny_model_dir, tmp_path
):
    got = train_and_replay(redis_server.url, tiny_model_dir, tmp_path, device="cuda")
    assert got.config["deterministic_algorithms"] is False
    assert got.returncode == 0, got.stderr[-3000:]
    report = got.report
    assert report["deterministic"] is False and report["comparison"] == "tolerance", report
    assert report["tolerance"] == {"measure": "max_rel_diff", "value": CUDA_TOLERANCE}
    assert [c["step"] for c in report["checkpoints"]] == [2, 4]
    assert all(c["max_rel_diff"] <= CUDA_TOLERANCE for c in report["checkpoints"]), report["checkpoints"]
    assert report["reproduced"]
