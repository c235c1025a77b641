"""The reward model as a reward source: one ``/score`` call per group, and never a silent 0.

A group's samples are sent together (prompt + response token ids, ``response_start`` marking
the response), so the service batches them with other replicas' groups. A call that fails on
the link (refused, dropped, timed out, 502/503/504) is retried with backoff for up to
``reward_model_deadline_s``; then :class:`RewardServiceError` tells the loop to give the prompt
back to the queue, and :meth:`ModelReward.wait_ready` keeps the replica from leasing more until
the service answers ``/readyz`` again. A refusal (4xx) is not retried: it gives the prompt back
at once, with its own reason, so the queue's abandon limit ends a prompt that can never be
scored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx

from relayrl.retry import RetryPolicy, http_transient, retrying
from relayrl.stalls import StallWatch
from services.reward.client import RewardClient
from services.rollout.config import RolloutSettings
from services.rollout.metrics import RolloutMetrics
from services.rollout.rewards.runner import RewardOutcome

log = logging.getLogger(__name__)

# Longest wait between retries of /score, and between /readyz probes of a service that is down.
MAX_RETRY_WAIT_S = 5.0
READY_PROBE_S = 1.0


class RewardServiceError(RuntimeError):
    """The group could not be scored; ``reason`` is the abandon reason its prompt is given back with."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def combine(rule: RewardOutcome | None, model_score: float, rule_weight: float, model_weight: float) -> RewardOutcome:
    """``rule_weight × rule + model_weight × model`` (the model term alone without a rule outcome);
    both parts are kept in the extras."""
    extra = {"model_score": model_score}
    if rule is None:
        return RewardOutcome(model_weight * model_score, extra)
    extra |= rule.extra | {"rule_score": rule.reward}
    return replace(rule, reward=rule_weight * rule.reward + model_weight * model_score, extra=extra)


def _kind(exc: BaseException) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.HTTPStatusError):
        return "unavailable" if http_transient(exc) else "rejected"
    return "unavailable"


@dataclass
class ModelReward:
    client: RewardClient
    metrics: RolloutMetrics
    deadline_s: float
    first_wait_s: float
    # False from a group that gave up on the service until the service is ready again.
    up: bool = True

    def __post_init__(self) -> None:
        self.metrics.reward_service_up.set(1)

    @classmethod
    def from_settings(cls, settings: RolloutSettings, metrics: RolloutMetrics) -> ModelReward | None:
        """The model reward the settings ask for; None with ``reward_kind = rule``."""
        if settings.reward_kind == "rule":
            return None
        client = RewardClient(settings.reward_model_url, settings.reward_model_timeout_s)
        return cls(client, metrics, settings.reward_model_deadline_s, settings.reward_model_retry_wait_s)

    async def score_group(self, prompt_ids: Sequence[int], responses: Sequence[Sequence[int]]) -> list[float]:
        """One score per response; raises :class:`RewardServiceError` rather than return a guess."""
        items = [{"input_ids": [*prompt_ids, *r], "response_start": len(prompt_ids)} for r in responses]
        policy = RetryPolicy(
            attempts=None, deadline_s=self.deadline_s, first_wait_s=self.first_wait_s, max_wait_s=MAX_RETRY_WAIT_S
        )
        try:
            async for attempt in retrying("score a group with the reward service", http_transient, policy, log):
                with attempt:
                    return await self._call(items)
        except httpx.HTTPError as exc:
            if _kind(exc) == "rejected":
                raise RewardServiceError(str(exc), "reward_rejected") from exc
            self._mark(up=False)
            raise RewardServiceError(
                f"reward service failed for {self.deadline_s:.0f}s: {exc!r}", "reward_unavailable"
            ) from exc
        raise AssertionError("unreachable: tenacity returns or re-raises")

    async def _call(self, items: list[dict[str, object]]) -> list[float]:
        started = time.perf_counter()
        try:
            scores = await self.client.score(items)
        except httpx.HTTPError as exc:
            self.metrics.reward_service_errors.labels(kind=_kind(exc)).inc()
            raise
        self.metrics.reward_service_latency.observe(time.perf_counter() - started)
        self._mark(up=True)
        return scores

    def _mark(self, up: bool) -> None:
        self.up = up
        self.metrics.reward_service_up.set(int(up))

    async def wait_ready(self, stalls: StallWatch) -> None:
        """Returns at once while the service works; after it failed, once it answers /readyz again."""
        if self.up:
            return
        with stalls.waiting("a ready reward service", "reward") as wait:
            while not await self.client.ready():
                wait.tick()
                await asyncio.sleep(READY_PROBE_S)
        self._mark(up=True)
        log.info("reward service %s is ready again; leasing prompts", self.client.base_url)

    async def aclose(self) -> None:
        await self.client.aclose()
