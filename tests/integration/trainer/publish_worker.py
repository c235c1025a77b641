"""One rank of a streamed publish (launched by torchrun from test_streamed_publish.py).

``python -m ... MODEL_DIR PARAMSYNC_ADDRESS BUCKET_BYTES OUT``: every rank trains one step, then
publishes version 1 through the trainer's own path (stream_weights: bucketed gather through the
ranks' shared memory, as a CPU trainer's, hand-off, upload on rank 0's I/O thread); rank 0 then
writes the full state dict it trained to (gathered by an all-gather), the names a version holds,
the gather's peak of live bytes and whether it shared memory to OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.gather import BucketGather, published_items
from services.trainer.links import IoThread, Publisher
from services.trainer.step import train_step
from services.trainer.trainer import build_models, gather_weights, stream_weights
from tests.integration.trainer.fsdp_worker import batch


def main(model_dir: str, address: str, bucket_bytes: int, out: str) -> None:
    torch.set_num_threads(1)
    ctx = D.init_distributed("cpu")
    settings = TrainerSettings(model_dir=Path(model_dir), lr=1e-3, micro_batch_tokens=24)
    models = build_models(settings, ctx)
    train_step(models, batch(0), settings, pad_id=0)
    gather = BucketGather(bucket_bytes, share_host_memory=True)
    publisher = io = None
    if ctx.is_main:
        from services.paramsync.client import ParamSyncClient

        io = IoThread()
        sink = io.call(_client(ParamSyncClient, address))
        publisher = Publisher(io, sink)
    metrics = stream_weights(models.actor, gather, publisher, version=1, step=1)
    weights = gather_weights(models.actor)
    published = [name for name, _ in published_items(models.actor)]
    if publisher is not None:
        publisher.drain()
        record = publisher.records[-1]
        assert record.ok, record.error
        torch.save(
            {
                "weights": dict(weights),
                "published": published,
                "peak": gather.peak_live_bytes,
                "metrics": metrics,
                "shared": gather.shares_host_memory,
            },
            out,
        )
    D.exit_rank()


async def _client(cls, address: str):
    return cls(address)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
