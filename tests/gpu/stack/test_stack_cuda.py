"""The whole loop on one GPU (`make test-gpu`; skipped where torch sees no CUDA device):

- ``relayrl up`` of the GPU example (``commands/stack/configs/long_add_gpu.yaml``, the ``small``
  preset, trainer and engine sharing one GPU) for a few steps: it finishes, the trainer computed
  on the GPU (its peak device memory is reported only there), the engine served on it (it captured
  or tried CUDA graphs, which only a CUDA engine does), and weight versions reached the rollout,
  handed to the engine by CUDA IPC handle;
- NVML reads the GPU's name and a busy fraction that a GPU kept busy shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import yaml

from commands.stack.gpus import visible_gpus
from relayrl.gpu_busy import GpuBusyMeter, NvmlGpus

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[3]
GPU_CONFIG = REPO / "commands" / "stack" / "configs" / "long_add_gpu.yaml"
STEPS = 4


# up's own time limit, not pytest's 300 s: cold imports, the engine's graphs and the trainer's compile come first.
@pytest.mark.timeout(960)
def test_up_runs_the_gpu_example_for_a_few_steps_on_one_gpu(tmp_path: Path) -> None:
    config = yaml.safe_load(GPU_CONFIG.read_text())
    config["stack"] |= {"runs_dir": str(tmp_path / "runs"), "run_id": "gpu"}
    # One GPU: the first visible by index; a host that names its GPUs by UUID in CUDA_VISIBLE_DEVICES
    # (which stack.gpus cannot hold) gives the test machine's one.
    if (first := visible_gpus()[0]).isdigit():
        config["stack"]["gpus"] = [int(first)]
    # A few steps from the untrained small model, validated once at the end.
    config["trainer"] |= {"total_steps": STEPS, "val_before_train": False, "test_freq": STEPS, "dataset_size": 256}
    # Few decode graphs keep the engine's start short; larger batches decode eagerly.
    config["engine"] |= {"cuda_graph_max_bs": 16}
    path = tmp_path / "long_add_gpu.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--config", str(path)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=900,
    )  # fmt: skip
    run_dir = tmp_path / "runs" / "gpu"
    assert done.returncode == 0, done.stderr[-4000:]
    assert "trainer on GPU" in done.stderr  # the one line: trainer and engine share the GPU
    report = json.loads((run_dir / "report.json").read_text())
    assert report["steps"] == STEPS and report["max_sample_age"] <= config["stack"]["max_staleness"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "trainer/global_steps" in r]
    assert all(r["perf/max_memory_allocated_gb"] > 0 for r in steps)
    assert "CUDA graphs" in (run_dir / "logs" / "engine-0.log").read_text()
    # Versions went trainer -> paramsync -> rollout -> the engine's GPU memory: at η = 2 the last of 4
    # steps (version 3) takes only groups generated on version 1 or later, so it finished only because
    # the engine served a published version.
    assert steps[-1]["trainer/param_sync_count"] >= STEPS - 1
    # Trainer and engine share the GPU: the stack has the trainer share versions by CUDA IPC handle,
    # and the engine opened them (a refused handle would be logged as a fall back to the bytes).
    assert any(r.get("trainer/weights_shared_by_handle") == 1.0 for r in steps)
    assert "did not load by handle" not in (run_dir / "logs" / "rollout-0.log").read_text()
    assert STEPS - 1 - config["stack"]["max_staleness"] >= 1


def test_nvml_names_the_gpu_and_sees_it_busy() -> None:
    gpu = visible_gpus()[0]
    nvml = NvmlGpus([gpu])
    assert nvml.names and nvml.names[0]
    meter = GpuBusyMeter(nvml, period_s=0.2)
    enough = threading.Event()
    a = torch.randn(4096, 4096, device="cuda")
    meter.start()
    timer = threading.Timer(3.0, enough.set)
    timer.start()
    while not enough.is_set():
        a = (a @ a).tanh_()
    torch.cuda.synchronize()
    busy = meter.stop()
    assert busy is not None and busy > 0.5, busy
