"""The one interface of a delivery mode: who starts a version's way to the replicas.

``pull``: paramsync announces the version and each replica fetches (or reads) it, loads it and
reports back with ReportVersion. ``push``: paramsync loads the version into every engine itself
and records each replica's outcome in the version table. Each delivery names the byte channels
(:mod:`services.paramsync.channels`) its bytes may take; ``name`` is the ``transport`` setting's value.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal

from services.paramsync.channels.base import ChannelName
from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.manifest import Announcement
from services.paramsync.store import StoredVersion


class Delivery(ABC):
    """``deliver`` runs once per committed version (and again for replicas that join, on push);
    it returns the announcement subscribers receive."""

    name: ClassVar[str]
    mode: ClassVar[Literal["pull", "push"]]
    # In the order a transfer tries them: where there are several, the receiving peer picks one per
    # transfer (a replica fetches over tcp where paramsync serves the data plane, else grpc_chunks).
    channels: ClassVar[tuple[ChannelName, ...]]
    # Announce at upload start so replicas fetch while the trainer is still uploading.
    forwards_uploads: ClassVar[bool] = False

    @property
    def pushes(self) -> bool:
        """Paramsync itself loads versions into engines (and must be told about new replicas)."""
        return self.mode == "push"

    @abstractmethod
    async def deliver(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> Announcement: ...

    def announcement(self, stored: StoredVersion, disk_path: str = "") -> Announcement:
        manifest = stored.manifest
        return Announcement(
            manifest.version, manifest.total_bytes, stored.published_at_unix_s, self.name, disk_path, stored.handles
        )
