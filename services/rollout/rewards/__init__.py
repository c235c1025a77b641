"""Reward functions: rule-based verifiers, the built-in tasks, and users' verl ``compute_score`` files.

Every reward function has verl's signature
``compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``
(a dict carries the reward under ``"score"`` and any other scalars as extras).
"""

from services.rollout.rewards.registry import RewardFn, resolve_reward
from services.rollout.rewards.runner import RewardOutcome, RewardRunner

__all__ = ["RewardFn", "RewardOutcome", "RewardRunner", "resolve_reward"]
