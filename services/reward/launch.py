"""Starting the reward service as a child process (for the benchmark and tests), and waiting
until its model is loaded (``/readyz``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from relayrl.subprocesses import Process, start_process, wait_serving


def launch_reward(
    model_dir: Path,
    port: int,
    env: dict[str, str] | None = None,
    stderr: int = subprocess.DEVNULL,
    cwd: Path | None = None,
) -> Process:
    """``relayrl reward serve`` on ``port``; ``env`` adds ``RELAYRL_REWARD_*`` settings. The service
    ends with its caller, killed or not."""
    return start_process(
        [sys.executable, "-m", "services.reward.cli", "serve", "--model", str(model_dir), "--port", str(port)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        end_with_caller=True,
    )


def wait_reward_ready(process: Process, url: str, timeout_s: float) -> None:
    """Returns once ``url/readyz`` answers 200; raises :class:`~relayrl.subprocesses.ProcessExited` if the process ends
    first, ``TimeoutError`` after ``timeout_s`` (the process is left running)."""
    wait_serving(process, f"{url}/readyz", timeout_s, "reward")
