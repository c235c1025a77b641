"""Running a rollout replica in-process against a real engine process, a real queue service and a real paramsync."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch

from relayrl.schema import Group, PromptSpec
from relayrl.serving import start_grpc_server
from services.paramsync.config import ParamSyncSettings
from services.paramsync.discovery import create_discovery
from services.paramsync.server import SERVICE_NAME, build_service
from services.paramsync.service import add_to_server
from services.queue.client import QueueClient
from services.rollout.config import RolloutSettings
from services.rollout.engine_client import EngineClient
from services.rollout.metrics import RolloutMetrics
from services.rollout.replica import Replica
from services.rollout.rewards import RewardRunner, resolve_reward
from services.rollout.server import sync_forever, weight_sync_for
from services.rollout.weight_sync import WeightSync


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
    if settings.paramsync_address:
        sync = weight_sync_for(replica, settings, Path(settings.weights_dir))
        tasks.append(asyncio.create_task(sync_forever(sync, replica.engine_restarted)))
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


@contextlib.asynccontextmanager
async def paramsync_service(**overrides: Any) -> AsyncIterator[str]:
    """A real paramsync (gRPC transport unless overridden) with its background tasks on this loop."""
    settings = ParamSyncSettings(**{"transport": "grpc", **overrides})
    service = build_service(settings)
    tasks = [
        asyncio.create_task(service.run_deliveries()),
        asyncio.create_task(service.watch_discovery(create_discovery(settings))),
    ]
    server = await start_grpc_server("127.0.0.1", 0, [lambda s: add_to_server(service, s)], [SERVICE_NAME])
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop(0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def new_policy(model_dir: Path, scale: float) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v * scale for k, v in load_file(str(model_dir / "model.safetensors")).items()}


def bare_weight_sync(
    source: Any, engine: EngineClient, replica_id: str, engine_url: str, mode: str, weights_dir: Path, held_version: int
) -> tuple[WeightSync, dict[str, int]]:
    """A WeightSync with no replica around it; the returned dict's "version" is the version it holds."""
    held = {"version": held_version}

    async def on_version(version: int, _: float) -> None:
        held["version"] = version

    sync = WeightSync(
        source=source,
        engine=engine,
        replica_id=replica_id,
        engine_url=engine_url,
        mode=mode,
        weights_dir=weights_dir,
        control_lock=asyncio.Lock(),
        is_paused=lambda: False,
        held_version=lambda: held["version"],
        on_version=on_version,
        on_latest=lambda _: None,
        metrics=RolloutMetrics(),
    )
    return sync, held
