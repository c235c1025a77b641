"""What one replica holds and does, in one object: the weight versions, the engine's readiness,
the operator's pause, the leases in flight and the lock under which the engine is paused.

The generation loop, the engine watch, the weight sync and the control API share this object
and change it only through its methods, which keep its rules:

- the held version only moves forward, except when the engine comes back from a restart
  holding an older one (then the weight sync is told to re-subscribe);
- the latest version seen never moves back, and is never below the held one;
- prompts are leased only while the engine is ready and no operator pause is in force;
- no training prompt starts generating while a validation prompt is in flight (ROLL's pause of
  sampling for validation: the held-out score is taken on an engine not shared with training
  samples, and training resumes as soon as the last validation prompt is done).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from services.rollout.metrics import RolloutMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Status:
    """The replica as ``GET /control/status`` and the RolloutControl ``Status`` call report it."""

    replica_id: str
    weight_version: int
    paused: bool
    pause_mode: str
    in_flight: int
    leases_held: int
    tokens_per_s: float
    samples_per_s: float
    total_generated_samples: int
    generation_errors: int
    engine_ready: bool
    latest_version: int


@dataclass(slots=True)
class HeldLease:
    """A prompt in flight under one lease."""

    task: asyncio.Task[None]
    expires_at: float
    # The lease's full length: it is renewed when half of it is left.
    span_s: float

    def due(self, now: float) -> bool:
        return self.expires_at - now <= self.span_s / 2


class ReplicaState:
    def __init__(self, replica_id: str, metrics: RolloutMetrics) -> None:
        self.replica_id = replica_id
        self._metrics = metrics
        self._held_version = 0
        # Newest version paramsync has announced; the staleness reference for outgoing groups.
        self._latest_version = 0
        self._engine_ready = False
        self._paused = False
        self._pause_mode = ""
        self._paused_at = 0.0
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        # Set once the replica is stopping: it takes no new work.
        self._draining = False
        # Held by whoever pauses or continues the engine: the operator, a weight switch, the engine watch.
        self._control = asyncio.Lock()
        self._version_changed = asyncio.Event()
        # Set when the engine came back holding an older version than before (it restarted).
        self._engine_restarted = asyncio.Event()
        self._leasable = asyncio.Event()
        # lease id → the prompt in flight under it.
        self._leases: dict[str, HeldLease] = {}
        self._lease_added = asyncio.Event()
        self._in_flight = 0
        self._busy_since = time.monotonic()
        self._validating = 0
        self._training_open = asyncio.Event()
        self._training_open.set()
        self._generated = 0
        self._errors = 0

    def status(self) -> Status:
        return Status(
            replica_id=self.replica_id,
            weight_version=self._held_version,
            paused=self._paused,
            pause_mode=self._pause_mode,
            in_flight=self._in_flight,
            leases_held=len(self._leases),
            tokens_per_s=self._metrics.token_rate.rate(),
            samples_per_s=self._metrics.sample_rate.rate(),
            total_generated_samples=self._generated,
            generation_errors=self._errors,
            engine_ready=self._engine_ready,
            latest_version=self._latest_version,
        )

    # --- weight versions ---------------------------------------------------------------

    @property
    def held_version(self) -> int:
        """The version the engine serves."""
        return self._held_version

    @property
    def latest_version(self) -> int:
        return self._latest_version

    def hold(self, version: int, sync_s: float = 0.0) -> None:
        """The engine now serves ``version`` (a version at or below the held one changes nothing);
        ``sync_s`` is how long loading it took, when it was loaded by this replica."""
        self._held_version = max(self._held_version, version)
        self.note_latest(version)
        self._metrics.weight_version.set(self._held_version)
        if sync_s:
            self._metrics.weight_update_duration.observe(sync_s)
        self._version_changed.set()
        self._version_changed = asyncio.Event()

    def note_latest(self, version: int) -> None:
        """Paramsync announced ``version`` (or reported it as its newest)."""
        self._latest_version = max(self._latest_version, version)

    def engine_reports(self, version: int) -> None:
        """The version an engine that just became reachable serves. Below the held one, the
        engine restarted from its initial weights and really holds the older version now."""
        if version >= self._held_version:
            self.hold(version)
            return
        log.warning("engine came back at version %d (held %d); re-syncing weights", version, self._held_version)
        self._held_version = version
        self._metrics.weight_version.set(version)
        self._engine_restarted.set()

    async def version_changed(self, timeout_s: float) -> None:
        """Returns when the held version changes, or after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._version_changed.wait(), timeout_s)

    async def engine_restarted(self) -> None:
        """Returns once the engine has come back at an older version (see :meth:`engine_reports`)."""
        await self._engine_restarted.wait()

    def take_engine_restart(self) -> bool:
        """True once for each restart of the engine reported since the last call."""
        restarted = self._engine_restarted.is_set()
        self._engine_restarted.clear()
        return restarted

    # --- engine and pause --------------------------------------------------------------

    def ready(self) -> bool:
        return self._engine_ready

    def set_engine_ready(self, ready: bool) -> None:
        if ready != self._engine_ready:
            log.log(logging.INFO if ready else logging.WARNING, "engine %s", "ready" if ready else "down")
        self._engine_ready = ready
        self._metrics.engine_ready.set(int(ready))
        self._update_leasable()

    @property
    def paused(self) -> bool:
        """Paused by the operator (a weight switch's own pause does not count)."""
        return self._paused

    def set_paused(self, mode: str) -> None:
        if not self._paused:
            self._paused_at = time.monotonic()
        self._paused, self._pause_mode = True, mode
        self._unpaused.clear()
        self._update_leasable()

    def set_resumed(self) -> None:
        self._paused, self._pause_mode = False, ""
        self._unpaused.set()
        self._update_leasable()

    def paused_for(self) -> float:
        """Seconds the operator's pause has lasted (0 when not paused)."""
        return time.monotonic() - self._paused_at if self._paused else 0.0

    async def wait_unpaused(self) -> None:
        """Returns once no operator pause is in force."""
        await self._unpaused.wait()

    @property
    def draining(self) -> bool:
        """The replica is stopping: it leases nothing and its endpoint takes no new request."""
        return self._draining

    def set_draining(self) -> None:
        self._draining = True
        self._update_leasable()

    def controlling(self) -> asyncio.Lock:
        """The lock to hold while pausing or continuing the engine: ``async with state.controlling():``."""
        return self._control

    def control_busy(self) -> bool:
        return self._control.locked()

    def leasable(self) -> bool:
        return self._leasable.is_set()

    async def became_leasable(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the replica to become leasable; True when it is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._leasable.wait(), timeout_s)
        return self.leasable()

    def _update_leasable(self) -> None:
        if self._engine_ready and not self._paused and not self._draining:
            self._leasable.set()
        else:
            self._leasable.clear()

    # --- leases and work in flight -------------------------------------------------------

    def add_lease(self, lease_id: str, task: asyncio.Task[None], expires_at: float) -> None:
        """Holds ``lease_id`` until ``task`` (its prompt's work) is done."""
        self._leases[lease_id] = HeldLease(task, expires_at, max(0.0, expires_at - time.time()))
        task.add_done_callback(lambda _: self._leases.pop(lease_id, None))
        self._lease_added.set()

    def held_lease(self, lease_id: str) -> HeldLease | None:
        return self._leases.get(lease_id)

    @property
    def leases_held(self) -> int:
        return len(self._leases)

    def lease_ids(self) -> list[str]:
        return list(self._leases)

    def lease_tasks(self) -> list[asyncio.Task[None]]:
        return [held.task for held in self._leases.values()]

    def leases_due(self, now: float) -> list[str]:
        """Leases with half their time or less left."""
        return [lease_id for lease_id, held in self._leases.items() if held.due(now)]

    def renewed(self, lease_id: str, expires_at: float, now: float) -> None:
        held = self._leases.get(lease_id)
        if held is not None:
            held.expires_at, held.span_s = expires_at, max(0.0, expires_at - now)

    def until_next_renewal(self, now: float, default_s: float) -> float:
        """Seconds until the first lease is due (may be negative); ``default_s`` when none is held."""
        return min((held.expires_at - held.span_s / 2 - now for held in self._leases.values()), default=default_s)

    async def lease_added(self, timeout_s: float) -> None:
        """Returns when a lease is added after this call began, or after ``timeout_s``."""
        self._lease_added.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._lease_added.wait(), timeout_s)

    @contextlib.contextmanager
    def validating(self) -> Iterator[None]:
        """Around one validation prompt's generation: training generation is held until the last ends."""
        self._validating += 1
        self._training_open.clear()
        self._metrics.validation_prompts.set(self._validating)
        try:
            yield
        finally:
            self._validating -= 1
            self._metrics.validation_prompts.set(self._validating)
            if self._validating == 0:
                self._training_open.set()

    async def training_may_start(self) -> None:
        """Returns once no validation prompt is in flight; the time waited is counted."""
        if self._training_open.is_set():
            return
        started = time.monotonic()
        await self._training_open.wait()
        self._metrics.held_for_validation.inc(time.monotonic() - started)

    def change_in_flight(self, delta: int) -> None:
        """Tracks requests in flight and the time the engine had work (for the rollout idle ratio)."""
        now = time.monotonic()
        if self._in_flight > 0:
            self._metrics.busy_seconds.inc(now - self._busy_since)
        self._busy_since = now
        self._in_flight += delta
        self._metrics.in_flight.set(self._in_flight)

    def count_pushed(self, samples: int) -> None:
        self._metrics.pushed_groups.inc()
        self._generated += samples
        self._metrics.total_generated_samples.inc(samples)
        self._metrics.sample_rate.add(samples)

    def count_error(self) -> None:
        self._errors += 1
        self._metrics.generation_errors.inc()
