"""``relayrl trainer run``: one rank of the trainer job (launch N of them with torchrun).

Rank 0 also serves HTTP (/healthz, /readyz, /metrics, /control/*) and gRPC health on its I/O
thread; the other ranks only train.
"""

from __future__ import annotations

import logging

from relayrl.http_app import create_http_app
from relayrl.serving import start_servers
from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.control import Control, control_router
from services.trainer.links import IoThread
from services.trainer.state import TrainerState
from services.trainer.trainer import Trainer, install_stop_handlers

log = logging.getLogger(__name__)


async def _open_links(s: TrainerSettings):
    # gRPC asyncio channels belong to the loop that creates them: build them on the I/O loop.
    from services.paramsync.client import ParamSyncClient
    from services.queue.client import QueueClient

    queue = QueueClient(s.queue_address)
    sink = None
    if s.paramsync_address:
        sink = ParamSyncClient(
            s.paramsync_address,
            sync_timeout=s.sync_timeout,
            max_sync_retries=s.max_sync_retries,
            sync_retry_delay=s.sync_retry_delay,
        )
    return queue, sink


def run_service(settings: TrainerSettings) -> TrainerState:
    ctx = D.init_distributed(settings.device, settings.deterministic)
    control = Control()
    install_stop_handlers(control)
    io = queue = sink = servers = None
    trainer: Trainer | None = None
    try:
        if ctx.is_main:
            io = IoThread()
            queue, sink = io.call(_open_links(settings))
        trainer = Trainer(settings, ctx, queue, sink, io, control)
        if ctx.is_main:
            app = create_http_app(
                "trainer",
                trainer.telemetry.metrics,
                ready=control.ready.is_set,
                api_token=settings.api_token,
                control_routers=[control_router(control, trainer.status, trainer.telemetry.fates)],
            )
            servers = io.call(start_servers(settings, app, grpc_health_only=True))
            assert servers.grpc is not None
            log.info(
                "trainer rank 0: HTTP on %s:%d, gRPC health on %d", settings.host, servers.http.port, servers.grpc.port
            )
        return trainer.run()
    finally:
        if io is not None:
            for closer in (
                servers and servers.stop(),
                queue and queue.close(),
                sink and sink.close(),
            ):
                if closer is not None:
                    io.call(closer, timeout_s=30)
            io.stop()
        if trainer is not None:
            trainer.close()
        D.shutdown()
