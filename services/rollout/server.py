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
from services.rollout.config import RolloutSettings
from services.rollout.control import RolloutControlServicer, control_router
from services.rollout.engine_client import EngineClient
from services.rollout.replica import Replica
from services.rollout.rewards import RewardRunner, resolve_reward
from services.rollout.weight_sync import WeightSync

log = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutControl"].full_name


def weight_sync_for(replica: Replica, settings: RolloutSettings, weights_dir: Path) -> WeightSync:
    from services.paramsync.client import ParamSyncClient

    return WeightSync(
        source=ParamSyncClient(settings.paramsync_address),
        engine=replica.engine,
        replica_id=settings.replica_id,
        engine_url=settings.engine_url,
        mode=settings.partial_rollout_mode,
        weights_dir=weights_dir,
        control_lock=replica.control_lock,
        is_paused=lambda: replica.paused,
        held_version=lambda: replica.held_version,
        on_version=replica.set_version,
        on_latest=replica.note_latest,
        metrics=replica.metrics,
    )


async def serve(settings: RolloutSettings) -> None:
    from services.queue.client import QueueClient

    rewards = RewardRunner(resolve_reward(settings.reward_function), settings.reward_timeout_s)
    engine = EngineClient(settings.engine_url, timeout=settings.engine_timeout_s, retries=settings.engine_retries)
    queue = QueueClient(settings.queue_address)
    replica = Replica(settings, engine, queue, rewards)
    weights_tmp = tempfile.TemporaryDirectory(prefix="relayrl-rollout-weights-") if not settings.weights_dir else None
    weights_dir = Path(settings.weights_dir or weights_tmp.name)  # type: ignore[union-attr]

    tasks = [asyncio.create_task(replica.watch_engine(), name="engine-probe")]
    tasks.append(asyncio.create_task(replica.run(), name="replica-loop"))
    if settings.paramsync_address:
        sync = weight_sync_for(replica, settings, weights_dir)
        tasks.append(asyncio.create_task(sync_forever(sync, replica.engine_restarted), name="weight-sync"))

    grpc_server = await start_grpc_server(
        settings.host,
        settings.grpc_port,
        [lambda server: pb_grpc.add_RolloutControlServicer_to_server(RolloutControlServicer(replica), server)],
        [SERVICE_NAME],
    )
    app = create_http_app(
        "rollout", replica.metrics.registry, replica.ready, settings.api_token, [control_router(replica)]
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


async def sync_forever(
    sync: WeightSync,
    engine_restarted: asyncio.Event | None = None,
    backoff_s: float = 1.0,
    max_backoff_s: float = 30.0,
) -> None:
    """Runs the subscription; re-subscribes when it breaks, when a version did not load, or when
    the engine restarted (paramsync then sends the latest version at once, so a restarted engine
    gets the current weights back and a failed load is tried again). The wait before
    re-subscribing doubles from ``backoff_s`` to ``max_backoff_s`` while no version loads."""
    restarted = engine_restarted or asyncio.Event()
    delay = backoff_s
    while True:
        held_before = sync.held_version()
        run = asyncio.create_task(sync.run())
        restart = asyncio.create_task(restarted.wait())
        try:
            await asyncio.wait({run, restart}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (run, restart):
                task.cancel()
            await asyncio.gather(run, restart, return_exceptions=True)
        if restarted.is_set():
            restarted.clear()
            continue
        if sync.held_version() > held_before:
            delay = backoff_s
        if not run.cancelled() and run.exception() is not None:
            log.warning("weight sync stopped: %r; re-subscribing in %.1fs", run.exception(), delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_backoff_s)
