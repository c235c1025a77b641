"""One rollout replica's main loop: lease prompts, generate n samples each, score, push (which completes the lease).

The loop only starts a prompt the engine's version may start (``min_start_version``), keeps
up to ``max_inflight_prompts`` prompts in flight while :class:`~services.rollout.leases.LeaseKeeper`
renews their leases, and gives a prompt back at once when its group is stale, its generation
fails or the reward service cannot score it (then leasing waits for the service too).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from relayrl.schema import PromptSpec, validate_group
from relayrl.stalls import StallWatch
from services.engine.client import EngineClient, EngineError, EngineUnavailableError, SamplingParams
from services.rollout.agent.episode import Episode
from services.rollout.agent.runtime import AgentRuntime
from services.rollout.config import RolloutSettings
from services.rollout.generation import GenerationError, SampleResult, generate_group
from services.rollout.groups import GroupBuilder
from services.rollout.leases import Lease, LeaseKeeper
from services.rollout.metrics import RolloutMetrics
from services.rollout.pause_bound import PauseBound, ReplicaPaused
from services.rollout.rewards.model import RewardServiceError
from services.rollout.state import ReplicaState

log = logging.getLogger(__name__)

# How often a wait on another service checks whether it has stalled, seconds.
STALL_CHECK_S = 1.0


@dataclass
class RolloutLoop:
    settings: RolloutSettings
    state: ReplicaState
    engine: EngineClient
    leases: LeaseKeeper
    groups: GroupBuilder
    metrics: RolloutMetrics
    stalls: StallWatch
    # Set when multi_turn_enable: each sample is an episode instead of one generation.
    agent: AgentRuntime | None = None

    def __post_init__(self) -> None:
        self.pause = PauseBound(self.state, self.settings.pause_wait_s, self.settings.retry_after_s)

    async def run(self) -> None:
        """Leases and starts prompts until cancelled, renewing the leases of prompts in flight."""
        await self.leases.reclaim_predecessors_leases()
        keeper = asyncio.create_task(self.leases.keep(), name="lease-keeper")
        try:
            with self.stalls.waiting("prompts", "trainer") as prompts:
                while True:
                    await self._wait_leasable()
                    if self.groups.model_reward is not None:
                        await self.groups.model_reward.wait_ready(self.stalls)
                    free = self.settings.max_inflight_prompts - self.state.leases_held
                    if free <= 0:
                        prompts.progress()  # busy, not waiting
                        await asyncio.wait(self.state.lease_tasks(), return_when=asyncio.FIRST_COMPLETED)
                        continue
                    leases = await self.leases.lease(free)
                    if leases or self.state.leases_held:
                        prompts.progress()
                    else:
                        prompts.tick()
                    for lease in leases:
                        self.state.add_lease(lease.lease_id, asyncio.create_task(self.process(lease)), lease.expires_at)
        finally:
            keeper.cancel()
            for task in self.state.lease_tasks():
                task.cancel()

    async def _wait_leasable(self) -> None:
        """Waits for a ready engine and no pause; a pause is asked for, so only the engine can stall it."""
        if self.state.leasable():
            return
        with self.stalls.waiting("a ready engine", "engine") as wait:
            while not self.state.leasable():
                if self.state.paused:
                    wait.progress()
                else:
                    wait.tick()
                await self.state.became_leasable(STALL_CHECK_S)

    async def process(self, lease: Lease) -> None:
        """Generates, scores and pushes one prompt group; completes the lease only once it is pushed."""
        prompt = lease.prompt
        try:
            await self._wait_for_version(prompt.min_start_version, lease.expires_at)
            results = await self.pause.run(self._generate(prompt))
            group = await self.groups.build(lease.lease_id, prompt, results)
            if not self.groups.fresh(group, self.state.latest_version):
                # Started again only by a replica whose weights keep it within the bound.
                await self.leases.give_back(lease, "stale", self.state.latest_version - self.settings.max_staleness)
                return
            problems = validate_group(group.to_proto())
            if problems:
                raise GenerationError("; ".join(problems))
            await self.leases.deliver(lease, group)
        except ReplicaPaused as exc:
            log.info("prompt %s given back (%s): %s", prompt.prompt_id, lease.lease_id, exc)
            await self.leases.give_back(lease, "paused")
            return
        except (EngineError, GenerationError, TimeoutError) as exc:
            self.state.count_error()
            log.warning("prompt %s failed (%s): %r", prompt.prompt_id, lease.lease_id, exc)
            if isinstance(exc, EngineUnavailableError):
                # Stop leasing until the engine answers /health again, or the prompts given back
                # now would come straight back to this replica and fail again.
                self.state.set_engine_ready(False)
            await self.leases.give_back(lease, "generation_error")
            return
        except RewardServiceError as exc:
            # Never pushed with a made-up reward: the prompt goes back to be generated and scored again.
            log.warning("prompt %s not scored (%s): %s", prompt.prompt_id, lease.lease_id, exc)
            await self.leases.give_back(lease, exc.reason)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a queue outage or a bug must not take the loop down
            self.state.count_error()
            log.exception("prompt %s failed: %r", prompt.prompt_id, exc)
            await self.leases.give_back(lease, "generation_error")
            return
        self.state.count_pushed(len(group.samples))

    async def _wait_for_version(self, min_start_version: int, expires_at: float) -> None:
        if self.state.held_version >= min_start_version:
            return
        with self.stalls.waiting("a newer weight version", "paramsync") as wait:
            while self.state.held_version < min_start_version:
                remaining = expires_at - time.time()
                if remaining <= 0:
                    raise TimeoutError(f"engine still at version {self.state.held_version} < {min_start_version}")
                wait.tick()
                await self.state.version_changed(min(remaining, STALL_CHECK_S))

    async def _generate(self, prompt: PromptSpec) -> list[tuple[SampleResult, float]]:
        """Validation prompts first: a training prompt waits while any validation prompt is generating."""
        if prompt.is_eval:
            with self.state.validating():
                return await self._generate_all(prompt)
        await self.state.training_may_start()
        return await self._generate_all(prompt)

    async def _generate_all(self, prompt: PromptSpec) -> list[tuple[SampleResult, float]]:
        """The n samples of one prompt: n episodes, or one request with ``n`` to the engine."""
        started = time.time()
        rid = f"{self.settings.replica_id}-{prompt.prompt_id}-{uuid.uuid4().hex[:8]}"
        if self.agent is not None:
            results = await self._episodes(prompt, self.agent, rid)
        else:
            results = await self._single_turn(prompt, rid)
        for result in results:
            self.metrics.engine_latency.observe(result.engine_s)
            self.metrics.generated_tokens.inc(len(result.output_ids))
            self.metrics.token_rate.add(len(result.output_ids))
            self.metrics.response_length.observe(len(result.output_ids))
        self.metrics.tokens_per_s.set(self.metrics.token_rate.rate())
        return [(result, started) for result in results]

    async def _single_turn(self, prompt: PromptSpec, rid: str) -> list[SampleResult]:
        n = prompt.n_samples
        self.state.change_in_flight(n)
        try:
            return await generate_group(
                self.engine,
                prompt.prompt_token_ids,
                self._sampling(prompt),
                n,
                self.settings.partial_rollout_mode,
                self.state.held_version,
                rid=rid,
                gate=self.pause.gate,
            )
        finally:
            self.state.change_in_flight(-n)

    async def _episodes(self, prompt: PromptSpec, agent: AgentRuntime, rid: str) -> list[SampleResult]:
        """The n episodes of one prompt, side by side; each holds an engine request only while it generates."""
        env = await agent.env(self.engine)
        episodes = [
            Episode(
                env,
                self.engine,
                list(prompt.prompt_token_ids),
                self._sampling(prompt),
                self.settings.partial_rollout_mode,
                lambda: self.state.held_version,
                f"{rid}-{i}",
                prompt.extra_info,
                self.state.change_in_flight,
                gate=self.pause.gate,
            )
            for i in range(prompt.n_samples)
        ]
        return list(await asyncio.gather(*(episode.run() for episode in episodes)))

    def _sampling(self, prompt: PromptSpec) -> SamplingParams:
        s = self.settings
        return SamplingParams(
            max_new_tokens=prompt.max_new_tokens or s.max_new_tokens,
            temperature=s.temperature if prompt.temperature is None else prompt.temperature,
            top_p=prompt.top_p or s.top_p,
            top_k=s.top_k if prompt.top_k is None else prompt.top_k,
        )
