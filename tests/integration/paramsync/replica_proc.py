"""A rollout replica's weight loop, run as its own process by the tests.

``python replica_proc.py ADDRESS REPLICA_ID STATE_DIR``: subscribes with the version recorded in
STATE_DIR (so a restarted replica resumes from what it held), fetches each announced version,
writes it to STATE_DIR/weights.safetensors, records the version in STATE_DIR/held, then reports.
Real replicas hand the same file to their engine's /update_weights_from_disk.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from services.paramsync.client import ParamSyncClient
from services.paramsync.errors import ParamSyncError


def held_version(state_dir: Path) -> int:
    path = state_dir / "held"
    return int(path.read_text()) if path.exists() else 0


async def main(address: str, replica_id: str, state_dir: Path) -> None:
    torch.set_num_threads(1)
    held = held_version(state_dir)
    async with ParamSyncClient(address, sync_timeout=30, max_sync_retries=2, sync_retry_delay=0.2) as client:
        async for announcement in client.subscribe(replica_id, held):
            if announcement.version <= held:
                continue
            started = time.perf_counter()
            try:
                tensors = await client.fetch(announcement.version, replica_id)
            except ParamSyncError as exc:
                await client.report_version(replica_id, announcement.version, ok=False, error=str(exc))
                continue
            save_file(tensors, str(state_dir / "weights.safetensors.tmp"))
            (state_dir / "weights.safetensors.tmp").replace(state_dir / "weights.safetensors")
            (state_dir / "held.tmp").write_text(str(announcement.version))
            (state_dir / "held.tmp").replace(state_dir / "held")
            held = announcement.version
            with open(state_dir / "fetched.log", "a") as log:
                log.write(f"{announcement.version}\n")
            await client.report_version(replica_id, held, ok=True, sync_s=time.perf_counter() - started)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
