"""Child processes the one way every service, bench and test handles them: start a Python
service (through the fork server where one is named), wait until one serves (an HTTP probe answers
200, or it exits first), and stop it (ask with SIGTERM, wait, then kill what did not stop in time,
and always reap it)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from relayrl import forkserver, http_client, lifeline

log = logging.getLogger(__name__)

# What :func:`start_process` returns: both answer Popen's pid, returncode, poll, wait and signals.
Process = subprocess.Popen | forkserver.ForkedProcess


def start_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    stdin: Any = None,
    stdout: Any = None,
    stderr: Any = None,
    text: bool = False,
    new_session: bool = False,
    cpus: Sequence[int] | None = None,
    end_with_caller: bool = False,
) -> Process:
    """``argv`` with ``env`` (the whole environment), as ``subprocess.Popen`` starts it.

    ``python -m MODULE ...`` of this interpreter, where ``env`` names a fork server
    (``RELAYRL_FORKSERVER``), is forked from that server with its imports already done, unless the
    server cannot start it as a new interpreter would (or is gone). ``cpus`` pins the process, and
    every thread and child it makes. ``end_with_caller``: it gets SIGTERM once this process is gone
    (:mod:`relayrl.lifeline`); call from a thread that lives as long as the process should.
    """
    server = env.get(forkserver.ENV_VARIABLE)
    if server and len(argv) > 2 and list(argv[:2]) == [sys.executable, "-m"]:
        try:
            return forkserver.spawn(
                server, argv[2], argv[3:], env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
                text=text, new_session=new_session, cpus=cpus, end_with_caller=end_with_caller,
            )  # fmt: skip
        except OSError as exc:
            log.debug("starting %s as a new interpreter: %s", argv[2], exc)
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=text,
        bufsize=1 if text else -1,
        start_new_session=new_session,
        preexec_fn=_in_child(cpus, os.getpid() if end_with_caller else None),
    )


def _in_child(cpus: Sequence[int] | None, caller: int | None) -> Callable[[], None] | None:
    """What runs in the child between fork and exec, so that the program starts on its CPUs (every
    thread and child it makes inherits them) and with its parent's death signal set. It makes
    system calls only and takes no lock, which is what makes a preexec_fn safe beside this
    process's threads."""
    if not cpus and caller is None:
        return None

    def setup() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if caller is not None:
            lifeline.end_with_parent(caller)

    return setup


class ProcessExited(RuntimeError):
    """A child process ended before it served."""


def wait_serving(process: Process, probe_url: str, timeout_s: float, what: str) -> None:
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


def stop_process(proc: Process, timeout_s: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """Sends ``sig`` to a running ``proc``, waits ``timeout_s``, then SIGKILLs it; its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
