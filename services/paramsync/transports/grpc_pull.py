"""``grpc``: replicas pull chunk streams with Fetch (the CPU default).

Nothing happens at delivery: the version was announced when its upload began, and each replica
fetches it, loads it into its engine and reports back.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.manifest import Announcement
from services.paramsync.store import StoredVersion
from services.paramsync.transports.base import WeightTransport


class GrpcPullTransport(WeightTransport):
    name = "grpc"
    forwards_uploads = True

    async def deliver(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> Announcement:
        return self.announcement(stored)
