"""The one interface every weight transport implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.manifest import Announcement
from services.paramsync.store import StoredVersion


class WeightTransport(ABC):
    """How a complete version reaches the replicas.

    ``deliver`` runs once per committed version (and again for replicas that join, on push
    transports); it returns the announcement subscribers receive. Pull transports leave the
    loading to the replica, which reports back with ReportVersion; push transports load the
    version into the engines themselves and record each replica's outcome in the version table.
    """

    name: ClassVar[str]
    # Announce at upload start so replicas fetch while the trainer is still uploading.
    forwards_uploads: ClassVar[bool] = False
    # Paramsync itself loads versions into engines (and must be told about new replicas).
    pushes: ClassVar[bool] = False

    @abstractmethod
    async def deliver(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> Announcement: ...

    def announcement(self, stored: StoredVersion, disk_path: str = "") -> Announcement:
        manifest = stored.manifest
        return Announcement(manifest.version, manifest.total_bytes, stored.published_at_unix_s, self.name, disk_path)
