"""Running the queue service: Redis client, both stores, gRPC + HTTP servers, metrics refresh."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from relayrl.http_app import create_http_app
from relayrl.serving import HttpServer, Servers, serve_until_signal, start_servers
from relayrl.v1 import queue_pb2_grpc as qgrpc
from services.queue.bells import Bells
from services.queue.config import QueueSettings
from services.queue.entries import entries_router
from services.queue.keys import Keys
from services.queue.metrics import QueueMetrics
from services.queue.prompts import PromptQueue
from services.queue.redis_conn import apply_persistence, connect, redis_reachable
from services.queue.service import PromptQueueServicer, TrajectoryQueueServicer
from services.queue.trajectories import TrajectoryQueue
from services.queue.wire import add_trajectory_queue

log = logging.getLogger(__name__)

SERVICE_NAMES = ("relayrl.v1.TrajectoryQueue", "relayrl.v1.PromptQueue")


@dataclass
class QueueServer:
    settings: QueueSettings
    redis: aioredis.Redis
    servers: Servers
    refresher: asyncio.Task[None]
    listener: asyncio.Task[None]
    stopping: asyncio.Event

    @property
    def grpc_address(self) -> str:
        assert self.servers.grpc is not None
        return f"{self.settings.host}:{self.servers.grpc.port}"

    @property
    def http(self) -> HttpServer:
        return self.servers.http

    async def stop(self) -> None:
        # Not Task.cancel(): redis-py may turn a cancellation inside a command into a
        # connection error, which the refresh loop would swallow and carry on.
        self.stopping.set()
        await self.refresher
        # The listener holds no state worth finishing: a cancel ends its wait for a message at once.
        self.listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.listener
        await self.servers.stop(grpc_grace_s=1.0)
        await self.redis.aclose()


async def start_queue_server(settings: QueueSettings) -> QueueServer:
    redis = connect(settings)
    keys = Keys(settings.run_id)
    bells = Bells(redis, [keys.prompt_bell, keys.room_bell])
    trajectories = TrajectoryQueue(redis, settings, bells)
    prompts = PromptQueue(redis, settings, bells)
    try:
        await apply_persistence(redis, settings.redis_appendfsync)
        await trajectories.ensure_group()
    except (RedisConnectionError, OSError) as err:
        log.warning("Redis not reachable yet (%s); serving anyway, /readyz says not ready", err)
    metrics = QueueMetrics()
    entries = entries_router(redis, keys, settings.dead_letter_maxlen)
    app = create_http_app("queue", metrics.registry, lambda: redis_reachable(redis), settings.api_token, [entries])
    servers = await start_servers(
        settings,
        app,
        [
            lambda s: add_trajectory_queue(TrajectoryQueueServicer(trajectories, metrics), s),
            lambda s: qgrpc.add_PromptQueueServicer_to_server(PromptQueueServicer(prompts), s),
        ],
        SERVICE_NAMES,
    )
    stopping = asyncio.Event()
    refresher = asyncio.create_task(_keep_fresh(redis, settings, trajectories, prompts, metrics, stopping))
    listener = asyncio.create_task(bells.listen(stopping), name="queue-bells")
    return QueueServer(settings, redis, servers, refresher, listener, stopping)


async def _keep_fresh(
    redis: aioredis.Redis,
    settings: QueueSettings,
    trajectories: TrajectoryQueue,
    prompts: PromptQueue,
    metrics: QueueMetrics,
    stopping: asyncio.Event,
) -> None:
    """Sets Redis up once it is reachable (it may start after us), then refreshes the gauges."""
    ready = False
    while not stopping.is_set():
        try:
            if not ready:
                await apply_persistence(redis, settings.redis_appendfsync)
                await trajectories.ensure_group()
                ready = True
            metrics.update(await trajectories.stats(), await prompts.stats())
        except Exception as err:
            # Redis down or restarting: readyz reports it; keep trying.
            log.warning("queue metrics refresh failed: %s", err)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), settings.stats_refresh_s if ready else 0.2)


async def serve(settings: QueueSettings) -> None:
    async def start() -> QueueServer:
        server = await start_queue_server(settings)
        log.info(
            "queue serving gRPC on %s, HTTP on %s:%d, Redis %s, run %s",
            server.grpc_address,
            settings.host,
            server.http.port,
            settings.redis_url.rpartition("@")[2],
            settings.run_id,
        )
        return server

    await serve_until_signal("queue", start)
