"""``disk``: a version as ``<root>/v<version>/model.safetensors`` on a volume both ends mount.

The sending end (:meth:`DiskChannel.send`, paramsync) writes each committed version atomically
and keeps the newest ``keep_versions`` directories (plus the one being written), so a replica
still loading the previous version does not lose its files. The receiving end reads the
directory: an engine's ``/update_weights_from_disk`` maps it, and :meth:`DiskChannel.receive`
reads it back verified against the manifest in its metadata (as paramsync does with its own
``store_dir`` at start-up). The format is :mod:`services.paramsync.safetensors_io`'s.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from services.paramsync.safetensors_io import prune, read_version, version_dir, write_version
from services.paramsync.store import StoredVersion


@dataclass(frozen=True, slots=True)
class DiskChannel:
    root: Path
    keep_versions: int

    async def send(self, stored: StoredVersion) -> Path:
        """Writes ``stored`` under the root and prunes older versions; returns its directory."""
        directory = await asyncio.to_thread(write_version, stored, self.root)
        await asyncio.to_thread(prune, self.root, self.keep_versions + 1)
        return directory

    async def receive(self, version: int) -> StoredVersion:
        """Reads ``version`` back, every tensor checked; ValueError if it is not a complete version."""
        return await asyncio.to_thread(read_version, version_dir(self.root, version))
