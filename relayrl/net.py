"""Small networking helpers for local processes and tests."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
