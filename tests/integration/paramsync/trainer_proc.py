"""A trainer process that publishes a policy whose weights differ from the engine's.

``python trainer_proc.py ADDRESS VERSION OUT_DIR SEED``: writes a tiny model initialised with SEED
to OUT_DIR (so the test can compute what the new policy generates) and publishes its state
dict as VERSION through the paramsync client, exactly as the trainer service does.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import torch

from relayrl.models.loading import load_causal_lm
from relayrl.models.tiny import TinyModelSpec, init_tiny
from services.paramsync.client import ParamSyncClient


async def main(address: str, version: int, out_dir: Path, seed: int) -> None:
    torch.set_num_threads(1)
    init_tiny(out_dir, TinyModelSpec(seed=seed))
    model = load_causal_lm(out_dir)
    async with ParamSyncClient(address) as client:
        result = await client.publish(version, model.state_dict(), trainer_step=version)
    print(f"PUBLISHED {result.version} {result.total_bytes}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])))
