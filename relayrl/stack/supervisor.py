"""Starts components in order, waits for each to be ready, watches them, stops them in reverse.

A component that fails to start, or dies while the stack runs, stops the whole stack with a
message naming it; SIGINT and SIGTERM stop everything that was started, leaving no process.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from relayrl.stack.process import ComponentError, ComponentSpec, ManagedProcess

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, sink: TextIO | None = sys.stderr) -> None:
        self._sink = sink
        self.components: list[ManagedProcess] = []
        self._stopped = threading.Event()

    def start(self, spec: ComponentSpec) -> ManagedProcess:
        """Starts ``spec`` and blocks until it is ready."""
        component = ManagedProcess(spec, self._sink)
        self.components.append(component)
        component.start()
        component.wait_ready()
        log.info("%s is ready", spec.name)
        return component

    def start_all(self, specs: Sequence[ComponentSpec]) -> list[ManagedProcess]:
        """Starts every spec at once and waits for all (for components that need each other to be up)."""
        started = []
        for spec in specs:
            component = ManagedProcess(spec, self._sink)
            self.components.append(component)
            component.start()
            started.append(component)
        for component in started:
            component.wait_ready()
            log.info("%s is ready", component.name)
        return started

    def get(self, name: str) -> ManagedProcess:
        return next(c for c in self.components if c.name == name)

    def check_alive(self, exited_ok: Sequence[str] = ()) -> None:
        """Raises ComponentError for the first component that died (ones in ``exited_ok`` may exit 0)."""
        for component in self.components:
            if component.running() or component.process is None:
                continue
            code = component.process.returncode
            if component.name in exited_ok and code == 0:
                continue
            raise ComponentError(component.name, f"exited with code {code}", output=component.recent_output())

    def stop_all(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        for component in reversed(self.components):
            component.stop()


@contextmanager
def supervised(sink: TextIO | None = sys.stderr) -> Iterator[Supervisor]:
    """A supervisor whose components are stopped on exit, on an error, and on SIGINT/SIGTERM."""
    supervisor = Supervisor(sink)

    def on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield supervisor
    finally:
        # A second Ctrl-C while stopping must not leave orphans either.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        supervisor.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
