"""``disk``: each version is written as safetensors under a directory every engine mounts.

The announcement carries the version's directory; the replica passes it to its engine's
``/update_weights_from_disk`` and reports back. The newest ``keep_versions`` directories are kept,
so a replica still loading the previous version does not lose its files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.manifest import Announcement
from services.paramsync.safetensors_io import prune, write_version
from services.paramsync.store import StoredVersion
from services.paramsync.transports.base import WeightTransport


class DiskTransport(WeightTransport):
    name = "disk"

    def __init__(self, shared_dir: Path, keep_versions: int) -> None:
        self.shared_dir = shared_dir
        self.keep_versions = keep_versions

    async def deliver(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> Announcement:
        directory = await asyncio.to_thread(write_version, stored, self.shared_dir)
        await asyncio.to_thread(prune, self.shared_dir, self.keep_versions + 1)
        return self.announcement(stored, disk_path=str(directory))
