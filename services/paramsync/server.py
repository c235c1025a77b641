"""Running paramsync: ``relayrl paramsync serve`` builds the service from settings and serves it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from relayrl.extras import require
from relayrl.http_app import create_http_app
from relayrl.serving import Servers, serve_until_signal, start_servers
from services.paramsync.channels.tcp import DataPlaneServer
from services.paramsync.config import ParamSyncSettings
from services.paramsync.core import ParamSyncCore
from services.paramsync.delivery import setup_delivery
from services.paramsync.discovery import StaticDiscovery
from services.paramsync.endpoints import ReplicaDiscovery
from services.paramsync.metrics import ParamSyncMetrics
from services.paramsync.service import SERVICE_NAME, add_to_server
from services.paramsync.store import VersionStore
from services.paramsync.table import VersionTable, lag_deadline_s

log = logging.getLogger(__name__)


def create_discovery(settings: ParamSyncSettings) -> ReplicaDiscovery:
    """The discovery backend ``RELAYRL_PARAMSYNC_DISCOVERY`` names: static or kubernetes."""
    if settings.discovery == "kubernetes":
        # Imported only here: the kubernetes client is heavy and only this backend needs it.
        require("kubernetes", "k8s", "RELAYRL_PARAMSYNC_DISCOVERY=kubernetes")
        from services.paramsync.discovery_k8s import KubernetesDiscovery

        return KubernetesDiscovery(namespace=settings.k8s_namespace, label_selector=settings.k8s_label_selector)
    return StaticDiscovery(settings.replica_endpoints())


def build_service(settings: ParamSyncSettings) -> ParamSyncCore:
    metrics = ParamSyncMetrics()
    deadline = lag_deadline_s(settings.sync_timeout, settings.max_sync_retries, settings.sync_retry_delay)
    table = VersionTable(metrics, settings.max_sync_retries, deadline)
    return ParamSyncCore(
        store=VersionStore(settings.keep_versions),
        table=table,
        delivery=setup_delivery(settings, table),
        metrics=metrics,
        chunk_bytes=settings.chunk_bytes,
        upload_idle_timeout_s=settings.upload_idle_timeout_s,
        resume_window_s=settings.upload_resume_window_s,
        store_dir=Path(settings.store_dir) if settings.store_dir else None,
    )


async def serve(settings: ParamSyncSettings) -> None:
    await serve_until_signal("paramsync", lambda: start_paramsync(settings))


@dataclass
class RunningParamSync:
    servers: Servers
    data_plane: DataPlaneServer
    tasks: list[asyncio.Task[None]]

    async def stop(self) -> None:
        await self.servers.stop(grpc_grace_s=2.0)
        await self.data_plane.stop()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def start_paramsync(settings: ParamSyncSettings) -> RunningParamSync:
    service = build_service(settings)
    await asyncio.to_thread(service.restore_from_disk)
    tasks = [
        asyncio.create_task(service.run_deliveries(), name="deliveries"),
        asyncio.create_task(service.watch_discovery(create_discovery(settings)), name="discovery"),
        asyncio.create_task(service.watch_deadlines(min(1.0, service.table.deadline_s / 4)), name="deadlines"),
    ]

    def ready() -> bool:
        # Ready while every background task is alive: a dead delivery loop would silently stop syncs.
        return not any(t.done() for t in tasks)

    data_plane = DataPlaneServer(service, settings.forward_streams)
    if settings.data_plane:
        await data_plane.start(settings.host, settings.data_port)

    app = create_http_app("paramsync", service.metrics.service, ready, settings.api_token)
    servers = await start_servers(settings, app, [lambda s: add_to_server(service, s)], [SERVICE_NAME])
    assert servers.grpc is not None
    log.info(
        "paramsync ready: transport=%s grpc=%s:%d http=%s:%d data plane port=%s",
        settings.transport,
        settings.host,
        servers.grpc.port,
        settings.host,
        servers.http.port,
        service.data_port or "off",
    )
    return RunningParamSync(servers, data_plane, tasks)
