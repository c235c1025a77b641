"""Starting the built-in engine as a child process on one port (for benchmarks and tests), and
waiting until it answers ``/health``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx


class EngineExited(RuntimeError):
    """The engine process ended before it answered ``/health``."""


def launch_engine(
    model_dir: Path, port: int, stderr: int = subprocess.DEVNULL, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """``relayrl engine serve`` on ``port`` with one torch thread (several engines share the CPUs)."""
    env = {**os.environ, "RELAYRL_ENGINE_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "relayrl.cli", "engine", "serve", "--model", str(model_dir), "--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def wait_engine_healthy(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    """Returns once ``url/health`` answers 200; raises :class:`EngineExited` if the process ends
    first, ``TimeoutError`` after ``timeout_s`` (the process is left running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineExited(f"engine process exited with {process.returncode} during start-up")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"engine at {url} did not answer /health within {timeout_s:.0f}s")
