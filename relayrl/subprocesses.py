"""Child processes the one way every service, bench and test handles them: wait until one serves
(an HTTP probe answers 200, or it exits first), and stop it (ask with SIGTERM, wait, then kill
what did not stop in time, and always reap it)."""

from __future__ import annotations

import signal
import subprocess
import time

import httpx

from relayrl import http_client


class ProcessExited(RuntimeError):
    """A child process ended before it served."""


def wait_serving(process: subprocess.Popen, probe_url: str, timeout_s: float, what: str) -> None:
    """Returns once ``probe_url`` answers 200; raises :class:`ProcessExited` if ``process`` ends
    first, ``TimeoutError`` after ``timeout_s`` (the process is left running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ProcessExited(f"{what} process exited with {process.returncode} during start-up")
        try:
            if http_client.get(probe_url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} at {probe_url} did not answer 200 within {timeout_s:.0f}s")


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
