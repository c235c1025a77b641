"""How versions reach the replicas: the delivery mode (``pull`` or ``push``, :mod:`.base`) and
the byte channel it uses, chosen by the ``transport`` setting.

``grpc`` → pull over ``tcp`` / ``grpc_chunks`` (:mod:`.pull`), ``disk`` → pull over ``disk``
(:mod:`.pull`), ``distributed`` → push over ``torch_dist`` (:mod:`.push`).
"""

from __future__ import annotations

from pathlib import Path

from services.paramsync.config import ParamSyncSettings
from services.paramsync.delivery.base import Delivery
from services.paramsync.table import VersionTable


def setup_delivery(settings: ParamSyncSettings, table: VersionTable) -> Delivery:
    """The delivery ``settings.transport`` names; raises ValueError if its settings are missing."""
    from services.paramsync.delivery.pull import PullFromDisk, PullOverStreams

    if settings.transport == "grpc":
        return PullOverStreams()
    if settings.transport == "disk":
        from services.paramsync.channels.disk import DiskChannel

        if not settings.shared_dir:
            raise ValueError("RELAYRL_PARAMSYNC_SHARED_DIR must be set for the disk transport")
        return PullFromDisk(DiskChannel(Path(settings.shared_dir), settings.keep_versions))
    from services.paramsync.channels.torch_dist import TorchDistSender
    from services.paramsync.delivery.push import PushDelivery

    sender = TorchDistSender(
        master_addr=settings.dist_master_addr,
        master_port=settings.dist_master_port,
        backend=settings.dist_backend,
        bucket_bytes=settings.dist_bucket_bytes,
        timeout_s=settings.sync_timeout,
    )
    return PushDelivery(
        table,
        sender,
        sync_timeout=settings.sync_timeout,
        max_sync_retries=settings.max_sync_retries,
        sync_retry_delay=settings.sync_retry_delay,
    )
