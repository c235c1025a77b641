"""Small networking helpers for local processes and tests."""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import tempfile
import threading
import time
from pathlib import Path

# Ports handed out come from below the kernel's ephemeral range and above this.
_LOWEST_PORT = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# How long a port handed out stays claimed against other processes on this machine: time for the
# process it was meant for to start (importing torch) and bind it.
_CLAIM_S = 300.0


class _Claims:
    """The ports that processes of this user on this machine handed out lately: a file per port,
    its modification time when. One lock file makes the look and the claim a single step.

    Two processes walking ports side by side (pytest-xdist workers) could both find one free
    before either bound it; the second's server then died on "Failed to bind"."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def claim(self, port: int) -> bool:
        """Claims ``port``, unless another process did within _CLAIM_S."""
        try:
            self.root.mkdir(mode=0o700, exist_ok=True)
            with (self.root / "lock").open("a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                path = self.root / str(port)
                try:
                    if time.time() - path.stat().st_mtime < _CLAIM_S:
                        return False
                except FileNotFoundError:
                    pass
                path.touch()
                return True
        except OSError:
            return True  # nowhere to share claims (a read-only temp directory): the bind check alone


class _PortWalk:
    """Hands out ports below the kernel's ephemeral range, each once per process.

    A port is picked here and bound later, often by another process still importing torch. Two
    ways that went wrong with ports the kernel chose (``bind`` to port 0): the kernel could choose
    the same port again for the next pick, while the first was not bound yet (an engine's port was
    also given to its rollout's gRPC server, and the engine died on "Address already in use"); and
    any outgoing connection or port-0 server on the machine takes its port from that range too. So
    ports come from below it, in order from a random start (processes picking side by side, as
    pytest-xdist workers do, start far apart), and one is handed out only if it binds now and no
    other process on this machine handed it out lately (:class:`_Claims`).
    """

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new random start, from the operating system's randomness: a process whose global
        ``random`` was seeded, or one forked from a parent that already picked, starts elsewhere."""
        self._lock = threading.Lock()
        self._high = _ephemeral_low() - 1
        self._next = _LOWEST_PORT + secrets.randbelow(self._high - _LOWEST_PORT + 1)
        self._left = self._high - _LOWEST_PORT + 1

    def take(self, host: str) -> int:
        with self._lock:
            while self._left > 0:
                port, self._left = self._next, self._left - 1
                self._next = port + 1 if port < self._high else _LOWEST_PORT
                if _binds(host, port) and _claims.claim(port):
                    return port
        raise OSError(f"no free port left in {_LOWEST_PORT}..{self._high} in this process")


def _ephemeral_low() -> int:
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    return low if low > _LOWEST_PORT + 1000 else 32768


def _binds(host: str, port: int) -> bool:
    # Without SO_REUSEADDR a port still in TIME_WAIT fails too: stricter than the server's own bind.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


_claims = _Claims(Path(tempfile.gettempdir()) / f"relayrl-ports-{os.getuid()}")
_walk = _PortWalk()
os.register_at_fork(after_in_child=_walk.restart)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free now, for a server that binds it soon after; never the same one twice in a process."""
    return _walk.take(host)


def port_open(host: str, port: int) -> bool:
    """True when something accepts TCP connections on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    """Blocks until something accepts TCP connections on ``host:port``; raises TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while not port_open(host, port):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s:.0f}s")
        time.sleep(0.05)
