"""Running a rollout replica in-process against a real engine process and a real queue service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from relayrl.schema import Group, PromptSpec
from services.queue.client import QueueClient
from services.rollout.config import RolloutSettings
from services.rollout.engine_client import EngineClient
from services.rollout.replica import Replica
from services.rollout.rewards import RewardRunner, resolve_reward


@contextlib.asynccontextmanager
async def running_replica(engine_url: str, queue_address: str, **overrides: Any) -> AsyncIterator[Replica]:
    values: dict[str, Any] = {
        "engine_url": engine_url,
        "queue_address": queue_address,
        "engine_check_interval_s": 0.1,
        "lease_block_timeout_s": 0.2,
        "max_new_tokens": 8,
        "engine_retries": 1,
        "engine_timeout_s": 30.0,
    }
    values.update(overrides)
    settings = RolloutSettings(**values)
    rewards = RewardRunner(resolve_reward(settings.reward_function), settings.reward_timeout_s)
    engine = EngineClient(
        engine_url, timeout=settings.engine_timeout_s, retries=settings.engine_retries, backoff_s=0.05
    )
    queue = QueueClient(queue_address)
    replica = Replica(settings, engine, queue, rewards)
    tasks = [asyncio.create_task(replica.watch_engine()), asyncio.create_task(replica.run())]
    try:
        yield replica
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.aclose()
        await queue.close()
        rewards.close()


def prompt(index: int, n: int = 2, data_source: str = "relayrl/copy", **kwargs: Any) -> PromptSpec:
    return PromptSpec(
        prompt_id=f"test/{index}",
        prompt_token_ids=[5 + index, 6, 7, 8],
        n_samples=n,
        data_source=data_source,
        ground_truth="123",
        **kwargs,
    )


async def pull_groups(queue_address: str, count: int, timeout_s: float = 30.0, version: int = 0) -> list[Group]:
    """Pulls (and acks) ``count`` groups as the trainer would."""
    groups: list[Group] = []
    deadline = time.monotonic() + timeout_s
    async with QueueClient(queue_address) as queue:
        while len(groups) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(groups)} of {count} groups arrived")
            delivered = await queue.pull("trainer-0", version, 100, count - len(groups), block_timeout_s=0.5)
            groups += [d.group for d in delivered]
            if delivered:
                await queue.ack("trainer-0", [d.entry_id for d in delivered])
    return groups


async def wait_until(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
