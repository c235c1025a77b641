"""A private ``redis-server`` process: for the local stack, the demo and the tests.

It listens on loopback only, keeps its data in its own directory and uses AOF persistence
(``appendfsync`` configurable), so the same durability rules hold as in a cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from relayrl.net import free_port, wait_for_port
from relayrl.subprocesses import stop_process

INSTALL_HINT = (
    "install it with `apt-get install redis-server` (or run `make setup` as root), "
    "or offline from a bundle with scripts/install-offline.sh"
)


def redis_server_binary() -> str:
    """The environment's own redis-server first (scripts/install-offline.sh puts one in the venv's
    bin/, found whether or not the venv is activated), then the one on PATH."""
    own = Path(sysconfig.get_path("scripts")) / "redis-server"
    if os.access(own, os.X_OK):
        return str(own)
    path = shutil.which("redis-server")
    if path is None:
        raise FileNotFoundError(f"redis-server not found in {own.parent} or on PATH; {INSTALL_HINT}")
    return path


@dataclass
class RedisProcess:
    data_dir: Path
    port: int = 0
    appendfsync: str = "everysec"
    password: str = ""
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        """The ``redis-server`` command line (picks a free port if none was set)."""
        if self.appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, got {self.appendfsync!r}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        args = [
            redis_server_binary(),
            "--bind", self.host,
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        return args

    def start(self, timeout_s: float = 10.0) -> RedisProcess:
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_port(self.host, self.port, timeout_s)
        except TimeoutError:
            self.stop()
            log = (self.data_dir / "redis.log").read_text() if (self.data_dir / "redis.log").exists() else ""
            raise RuntimeError(f"redis-server did not start on port {self.port}: {log[-500:]}") from None
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful stop (SIGTERM): Redis flushes its AOF before exiting."""
        if self.process is None:
            return
        stop_process(self.process, timeout_s)
        self.process = None

    def kill(self) -> None:
        """Crash stop (SIGKILL): whatever the AOF policy had not written is lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self, timeout_s: float = 10.0) -> RedisProcess:
        self.stop()
        time.sleep(0.05)
        return self.start(timeout_s)
