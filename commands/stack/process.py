"""One supervised child process: started in its own session, its output prefixed, stopped as a group.

Each component runs in a new process session, so stopping it signals the whole group (an engine
and its helpers). Processes that leave the group are found by a tag in their environment, which
every descendant inherits: torchrun starts each worker in a session of its own, so a SIGKILLed
torchrun would otherwise orphan workers that keep its ports (and a restart could not bind them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import httpx

from relayrl import http_client
from relayrl.forkserver import ForkedProcess
from relayrl.subprocesses import start_process

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], bool]


def http_ready(url: str) -> ReadyCheck:
    """Ready when ``url`` answers 200 (a service's ``/readyz``)."""

    def check() -> bool:
        try:
            return http_client.get(url, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    return check


@dataclass
class ComponentSpec:
    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    ready: ReadyCheck | None = None
    ready_timeout_s: float = 120.0
    # How the component can be fixed when it fails to start (shown to the user).
    hint: str = ""
    # Also keep the component's whole output here (the terminal shows it prefixed).
    log_file: Path | None = None
    # CPUs the process (and every thread and child it starts) may run on; None: all.
    cpus: tuple[int, ...] | None = None


class ManagedProcess:
    def __init__(self, spec: ComponentSpec, sink: TextIO | None = sys.stderr, tail_lines: int = 40) -> None:
        self.spec = spec
        self._sink = sink
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._pump: threading.Thread | None = None
        self.process: subprocess.Popen[str] | ForkedProcess | None = None
        self._tag = f"{TAG_VARIABLE}={spec.name}:{uuid.uuid4().hex}"

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        name, value = self._tag.split("=", 1)
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1", name: value}
        try:
            self.process = start_process(
                self.spec.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                new_session=True,
                cpus=self.spec.cpus,
                # A stack that dies without stopping its components (SIGKILL, a crash) takes them
                # along instead of leaving them holding its ports, Redis and GPU memory.
                end_with_caller=True,
            )
        except FileNotFoundError as exc:
            raise ComponentError(
                self.name, f"cannot run {self.spec.argv[0]!r}: {exc.strerror}", self.spec.hint
            ) from None
        self._pump = threading.Thread(target=self._pump_output, name=f"log-{self.name}", daemon=True)
        self._pump.start()

    def _pump_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        log_file = self.spec.log_file.open("a") if self.spec.log_file else None
        try:
            for line in self.process.stdout:
                line = line.rstrip("\n")
                self._tail.append(line)
                if self._sink is not None:
                    print(f"[{self.name}] {line}", file=self._sink, flush=True)
                if log_file is not None:
                    print(line, file=log_file, flush=True)
        finally:
            if log_file is not None:
                log_file.close()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def recent_output(self) -> str:
        return "\n".join(self._tail)

    def wait_ready(self) -> None:
        """Blocks until the ready check passes; raises ComponentError if the process dies or times out."""
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while True:
            if not self.running():
                code = self.process.returncode if self.process else None
                self._join_pump()
                raise ComponentError(
                    self.name, f"exited with code {code} before it was ready", self.spec.hint, self.recent_output()
                )
            if self.spec.ready is None or self.spec.ready():
                return
            if time.monotonic() > deadline:
                raise ComponentError(
                    self.name, f"not ready after {self.spec.ready_timeout_s:.0f}s", self.spec.hint, self.recent_output()
                )
            time.sleep(0.2)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the process group, SIGKILL to whatever is left after ``timeout_s``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", self.name, timeout_s)
        # Children may outlive the leader (torchrun workers); the group is killed either way.
        self._signal_group(signal.SIGKILL)
        self.process.wait()
        self._wait_group_gone()
        self._join_pump()

    def restart(self) -> None:
        """Starts the component again after it died; whatever is left of its old group goes first
        (torchrun workers outliving their launcher would hold the ports the new one needs)."""
        assert self.process is not None and self.process.poll() is not None
        self._signal_group(signal.SIGKILL)
        self._wait_group_gone()
        self._join_pump()
        self.start()

    def kill(self) -> None:
        """Crash the component (SIGKILL to its whole group), as a failure test would."""
        if self.process is not None:
            self._signal_group(signal.SIGKILL)
            self.process.wait()
            self._wait_group_gone()
            self._join_pump()

    def pids(self) -> list[int]:
        """Every running process of the component (the launcher and what it started). A launcher
        forked by the fork server carries the server's environment, not the tag: it is named here."""
        found = set(_tagged(self._tag))
        if self.running():
            assert self.process is not None
            found.add(self.process.pid)
        return sorted(found)

    def signal_all(self, sig: signal.Signals) -> None:
        """Sends ``sig`` to every process of the component: its group and any that left it."""
        self._signal_group(sig)

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        for pid in _tagged(self._tag):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _wait_group_gone(self, timeout_s: float = 5.0) -> None:
        """Returns once no process of the component runs: SIGKILL is delivered asynchronously, and
        an orphaned child may still be running for a moment after the signal was sent."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while (_group_running(self.process.pid) or _tagged(self._tag)) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _join_pump(self) -> None:
        if self._pump is not None:
            self._pump.join(timeout=5)


TAG_VARIABLE = "RELAYRL_STACK_COMPONENT"


def _pids() -> list[int]:
    """Every process id in /proc now. Read by listing, not globbing: a glob stats each match, and a
    process that exits in between makes the stat fail with ESRCH, which pathlib does not ignore."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _tagged(tag: str) -> list[int]:
    """Running processes (not zombies) whose environment carries ``tag``."""
    needle = tag.encode() + b"\0"
    found = []
    for pid in _pids():
        try:
            if needle not in Path(f"/proc/{pid}/environ").read_bytes() + b"\0":
                continue
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # exited while we looked, or not ours to read
        if state != "Z":
            found.append(pid)
    return found


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies waiting to be reaped are not)."""
    for pid in _pids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class ComponentError(RuntimeError):
    """A component failed to start or died; the message names it and the cause."""

    def __init__(self, component: str, cause: str, hint: str = "", output: str = "") -> None:
        message = f"{component}: {cause}"
        if hint:
            message += f"\n  hint: {hint}"
        if output:
            message += "\n  last output:\n    " + output.replace("\n", "\n    ")
        super().__init__(message)
        self.component = component
