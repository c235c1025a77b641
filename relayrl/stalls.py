"""Waits that make no progress, named: what a component waits for and on whom.

A component wraps each wait on another component in :meth:`StallWatch.waiting` and calls
:meth:`Wait.progress` whenever the awaited thing moves. Once a wait has gone ``warn_after_s``
without progress, :meth:`Wait.tick` logs one line naming both, and the service's gauge
``relayrl_<service>_stalled_seconds{waiting_for, peer}`` reads the seconds since progress (0
when nothing waits), which the ``RelayRLStalled`` alert and the chaos run watch. Waiting is
normal; only a wait that stops moving for longer than a step should take is a stall.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from prometheus_client import Gauge


class Wait:
    """One wait in progress; ``progress`` resets its clock, ``tick`` warns once per stall."""

    def __init__(self, what: str, peer: str, warn_after_s: float, log: logging.Logger) -> None:
        self.what, self.peer = what, peer
        self._warn_after_s = warn_after_s
        self._log = log
        self._since = time.monotonic()
        self._warned = False

    def stalled_s(self) -> float:
        return time.monotonic() - self._since

    def progress(self) -> None:
        if self._warned:
            self._log.info("%s from %s moved again after %.0fs", self.what, self.peer, self.stalled_s())
        self._since = time.monotonic()
        self._warned = False

    def tick(self) -> None:
        if not self._warned and self.stalled_s() >= self._warn_after_s:
            self._warned = True
            self._log.warning("stalled: waiting %.0fs for %s from %s", self.stalled_s(), self.what, self.peer)


class StallWatch:
    """Every wait of one service, exported through ``gauge`` (labels ``waiting_for``, ``peer``).

    Several waits may share labels (prompts waiting for the same version); the gauge shows the
    longest of them. Waits run on the event loop or a worker thread, the gauge is read by the
    HTTP thread, hence the lock.
    """

    def __init__(self, gauge: Gauge, warn_after_s: float, log: logging.Logger) -> None:
        self._gauge = gauge
        self._warn_after_s = warn_after_s
        self._log = log
        self._lock = threading.Lock()
        self._active: dict[tuple[str, str], list[Wait]] = {}

    def _longest(self, key: tuple[str, str]) -> float:
        with self._lock:
            return max((w.stalled_s() for w in self._active[key]), default=0.0)

    @contextlib.contextmanager
    def waiting(self, what: str, peer: str) -> Iterator[Wait]:
        key = (what, peer)
        wait = Wait(what, peer, self._warn_after_s, self._log)
        with self._lock:
            if key not in self._active:
                self._active[key] = []
                self._gauge.labels(waiting_for=what, peer=peer).set_function(lambda: self._longest(key))
            self._active[key].append(wait)
        try:
            yield wait
        finally:
            with self._lock:
                self._active[key].remove(wait)
