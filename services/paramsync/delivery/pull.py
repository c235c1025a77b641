"""``pull`` delivery: paramsync announces each version and the replicas fetch it themselves.

- ``grpc`` (the CPU default): nothing happens at delivery. The version was announced when its
  upload began, and each replica fetches it over the data plane (``tcp``) or the chunk streams
  (``grpc_chunks``) as its bytes arrive, loads it into its engine and reports back.
- ``disk``: each version is written to a directory every engine mounts (the ``disk`` channel);
  the announcement names it, and the replica has its engine load it.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.paramsync.channels.disk import DiskChannel
from services.paramsync.delivery.base import Delivery
from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.manifest import Announcement
from services.paramsync.store import StoredVersion


class PullOverStreams(Delivery):
    name = "grpc"
    mode = "pull"
    channels = ("tcp", "grpc_chunks")
    forwards_uploads = True

    async def deliver(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> Announcement:
        return self.announcement(stored)


class PullFromDisk(Delivery):
    name = "disk"
    mode = "pull"
    channels = ("disk",)

    def __init__(self, disk: DiskChannel) -> None:
        self.disk = disk

    async def deliver(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> Announcement:
        return self.announcement(stored, disk_path=str(await self.disk.send(stored)))
