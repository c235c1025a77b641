"""The rollout process: replica loop, engine probe, weight sync, gRPC + HTTP control, until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends

from relayrl.http_app import bearer_auth, create_http_app
from relayrl.serving import Servers, serve_until_signal, start_servers
from relayrl.v1 import rollout_pb2
from relayrl.v1 import rollout_pb2_grpc as pb_grpc
from services.engine.client import EngineClient
from services.rollout.config import RolloutSettings
from services.rollout.control import RolloutControlServicer, control_router
from services.rollout.conversations import ConversationMetrics, Conversations, GroupQueue
from services.rollout.openai_api import OpenAIEndpoint, openai_router
from services.rollout.replica import Replica
from services.rollout.rewards import RewardRunner, resolve_reward

log = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutControl"].full_name


async def serve(settings: RolloutSettings) -> None:
    await serve_until_signal("rollout", lambda: start_rollout(settings))


@dataclass
class RunningReplica:
    servers: Servers
    tasks: list[asyncio.Task[None]]
    replica: Replica
    engine: EngineClient
    rewards: RewardRunner
    weights_tmp: tempfile.TemporaryDirectory[str] | None

    async def stop(self) -> None:
        # Draining: the endpoint answers new requests 503 (Retry-After) while the rest stops.
        self.replica.state.set_draining()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.servers.stop()
        await self.engine.aclose()
        await self.replica.aclose()
        self.rewards.close()
        if self.weights_tmp is not None:
            self.weights_tmp.cleanup()


async def start_rollout(settings: RolloutSettings) -> RunningReplica:
    from services.paramsync.client import ParamSyncClient
    from services.queue.client import QueueClient

    rewards = RewardRunner(resolve_reward(settings.reward_function), settings.reward_timeout_s)
    engine = EngineClient(settings.engine_url, timeout=settings.engine_timeout_s, retries=settings.engine_retries)
    queue = QueueClient(settings.queue_address)
    weights_tmp = tempfile.TemporaryDirectory(prefix="relayrl-rollout-weights-") if not settings.weights_dir else None
    weights_dir = Path(settings.weights_dir or weights_tmp.name)  # type: ignore[union-attr]
    source = (
        ParamSyncClient(settings.paramsync_address, shared_memory=settings.weights_map_shared_memory)
        if settings.paramsync_address
        else None
    )
    replica = Replica(settings, engine, queue, rewards, source, weights_dir if source else None)
    tasks = replica.start()
    openai = openai_endpoint(settings, replica, engine, queue, rewards)
    tasks.append(asyncio.create_task(openai.conversations.run_sweeps(), name="openai-conversations"))

    app = create_http_app(
        "rollout", replica.metrics.registry, replica.state.ready, settings.api_token, [control_router(replica.control)]
    )
    # The openai client sends its api_key as a bearer token: the service's token when one is set.
    app.include_router(openai_router(openai), dependencies=[Depends(bearer_auth(settings.api_token))])
    servers = await start_servers(
        settings,
        app,
        [lambda server: pb_grpc.add_RolloutControlServicer_to_server(RolloutControlServicer(replica.control), server)],
        [SERVICE_NAME],
    )
    log.info("rollout %s: engine %s, queue %s", settings.replica_id, settings.engine_url, settings.queue_address)
    return RunningReplica(servers, tasks, replica, engine, rewards, weights_tmp)


def openai_endpoint(
    settings: RolloutSettings, replica: Replica, engine: EngineClient, queue: GroupQueue, rewards: RewardRunner
) -> OpenAIEndpoint:
    """The OpenAI-compatible endpoint over the replica's engine, pushing recorded conversations to ``queue``."""
    conversations = Conversations(
        queue,
        ConversationMetrics(replica.metrics.registry),
        settings.replica_id,
        settings.openai_conversation_idle_timeout_s,
        settings.max_staleness,
        settings.push_timeout_s,
        lambda: replica.state.latest_version,
    )
    return OpenAIEndpoint(settings, replica.state, engine, rewards, replica.metrics, conversations)
