"""Running a reward function safely: on worker threads, with a timeout, never raising.

An exception, a timeout or a non-numeric result gives reward 0 with ``error`` set, and is
counted by the caller. A function that hangs keeps its worker thread busy (Python cannot kill
a thread), so the pool is sized for a few such stragglers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from services.rollout.rewards.registry import RewardFn

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RewardOutcome:
    reward: float
    extra: dict[str, float] = field(default_factory=dict)
    # Why the reward is the fallback 0; empty when the function returned normally.
    error: str = ""


def _interpret(result: Any) -> RewardOutcome:
    """A float, or verl's dict with ``score`` (other numeric entries become extras)."""
    if isinstance(result, dict):
        if "score" not in result:
            return RewardOutcome(0.0, error="reward dict has no 'score'")
        extra = {k: float(v) for k, v in result.items() if k != "score" and isinstance(v, (int, float, bool))}
        score = _interpret(result["score"])
        return RewardOutcome(score.reward, extra, score.error)
    try:
        value = float(result)
    except (TypeError, ValueError):
        return RewardOutcome(0.0, error=f"reward is not a number: {result!r:.80}")
    if not math.isfinite(value):
        return RewardOutcome(0.0, error=f"reward is not finite: {value}")
    return RewardOutcome(value)


class RewardRunner:
    def __init__(self, fn: RewardFn, timeout_s: float, workers: int = 8) -> None:
        self.fn = fn
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reward")

    async def score(
        self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None
    ) -> RewardOutcome:
        loop = asyncio.get_running_loop()
        call = loop.run_in_executor(self._pool, self.fn, data_source, solution_str, ground_truth, extra_info)
        try:
            result = await asyncio.wait_for(call, self.timeout_s)
        except TimeoutError:
            return RewardOutcome(0.0, error=f"reward function timed out after {self.timeout_s}s")
        except Exception as exc:
            log.warning("reward function raised on %s: %r", data_source, exc)
            return RewardOutcome(0.0, error=f"reward function raised {type(exc).__name__}: {exc}")
        return _interpret(result)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
