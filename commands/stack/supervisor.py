"""Starts components in order, waits for each to be ready, watches them, stops them in reverse.

Components started together (one :meth:`Supervisor.start_all`) depend on what came before, not on
each other, so they also stop together: a stack's stop costs one process shutdown per wave, not
one per component.

A component that fails to start stops the whole stack with a message naming it. One that dies
while the stack runs is restarted as its :class:`RestartPolicy` says (with backoff), and stops
the stack, named, when the policy gives up. SIGINT and SIGTERM stop everything that was started,
leaving no process.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from commands.stack.process import ComponentError, ComponentSpec, ManagedProcess
from commands.stack.restart import RestartPolicy, RestartRecord, write_restarts

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self, sink: TextIO | None = sys.stderr, policy: RestartPolicy | None = None) -> None:
        self._sink = sink
        self.policy = policy or RestartPolicy()
        self.components: list[ManagedProcess] = []
        # Components in the groups they were started in, to stop them group by group in reverse.
        self._waves: list[list[ManagedProcess]] = []
        self.restarts: dict[str, RestartRecord] = {}
        # Where restarts are recorded for `relayrl ctl status --all` (set by the stack).
        self.restarts_file: Path | None = None
        self._stopped = threading.Event()
        # Called once every component is stopped (the stack's fork server, which started them).
        self._after_stop: list[Callable[[], None]] = []

    def after_stop(self, callback: Callable[[], None]) -> None:
        """Runs ``callback`` once every component has stopped."""
        self._after_stop.append(callback)

    def start(self, spec: ComponentSpec) -> ManagedProcess:
        """Starts ``spec`` and blocks until it is ready."""
        component = self._add(spec)
        self._waves.append([component])
        component.start()
        component.wait_ready()
        log.info("%s is ready", spec.name)
        return component

    def start_all(self, specs: Sequence[ComponentSpec]) -> list[ManagedProcess]:
        """Starts every spec at once and waits for all (for components that need each other to be up)."""
        started: list[ManagedProcess] = []
        self._waves.append(started)
        for spec in specs:
            component = self._add(spec)
            component.start()
            started.append(component)
        for component in started:
            component.wait_ready()
            log.info("%s is ready", component.name)
        return started

    def _add(self, spec: ComponentSpec) -> ManagedProcess:
        component = ManagedProcess(spec, self._sink)
        self.components.append(component)
        self.restarts[spec.name] = RestartRecord()
        return component

    def get(self, name: str) -> ManagedProcess:
        return next(c for c in self.components if c.name == name)

    def check_alive(self, exited_ok: Sequence[str] = ()) -> None:
        """Restarts components that died, as the policy says, once their backoff has passed.

        Raises ComponentError for the first component the policy does not restart or has given
        up on. Components in ``exited_ok`` that exit 0 are done (the trainer at the end of its
        run), never restarted. Call it periodically: it never blocks on a restarting component.
        """
        for component in self.components:
            if component.running() or component.process is None:
                continue
            code = component.process.returncode
            if component.name in exited_ok and code == 0:
                continue
            if not self.policy.wants_restart(code):
                raise ComponentError(component.name, f"exited with code {code}", output=component.recent_output())
            self._tend(component, code)

    def _tend(self, component: ManagedProcess, code: int) -> None:
        record, now, p = self.restarts[component.name], time.monotonic(), self.policy
        if record.due_at is None:
            if record.in_window(p, now) >= p.limit:
                raise ComponentError(
                    component.name,
                    f"exited with code {code} after {p.limit} restarts within {p.window_s:.0f}s; giving up",
                    output=component.recent_output(),
                )
            delay = record.schedule(p, code, now)
            log.warning("%s exited with code %s; restarting in %.1fs", component.name, code, delay)
            self.record_restarts()
        elif now >= record.due_at:
            component.restart()
            record.restarted(now)
            log.warning("%s restarted (restart %d)", component.name, record.restarts)
            self.record_restarts()

    def record_restarts(self) -> None:
        if self.restarts_file is not None:
            running = {c.name: c.running() for c in self.components}
            write_restarts(self.restarts_file, self.restarts, running)

    def stop_all(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        for wave in reversed(self._waves):
            if len(wave) > 1:
                with ThreadPoolExecutor(len(wave), thread_name_prefix="stop") as pool:
                    list(pool.map(ManagedProcess.stop, wave))
            elif wave:
                wave[0].stop()
        for callback in self._after_stop:
            callback()


@contextmanager
def supervised(sink: TextIO | None = sys.stderr, policy: RestartPolicy | None = None) -> Iterator[Supervisor]:
    """A supervisor whose components are stopped on exit, on an error, and on SIGINT/SIGTERM."""
    supervisor = Supervisor(sink, policy)

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
