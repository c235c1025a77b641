"""Faults injected into a running local stack, and when each one counts as recovered.

A fault is recovered once its component runs and passes its ready check again and the trainer
has written a training step since (training advances again). Recovery time counts from the
injection, so a hang's, a partition's or a latency spell's own duration is part of it. Process faults act on the whole
process group (torchrun and its workers, a service and its helpers).
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass

from commands.stack.launch import LocalStack
from commands.stack.process import ManagedProcess
from commands.stack.progress import MetricsTail

PROCESS_FAULTS = ("sigkill", "sigstop")


@dataclass
class Fault:
    kind: str  # sigkill, sigstop, or a network fault (latency, reset, partition)
    component: str
    at: float  # wall-clock time it was injected
    duration_s: float = 0.0  # how long it lasts (a hang or a partition); 0 for a kill
    ready_at: float | None = None
    recovered_at: float | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at


class FaultTracker:
    """Injects process faults into ``stack`` and follows every fault until it has recovered."""

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.faults: list[Fault] = []
        self.metrics = MetricsTail(stack.run_dir / "metrics.jsonl")
        self._step_times: list[float] = []
        self.step = 0  # the latest training step written

    def component(self, name: str) -> ManagedProcess:
        return self.stack.supervisor.get(name)

    def sigkill(self, name: str) -> Fault:
        """Crashes ``name`` (its whole process group); the supervisor's restart policy brings it back."""
        component = self.component(name)
        assert component.process is not None
        fault = self._record("sigkill", name)
        component.signal_all(signal.SIGKILL)
        return fault

    def sigstop(self, name: str, seconds: float) -> Fault:
        """Freezes ``name`` for ``seconds`` (a hang: its sockets stay open, nothing answers)."""
        component = self.component(name)
        assert component.process is not None
        fault = self._record("sigstop", name, seconds)
        component.signal_all(signal.SIGSTOP)
        timer = threading.Timer(seconds, component.signal_all, [signal.SIGCONT])
        timer.daemon = True
        timer.start()
        return fault

    def _record(self, kind: str, name: str, duration_s: float = 0.0) -> Fault:
        fault = Fault(kind, name, time.time(), duration_s)
        self.faults.append(fault)
        return fault

    def tick(self) -> list[Fault]:
        """Restarts what died (as the policy says), then marks faults recovered; returns the newly recovered."""
        self.stack.supervisor.check_alive(exited_ok=["trainer"])
        for row in self.metrics.poll():
            if "trainer/global_steps" in row:
                self._step_times.append(float(row["time"]))
                self.step = int(row["trainer/global_steps"])
        now, done = time.time(), []
        for fault in self.open_faults():
            if fault.ready_at is None:
                if now < fault.at + fault.duration_s or not self._ready(fault.component):
                    continue
                fault.ready_at = now
            stepped = [t for t in self._step_times if t >= fault.ready_at]
            if stepped or self._trainer_done():
                fault.recovered_at = max(min(stepped, default=now), fault.ready_at)
                done.append(fault)
        return done

    def open_faults(self) -> list[Fault]:
        return [f for f in self.faults if f.recovered_at is None]

    def _ready(self, name: str) -> bool:
        component = self.component(name)
        if not component.running():
            return False
        check = component.spec.ready
        return True if check is None else bool(check())

    def _trainer_done(self) -> bool:
        return self.stack.trainer_exit_code() == 0
