"""``disk``: a version as ``<root>/v<version>/model.safetensors`` on a volume both ends mount.

The sending end (:meth:`DiskChannel.send`, paramsync) writes each committed version atomically
and keeps the newest ``keep_versions`` directories (plus the one being written), so a replica
still loading the previous version does not lose its files. The receiving end reads the
directory: an engine's ``/update_weights_from_disk`` maps it, and :meth:`DiskChannel.receive`
reads it straight into the memory its caller names (``place``, as the ``tcp`` and
``grpc_chunks`` receivers do), verified against the manifest in its metadata. The format is
:mod:`services.paramsync.safetensors_io`'s.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from services.paramsync.channels.base import Place
from services.paramsync.manifest import Manifest
from services.paramsync.safetensors_io import prune, read_into, version_dir, write_version
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

    async def receive(self, version: int, place: Place) -> Manifest:
        """Reads ``version`` into the views ``place`` gives once its manifest is known, every tensor
        checked; returns the manifest. ValueError if it is not a complete version."""
        return await asyncio.to_thread(read_into, version_dir(self.root, version), place)
