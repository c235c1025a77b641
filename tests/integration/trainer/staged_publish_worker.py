"""One rank of a publish gathered as a GPU trainer gathers (launched by torchrun from
test_staged_publish.py), run on gloo.

``python -m ... MODEL_DIR PARAMSYNC_ADDRESS BUCKET_BYTES OUT``: every rank trains one step, then
publishes version 1 through stream_weights with the all-gather (no shared host memory, as under
NCCL) and a staging of depth 1 (each bucket handed on only once the next one's gather is done, as
CUDA's copy stream overlaps them). Rank 0 writes the trained state dict, the names a version holds,
the gather's peak of live bytes, each staged bucket's bytes and the order in which buckets were
staged and handed on to OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.gather import BucketGather, published_items
from services.trainer.links import IoThread, Publisher
from services.trainer.staging import Gathered, Staged, SyncStaging
from services.trainer.step import train_step
from services.trainer.trainer import build_models, gather_weights, stream_weights
from tests.integration.trainer.fsdp_worker import batch


class RecordingStaging(SyncStaging):
    """The CPU's staging at depth 1, noting when each bucket is staged and when it is handed on."""

    def __init__(self) -> None:
        super().__init__(depth=1)
        self.sizes: list[int] = []
        self.events: list[tuple[str, int]] = []

    def stage(self, bucket: list[Gathered]) -> Staged:
        staged = super().stage(bucket)
        index = len(self.sizes)
        self.sizes.append(sum(t.numel() * t.element_size() for t in staged.tensors))
        self.events.append(("staged", index))
        return _Handed(staged.tensors, lambda: self.events.append(("handed", index)))


class _Handed(Staged):
    __slots__ = ("_on_wait",)

    def __init__(self, tensors: list[torch.Tensor], on_wait) -> None:
        super().__init__(tensors)
        self._on_wait = on_wait

    def wait(self) -> list[torch.Tensor]:
        self._on_wait()
        return super().wait()


def main(model_dir: str, address: str, bucket_bytes: int, out: str) -> None:
    torch.set_num_threads(1)
    ctx = D.init_distributed("cpu")
    settings = TrainerSettings(model_dir=Path(model_dir), lr=1e-3, micro_batch_tokens=24)
    models = build_models(settings, ctx)
    train_step(models, batch(0), settings, pad_id=0)
    staging = RecordingStaging()
    gather = BucketGather(bucket_bytes, share_host_memory=False, staging=staging)
    publisher = io = None
    if ctx.is_main:
        from services.paramsync.client import ParamSyncClient

        io = IoThread()
        sink = io.call(_client(ParamSyncClient, address))
        publisher = Publisher(io, sink)
    stream_weights(models.actor, gather, publisher, version=1, step=1)
    weights = gather_weights(models.actor)
    if publisher is not None:
        publisher.drain()
        record = publisher.records[-1]
        assert record.ok, record.error
        published = [name for name, _ in published_items(models.actor)]
        torch.save(
            {
                "weights": dict(weights),
                "published": published,
                "peak": gather.peak_live_bytes,
                "sizes": staging.sizes,
                "events": staging.events,
            },
            out,
        )
    D.exit_rank()


async def _client(cls, address: str):
    return cls(address)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
