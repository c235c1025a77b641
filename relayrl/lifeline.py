"""A child that ends when the process that started it is gone.

A local stack's components run in sessions of their own, so that a stop reaches each whole group
and a Ctrl-C at the terminal reaches only the stack. That also means nothing ends them if the
stack itself dies without stopping them (SIGKILL, an out-of-memory kill, a crash): they would keep
their ports, their Redis and, on a GPU host, their GPU memory, and the next ``relayrl up`` would
fail on all three. Linux sends a child a chosen signal when its parent dies (``PR_SET_PDEATHSIG``);
each component asks for SIGTERM, the stop it handles gracefully.

The kernel counts the *thread* that forked the child as its parent: a component must be started
from a thread that lives as long as the stack (the supervisor starts and restarts them from the
thread that runs the stack).
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1
# Resolved here, in the parent: between fork and exec a child must not load libraries.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def end_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """In a child (after fork): ``sig`` arrives when ``parent_pid``, its parent, is gone. A parent
    that died before this call leaves no signal to come, so the child then takes ``sig`` at once."""
    if _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)
