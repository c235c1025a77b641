"""Turning one prompt's generated samples into a scored trajectory group, and the staleness check
a group passes before it is pushed."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from relayrl.schema import Group, PromptSpec, Sample
from relayrl.staleness import check_staleness
from services.rollout.config import RolloutSettings
from services.rollout.generation import SampleResult
from services.rollout.metrics import RolloutMetrics
from services.rollout.rewards import RewardOutcome, RewardRunner
from services.rollout.rewards.model import ModelReward, combine
from services.rollout.rewards.overlong import OverlongBuffer, apply_overlong

log = logging.getLogger(__name__)


@dataclass
class GroupBuilder:
    settings: RolloutSettings
    rewards: RewardRunner
    metrics: RolloutMetrics
    model_reward: ModelReward | None = None

    async def build(self, lease_id: str, prompt: PromptSpec, results: list[tuple[SampleResult, float]]) -> Group:
        """Scores each ``(result, started_at_unix_s)`` and wraps them in the group of ``lease_id``.

        With a reward model the group is scored by it first, all samples in one call; a
        :class:`~services.rollout.rewards.model.RewardServiceError` leaves the group unbuilt.
        """
        model_started = time.perf_counter()
        model_scores: list[Any] = [None] * len(results)
        if self.model_reward is not None:
            responses = [result.output_ids for result, _ in results]
            model_scores = await self.model_reward.score_group(prompt.prompt_token_ids, responses)
        model_s = time.perf_counter() - model_started
        samples = [
            await self._sample(prompt, result, started, score, model_s)
            for (result, started), score in zip(results, model_scores, strict=True)
        ]
        self.metrics.reward_mean.set(sum(s.reward for s in samples) / max(len(samples), 1))
        return Group.answering(prompt, samples, lease_id)

    async def _outcome(self, prompt: PromptSpec, result: SampleResult, model_score: float | None) -> RewardOutcome:
        s = self.settings
        rule = None
        if s.reward_kind != "model":
            # A multi-turn episode is scored on its last model turn; a single-turn sample on its text.
            solution = result.text if result.solution_text is None else result.solution_text
            rule = await self.rewards.score(prompt.data_source, solution, prompt.ground_truth, prompt.extra_info)
        if model_score is None:
            assert rule is not None, "reward_kind 'model' always has a model score"
            return rule
        return combine(rule, model_score, s.reward_rule_weight, s.reward_model_weight)

    async def _sample(
        self, prompt: PromptSpec, result: SampleResult, started: float, model_score: float | None, model_s: float
    ) -> Sample:
        reward_started = time.perf_counter()
        outcome = await self._outcome(prompt, result, model_score)
        if self.settings.overlong_buffer_enable:
            budget = prompt.max_new_tokens or self.settings.max_new_tokens
            buffer = OverlongBuffer(self.settings.overlong_buffer_len, self.settings.overlong_buffer_penalty_factor)
            outcome = apply_overlong(outcome, len(result.output_ids), budget, buffer)
        if outcome.error:
            self.metrics.reward_errors.inc()
        self.metrics.reward.observe(outcome.reward)
        return Sample(
            prompt_token_ids=list(prompt.prompt_token_ids),
            response_token_ids=result.output_ids,
            behavior_logprobs=result.logprobs,
            policy_versions=result.versions,
            reward=outcome.reward,
            finish_reason=result.finish_reason,
            replica_id=self.settings.replica_id,
            response_text=result.text,
            reward_extra={**result.extra, **outcome.extra},
            reward_error=bool(outcome.error),
            started_at_unix_s=started,
            finished_at_unix_s=time.time(),
            generation_s=result.engine_s,
            # The group's one reward-model call is waited for by each of its samples.
            reward_s=time.perf_counter() - reward_started + model_s,
            token_rewards=result.token_rewards,
            loss_mask=result.loss_mask,
            turn_ends=result.turn_ends,
        )

    def fresh(self, group: Group, latest_version: int) -> bool:
        """False (and counted) when the group already breaks the bound against the newest version."""
        if not any(s.policy_versions for s in group.samples):
            return True
        verdict = check_staleness(group.min_policy_version, latest_version, self.settings.max_staleness)
        if verdict.ok:
            return True
        self.metrics.dropped_stale_samples.inc(len(group.samples))
        log.info(
            "dropped stale group of %s (oldest version %d, newest %d, η=%d); its prompt goes back to the queue",
            group.prompt_id,
            group.min_policy_version,
            latest_version,
            self.settings.max_staleness,
        )
        return False
