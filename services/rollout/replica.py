"""One rollout replica's main loop: lease prompts, generate n samples each, score, push, complete.

The loop only starts a prompt the engine's version may start (``min_start_version``), keeps
up to ``max_inflight_prompts`` prompts in flight, renews their leases while they run, and never
completes a lease whose group was not accepted by the queue. A prompt whose group is dropped
as stale or whose generation fails is given back to the queue at once (``abandon``), so it is
leased again now rather than after the queue's lease timeout; only when the queue cannot be
reached is it left to its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from relayrl.schema import Group, PromptSpec, Sample, validate_group
from relayrl.staleness import check_staleness
from relayrl.stalls import StallWatch
from services.rollout.config import RolloutSettings
from services.rollout.engine_client import (
    EngineClient,
    EngineError,
    EngineUnavailableError,
    PauseMode,
    SamplingParams,
)
from services.rollout.generation import GenerationError, SampleResult, generate_group, parse_version
from services.rollout.metrics import RolloutMetrics
from services.rollout.rewards import RewardRunner
from services.rollout.rewards.overlong import OverlongBuffer, apply_overlong

log = logging.getLogger(__name__)


class Lease(Protocol):
    lease_id: str
    prompt: PromptSpec
    expires_at: float


class PromptQueue(Protocol):
    """What the replica needs from the queue service (services.queue.client.QueueClient fits)."""

    async def lease(
        self, replica_id: str, max_prompts: int, held_version: int, block_timeout_s: float = 0.0
    ) -> Sequence[Lease]: ...

    async def complete(self, replica_id: str, lease_ids: list[str]) -> int: ...

    async def renew(self, replica_id: str, lease_ids: list[str]) -> tuple[list[str], float]: ...

    async def abandon(
        self, replica_id: str, lease_ids: list[str], reason: str, min_start_version: int = 0, all_held: bool = False
    ) -> tuple[list[str], list[str]]: ...

    async def push(self, groups: list[Group], timeout_s: float = 0.0) -> list[str]: ...


@dataclass(slots=True)
class HeldLease:
    task: asyncio.Task[None]
    expires_at: float
    # The lease's full length: it is renewed when half of it is left.
    span_s: float


# Bounds on the lease keeper's sleep between checks, seconds.
LEASE_CHECK_MIN_S = 0.05
LEASE_CHECK_MAX_S = 30.0
# How often a wait on another service checks whether it has stalled, seconds.
STALL_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class Status:
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


class Replica:
    def __init__(
        self, settings: RolloutSettings, engine: EngineClient, queue: PromptQueue, rewards: RewardRunner
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.queue = queue
        self.rewards = rewards
        self.metrics = RolloutMetrics()
        self.stalls = StallWatch(self.metrics.stalled, settings.stall_warn_s, log)
        self.held_version = 0
        # Newest version paramsync has announced; the staleness reference for outgoing groups.
        self.latest_version = 0
        self.engine_ready = False
        self.paused = False
        self.pause_mode = ""
        self.control_lock = asyncio.Lock()
        self._version_changed = asyncio.Event()
        # Set when the engine came back holding an older version than before (it restarted).
        self.engine_restarted = asyncio.Event()
        self._leasable = asyncio.Event()
        # lease id → the prompt in flight under it.
        self._held: dict[str, HeldLease] = {}
        self._lease_added = asyncio.Event()
        self._in_flight = 0
        self._busy_since = time.monotonic()
        self._generated = 0
        self._errors = 0

    # --- state shared with control and weight sync --------------------------------------

    def status(self) -> Status:
        return Status(
            replica_id=self.settings.replica_id,
            weight_version=self.held_version,
            paused=self.paused,
            pause_mode=self.pause_mode,
            in_flight=self._in_flight,
            leases_held=len(self._held),
            tokens_per_s=self.metrics.token_rate.rate(),
            samples_per_s=self.metrics.sample_rate.rate(),
            total_generated_samples=self._generated,
            generation_errors=self._errors,
            engine_ready=self.engine_ready,
            latest_version=self.latest_version,
        )

    def ready(self) -> bool:
        return self.engine_ready

    async def set_version(self, version: int, sync_s: float = 0.0) -> None:
        self.held_version = max(self.held_version, version)
        self.latest_version = max(self.latest_version, version)
        self.metrics.weight_version.set(self.held_version)
        if sync_s:
            self.metrics.weight_update_duration.observe(sync_s)
        self._version_changed.set()
        self._version_changed = asyncio.Event()

    def note_latest(self, version: int) -> None:
        self.latest_version = max(self.latest_version, version)

    async def pause(self, mode: PauseMode) -> Status:
        """Stops leasing and pauses the engine; leased prompts finish after resume."""
        async with self.control_lock:
            self.paused, self.pause_mode = True, mode
            self._update_leasable()
            await self.engine.pause_generation(mode)
        return self.status()

    async def resume(self) -> Status:
        async with self.control_lock:
            # Un-pause locally first: an engine that restarted meanwhile is not paused anyway.
            self.paused, self.pause_mode = False, ""
            self._update_leasable()
            await self.engine.continue_generation()
        return self.status()

    def _update_leasable(self) -> None:
        if self.engine_ready and not self.paused:
            self._leasable.set()
        else:
            self._leasable.clear()

    # --- loops ----------------------------------------------------------------------

    async def watch_engine(self) -> None:
        """Probes the engine; learns its weight version once it is up, and sees that it generates."""
        unpause = False
        while True:
            healthy = await self.engine.health()
            if healthy and not self.engine_ready:
                try:
                    await self._adopt_engine_version(await self.engine.weight_version())
                    unpause = True
                except EngineError as exc:
                    log.warning("engine answered /health but not /get_model_info: %r", exc)
                    healthy = False
            if healthy and unpause:
                unpause = not await self._unpause_engine()
            if healthy != self.engine_ready:
                log.log(logging.INFO if healthy else logging.WARNING, "engine %s", "ready" if healthy else "down")
            self.engine_ready = healthy
            self.metrics.engine_ready.set(int(healthy))
            self._update_leasable()
            await asyncio.sleep(self.settings.engine_check_interval_s)

    async def _unpause_engine(self) -> bool:
        """Tells an engine that was out of reach to continue, unless this replica is paused on
        purpose; True once that is settled. A weight switch whose ``continue_generation`` was lost
        with the link leaves the engine paused, and a paused engine answers probes but generates
        nothing, so every in-flight request would wait out its timeout."""
        if self.control_lock.locked():
            return False  # a switch or an operator call is under way and settles it; ask again next probe
        async with self.control_lock:
            if self.paused:
                return True
            try:
                await self.engine.continue_generation()
            except (EngineError, httpx.TransportError) as exc:
                log.warning("engine did not take continue_generation: %r", exc)
                return False
        return True

    async def _adopt_engine_version(self, reported: str) -> None:
        version = parse_version(reported, self.held_version)
        if version >= self.held_version:
            await self.set_version(version)
            return
        # The engine restarted from its initial weights: it really holds the older version now.
        log.warning("engine came back at version %d (held %d); re-syncing weights", version, self.held_version)
        self.held_version = version
        self.metrics.weight_version.set(version)
        self.engine_restarted.set()

    async def run(self) -> None:
        """Leases and starts prompts until cancelled, renewing the leases of prompts in flight."""
        await self._reclaim_predecessors_leases()
        keeper = asyncio.create_task(self._keep_leases(), name="lease-keeper")
        try:
            with self.stalls.waiting("prompts", "trainer") as prompts:
                while True:
                    await self._wait_leasable()
                    free = self.settings.max_inflight_prompts - len(self._held)
                    if free <= 0:
                        prompts.progress()  # busy, not waiting
                        await asyncio.wait([h.task for h in self._held.values()], return_when=asyncio.FIRST_COMPLETED)
                        continue
                    try:
                        leases = await self.queue.lease(
                            self.settings.replica_id, free, self.held_version, self.settings.lease_block_timeout_s
                        )
                    except Exception as exc:
                        log.warning("lease failed: %r", exc)
                        await asyncio.sleep(1.0)
                        continue
                    if leases or self._held:
                        prompts.progress()
                    else:
                        prompts.tick()
                    for lease in leases:
                        self._start(lease)
        finally:
            keeper.cancel()
            for held in list(self._held.values()):
                held.task.cancel()

    async def _reclaim_predecessors_leases(self) -> None:
        """Gives back what a killed replica of the same id still held, before leasing anything.

        Its prompts would otherwise wait out the queue's lease timeout (600 s by default).
        """
        with self.stalls.waiting("an answer", "queue") as wait:
            while True:
                try:
                    requeued, dropped = await self.queue.abandon(
                        self.settings.replica_id, [], "replica_restart", all_held=True
                    )
                    break
                except Exception as exc:  # the queue may still be starting
                    log.warning("could not reclaim this replica's earlier leases (%r); retrying", exc)
                    wait.tick()
                    await asyncio.sleep(1.0)
        if requeued or dropped:
            log.info("gave back %d leases held by this replica before it restarted", len(requeued) + len(dropped))

    async def _wait_leasable(self) -> None:
        """Waits for a ready engine and no pause; a pause is asked for, so only the engine can stall it."""
        if self._leasable.is_set():
            return
        with self.stalls.waiting("a ready engine", "engine") as wait:
            while not self._leasable.is_set():
                if self.paused:
                    wait.progress()
                else:
                    wait.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._leasable.wait(), STALL_CHECK_S)

    def _start(self, lease: Lease) -> None:
        task = asyncio.create_task(self.process(lease))
        self._held[lease.lease_id] = HeldLease(task, lease.expires_at, max(0.0, lease.expires_at - time.time()))
        task.add_done_callback(lambda _: self._held.pop(lease.lease_id, None))
        self._lease_added.set()

    async def _keep_leases(self) -> None:
        """Renews each lease in flight when half its time is left; drops prompts whose lease was lost.

        Without renewal a generation that outlasts the queue's lease timeout is re-issued to
        another replica and its group pushed twice. A lease the queue refuses to renew was
        re-issued already: its prompt is dropped here, since the other lease will deliver it.
        """
        while True:
            self._lease_added.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lease_added.wait(), self._until_next_renewal())
            now = time.time()
            due = [lease_id for lease_id, held in self._held.items() if held.expires_at - now <= held.span_s / 2]
            if not due:
                continue
            try:
                renewed, expires_at = await self.queue.renew(self.settings.replica_id, due)
            except Exception as exc:  # a queue outage: the leases run on, try again shortly
                log.warning("renewing %d leases failed: %r", len(due), exc)
                await asyncio.sleep(1.0)
                continue
            kept = set(renewed)
            for lease_id in due:
                held = self._held.get(lease_id)
                if held is None:  # finished meanwhile
                    continue
                if lease_id in kept:
                    held.expires_at, held.span_s = expires_at, max(0.0, expires_at - now)
                else:
                    log.warning("lease %s was re-issued to another replica; dropping its prompt", lease_id)
                    held.task.cancel()

    def _until_next_renewal(self) -> float:
        now = time.time()
        wait = min((held.expires_at - held.span_s / 2 - now for held in self._held.values()), default=LEASE_CHECK_MAX_S)
        return min(max(wait, LEASE_CHECK_MIN_S), LEASE_CHECK_MAX_S)

    async def process(self, lease: Lease) -> None:
        """Generates, scores and pushes one prompt group; completes the lease only once it is pushed."""
        prompt = lease.prompt
        try:
            await self._wait_for_version(prompt.min_start_version, lease.expires_at)
            results = await self._generate_all(prompt)
            group = await self._build_group(lease, results)
            if not self._fresh(group):
                # Started again only by a replica whose weights keep it within the bound.
                await self._give_back(lease, "stale", self.latest_version - self.settings.max_staleness)
                return
            problems = validate_group(group.to_proto())
            if problems:
                raise GenerationError("; ".join(problems))
            await self.queue.push([group], timeout_s=self.settings.push_timeout_s)
            await self.queue.complete(self.settings.replica_id, [lease.lease_id])
        except (EngineError, GenerationError, TimeoutError) as exc:
            self._count_error()
            log.warning("prompt %s failed (%s): %r", prompt.prompt_id, lease.lease_id, exc)
            if isinstance(exc, EngineUnavailableError):
                # Stop leasing until the engine answers /health again, or the prompts given back
                # now would come straight back to this replica and fail again.
                self._engine_down()
            await self._give_back(lease, "generation_error")
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a queue outage or a bug must not take the loop down
            self._count_error()
            log.exception("prompt %s failed: %r", prompt.prompt_id, exc)
            await self._give_back(lease, "generation_error")
            return
        self.metrics.pushed_groups.inc()
        self._generated += len(group.samples)
        self.metrics.total_generated_samples.inc(len(group.samples))
        self.metrics.sample_rate.add(len(group.samples))

    def _engine_down(self) -> None:
        if self.engine_ready:
            log.warning("engine down")
        self.engine_ready = False
        self.metrics.engine_ready.set(0)
        self._update_leasable()

    def _count_error(self) -> None:
        self._errors += 1
        self.metrics.generation_errors.inc()

    async def _give_back(self, lease: Lease, reason: str, min_start_version: int = 0) -> None:
        """Returns a lease whose group will not be pushed, so its prompt is leased again at once.

        While the queue cannot be reached the give-back is retried until the lease would have
        expired anyway (then the queue re-issues it by itself).
        """
        with self.stalls.waiting("an answer", "queue") as wait:
            while True:
                try:
                    _, dropped = await self.queue.abandon(
                        self.settings.replica_id, [lease.lease_id], reason, max(min_start_version, 0)
                    )
                    break
                except Exception as exc:
                    held = self._held.get(lease.lease_id)
                    if time.time() >= (held.expires_at if held else lease.expires_at):
                        log.warning(
                            "could not give back lease %s (%r); it expired and will be re-issued", lease.lease_id, exc
                        )
                        return
                    wait.tick()
                    await asyncio.sleep(1.0)
        self.metrics.abandoned_leases.labels(reason=reason).inc()
        if dropped:
            log.warning("prompt %s was given back too often and was dropped (%s)", lease.prompt.prompt_id, reason)

    async def _wait_for_version(self, min_start_version: int, expires_at: float) -> None:
        if self.held_version >= min_start_version:
            return
        with self.stalls.waiting("a newer weight version", "paramsync") as wait:
            while self.held_version < min_start_version:
                remaining = expires_at - time.time()
                if remaining <= 0:
                    raise TimeoutError(f"engine still at version {self.held_version} < {min_start_version}")
                wait.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._version_changed.wait(), min(remaining, STALL_CHECK_S))

    async def _generate_all(self, prompt: PromptSpec) -> list[tuple[SampleResult, float]]:
        """The n samples of one prompt, asked of the engine as one request with ``n``."""
        started = time.time()
        n = prompt.n_samples
        self._change_in_flight(n)
        try:
            results = await generate_group(
                self.engine,
                prompt.prompt_token_ids,
                self._sampling(prompt),
                n,
                self.settings.partial_rollout_mode,
                self.held_version,
                rid=f"{self.settings.replica_id}-{prompt.prompt_id}-{uuid.uuid4().hex[:8]}",
            )
        finally:
            self._change_in_flight(-n)
        for result in results:
            self.metrics.engine_latency.observe(result.engine_s)
            self.metrics.generated_tokens.inc(len(result.output_ids))
            self.metrics.token_rate.add(len(result.output_ids))
            self.metrics.response_length.observe(len(result.output_ids))
        self.metrics.tokens_per_s.set(self.metrics.token_rate.rate())
        return [(result, started) for result in results]

    def _change_in_flight(self, delta: int) -> None:
        """Tracks requests in flight and the time the engine had work (for the rollout idle ratio)."""
        now = time.monotonic()
        if self._in_flight > 0:
            self.metrics.busy_seconds.inc(now - self._busy_since)
        self._busy_since = now
        self._in_flight += delta
        self.metrics.in_flight.set(self._in_flight)

    def _sampling(self, prompt: PromptSpec) -> SamplingParams:
        s = self.settings
        return SamplingParams(
            max_new_tokens=prompt.max_new_tokens or s.max_new_tokens,
            temperature=s.temperature if prompt.temperature is None else prompt.temperature,
            top_p=prompt.top_p or s.top_p,
            top_k=s.top_k if prompt.top_k is None else prompt.top_k,
        )

    async def _build_group(self, lease: Lease, results: list[tuple[SampleResult, float]]) -> Group:
        prompt = lease.prompt
        samples = []
        for result, started in results:
            reward_started = time.perf_counter()
            outcome = await self.rewards.score(prompt.data_source, result.text, prompt.ground_truth, prompt.extra_info)
            if self.settings.overlong_buffer_enable:
                budget = prompt.max_new_tokens or self.settings.max_new_tokens
                buffer = OverlongBuffer(self.settings.overlong_buffer_len, self.settings.overlong_buffer_penalty_factor)
                outcome = apply_overlong(outcome, len(result.output_ids), budget, buffer)
            if outcome.error:
                self.metrics.reward_errors.inc()
            self.metrics.reward.observe(outcome.reward)
            samples.append(
                Sample(
                    prompt_token_ids=list(prompt.prompt_token_ids),
                    response_token_ids=result.output_ids,
                    behavior_logprobs=result.logprobs,
                    policy_versions=result.versions,
                    reward=outcome.reward,
                    finish_reason=result.finish_reason,
                    replica_id=self.settings.replica_id,
                    response_text=result.text,
                    reward_extra=outcome.extra,
                    reward_error=bool(outcome.error),
                    started_at_unix_s=started,
                    finished_at_unix_s=time.time(),
                    generation_s=result.engine_s,
                    reward_s=time.perf_counter() - reward_started,
                )
            )
        self.metrics.reward_mean.set(sum(s.reward for s in samples) / max(len(samples), 1))
        return Group(
            group_id=uuid.uuid4().hex,
            prompt_id=prompt.prompt_id,
            samples=samples,
            data_source=prompt.data_source,
            ground_truth=prompt.ground_truth,
            extra_info=prompt.extra_info,
            lease_id=lease.lease_id,
            created_at_unix_s=time.time(),
            is_eval=prompt.is_eval,
        )

    def _fresh(self, group: Group) -> bool:
        """False (and counted) when the group already breaks the bound against the newest version."""
        if not any(s.policy_versions for s in group.samples):
            return True
        verdict = check_staleness(group.min_policy_version, self.latest_version, self.settings.max_staleness)
        if verdict.ok:
            return True
        self.metrics.dropped_stale_samples.inc(len(group.samples))
        log.info(
            "dropped stale group of %s (oldest version %d, newest %d, η=%d); its prompt goes back to the queue",
            group.prompt_id,
            group.min_policy_version,
            self.latest_version,
            self.settings.max_staleness,
        )
        return False
