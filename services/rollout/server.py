"""The rollout process: replica loop, engine probe, weight sync, gRPC + HTTP control, until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path

from relayrl.http_app import create_http_app
from relayrl.serving import start_grpc_server, start_http_server, wait_for_shutdown_signal
from relayrl.v1 import rollout_pb2
from relayrl.v1 import rollout_pb2_grpc as pb_grpc
from services.engine.client import EngineClient
from services.rollout.config import RolloutSettings
from services.rollout.control import RolloutControlServicer, control_router
from services.rollout.replica import Replica
from services.rollout.rewards import RewardRunner, resolve_reward

log = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutControl"].full_name


async def serve(settings: RolloutSettings) -> None:
    from services.paramsync.client import ParamSyncClient
    from services.queue.client import QueueClient

    rewards = RewardRunner(resolve_reward(settings.reward_function), settings.reward_timeout_s)
    engine = EngineClient(settings.engine_url, timeout=settings.engine_timeout_s, retries=settings.engine_retries)
    queue = QueueClient(settings.queue_address)
    weights_tmp = tempfile.TemporaryDirectory(prefix="relayrl-rollout-weights-") if not settings.weights_dir else None
    weights_dir = Path(settings.weights_dir or weights_tmp.name)  # type: ignore[union-attr]
    source = ParamSyncClient(settings.paramsync_address) if settings.paramsync_address else None
    replica = Replica(settings, engine, queue, rewards, source, weights_dir if source else None)
    tasks = replica.start()

    grpc_server = await start_grpc_server(
        settings.host,
        settings.grpc_port,
        [lambda server: pb_grpc.add_RolloutControlServicer_to_server(RolloutControlServicer(replica.control), server)],
        [SERVICE_NAME],
    )
    app = create_http_app(
        "rollout", replica.metrics.registry, replica.state.ready, settings.api_token, [control_router(replica.control)]
    )
    http = await start_http_server(app, settings.host, settings.http_port)
    log.info("rollout %s: engine %s, queue %s", settings.replica_id, settings.engine_url, settings.queue_address)
    try:
        await wait_for_shutdown_signal()
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await http.stop()
        await grpc_server.stop()
        await engine.aclose()
        rewards.close()
        if weights_tmp is not None:
            weights_tmp.cleanup()
