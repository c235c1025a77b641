"""A trainer set to ``device: cpu`` on a machine with GPUs (the GPU host's CPU pipeline, a CPU
reference run) trains on the CPU: FSDP2 shards it on a CPU mesh, though FSDP2's default mesh is
torch's accelerator (there the GPU, where the parameters would silently move)."""

from __future__ import annotations

import json
import sys

from tests.integration.trainer.harness import run_logged


def test_a_cpu_trainer_stays_on_the_cpu_where_torch_reports_a_gpu(tiny_model_dir, tmp_path):
    # One rank forms its own group of one (services/trainer/distributed.py), as the stack's trainer does.
    cmd = [sys.executable, "-m", "tests.integration.trainer.accelerator_worker", str(tiny_model_dir)]
    out = run_logged(cmd, tmp_path / "worker.log")
    report = json.loads(next(line for line in out.splitlines() if line.startswith('{"mesh"')))
    assert report == {"mesh": ["cpu"], "devices": ["cpu"]}
