"""Starting the reward service as a child process (for the benchmark and tests), and waiting
until its model is loaded (``/readyz``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx


class RewardExited(RuntimeError):
    """The reward process ended before it was ready."""


def launch_reward(
    model_dir: Path,
    port: int,
    env: dict[str, str] | None = None,
    stderr: int = subprocess.DEVNULL,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """``relayrl reward serve`` on ``port``; ``env`` adds ``RELAYRL_REWARD_*`` settings."""
    return subprocess.Popen(
        [sys.executable, "-m", "relayrl.cli", "reward", "serve", "--model", str(model_dir), "--port", str(port)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def wait_reward_ready(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    """Returns once ``url/readyz`` answers 200; raises :class:`RewardExited` if the process ends
    first, ``TimeoutError`` after ``timeout_s`` (the process is left running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RewardExited(f"reward process exited with {process.returncode} during start-up")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"reward service at {url} was not ready within {timeout_s:.0f}s")
