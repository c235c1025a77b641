"""Every way a version travels from paramsync to the replicas, one module each, chosen by settings.

``grpc`` (:mod:`.grpc_pull`), ``disk`` (:mod:`.disk`), ``distributed`` (:mod:`.distributed`).
"""

from __future__ import annotations

from pathlib import Path

from services.paramsync.config import ParamSyncSettings
from services.paramsync.table import VersionTable
from services.paramsync.transports.base import WeightTransport


def setup_transport(settings: ParamSyncSettings, table: VersionTable) -> WeightTransport:
    """The transport named by ``settings.transport``; raises ValueError if its settings are missing."""
    if settings.transport == "grpc":
        from services.paramsync.transports.grpc_pull import GrpcPullTransport

        return GrpcPullTransport()
    if settings.transport == "disk":
        from services.paramsync.transports.disk import DiskTransport

        if not settings.shared_dir:
            raise ValueError("RELAYRL_PARAMSYNC_SHARED_DIR must be set for the disk transport")
        return DiskTransport(Path(settings.shared_dir), settings.keep_versions)
    from services.paramsync.transports.distributed import DistributedTransport

    return DistributedTransport(
        table,
        master_addr=settings.dist_master_addr,
        master_port=settings.dist_master_port,
        backend=settings.dist_backend,
        bucket_bytes=settings.dist_bucket_bytes,
        sync_timeout=settings.sync_timeout,
        max_sync_retries=settings.max_sync_retries,
        sync_retry_delay=settings.sync_retry_delay,
    )
