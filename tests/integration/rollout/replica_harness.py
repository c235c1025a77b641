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
from services.engine.client import EngineClient
from services.paramsync.client import ParamSyncClient
from services.paramsync.config import ParamSyncSettings
from services.paramsync.server import SERVICE_NAME, build_service, create_discovery
from services.paramsync.service import add_to_server
from services.queue.client import QueueClient
from services.rollout.config import RolloutSettings
from services.rollout.metrics import RolloutMetrics
from services.rollout.replica import Replica
from services.rollout.rewards import RewardRunner, resolve_reward
from services.rollout.state import ReplicaState
from services.rollout.weight_sync import WeightSource, WeightSync


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
    source = ParamSyncClient(settings.paramsync_address) if settings.paramsync_address else None
    replica = Replica(settings, engine, queue, rewards, source, Path(settings.weights_dir) if source else None)
    tasks = replica.start()
    try:
        yield replica
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await engine.aclose()
        await replica.aclose()
        await queue.close()
        if source is not None:
            await source.close()
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
    source: WeightSource,
    engine: EngineClient,
    replica_id: str,
    mode: str,
    weights_dir: Path,
    held_version: int,
    **more: Any,
) -> tuple[WeightSync, ReplicaState]:
    """A WeightSync with no replica around it, over a state that holds ``held_version``; ``more``
    sets other rollout settings."""
    metrics = RolloutMetrics()
    state = ReplicaState(replica_id, metrics)
    state.hold(held_version)
    settings = RolloutSettings(replica_id=replica_id, engine_url=engine.base_url, partial_rollout_mode=mode, **more)
    return WeightSync(state, source, engine, settings, weights_dir, metrics), state


def sample_value(replica: Replica, name: str, **labels: str) -> float:
    """The value of the replica's metric ``relayrl_rollout_<name>`` (0 before it is first set)."""
    return replica.metrics.registry.registry.get_sample_value(f"relayrl_rollout_{name}", labels) or 0.0
