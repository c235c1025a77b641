"""Starting the built-in engine as a child process on one port (for benchmarks and tests), and
waiting until it answers ``/health``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from relayrl.subprocesses import Process, start_process, wait_serving

ENGINE_MODULE = "services.engine.cli"


def launch_engine(
    model_dir: Path,
    port: int,
    stderr: int = subprocess.DEVNULL,
    cwd: Path | None = None,
    settings: Mapping[str, str] | None = None,
    module: str = ENGINE_MODULE,
) -> Process:
    """``relayrl engine serve`` on ``port`` with one torch thread (several engines share the CPUs);
    ``settings`` adds environment variables (``RELAYRL_ENGINE_*``) over the defaults. The engine
    ends with its caller, killed or not: one left behind keeps its share of the GPU. ``module`` is
    the command-line module whose ``serve`` starts it (a bench's may change the engine first)."""
    env = {**os.environ, "RELAYRL_ENGINE_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", **(settings or {})}
    return start_process(
        [sys.executable, "-m", module, "serve", "--model", str(model_dir), "--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        end_with_caller=True,
    )


def wait_engine_healthy(process: Process, url: str, timeout_s: float) -> None:
    """Returns once ``url/health`` answers 200; raises :class:`~relayrl.subprocesses.ProcessExited` if the process ends
    first, ``TimeoutError`` after ``timeout_s`` (the process is left running)."""
    wait_serving(process, f"{url}/health", timeout_s, "engine")
