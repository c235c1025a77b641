"""Stopping a child process the one way every service, bench and test does: ask (SIGTERM), wait,
then kill what did not stop in time, and always reap it."""

from __future__ import annotations

import signal
import subprocess


def stop_process(proc: subprocess.Popen, timeout_s: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """Sends ``sig`` to a running ``proc``, waits ``timeout_s``, then SIGKILLs it; its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
