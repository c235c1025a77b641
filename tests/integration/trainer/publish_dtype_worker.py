"""One rank of a publish in each rollout dtype (launched by torchrun from test_publish_dtype.py).

``python -m ... MODEL_DIR PARAMSYNC_ADDRESS OUT``: every rank trains one step, then the job
publishes the same trained weights twice through the trainer's own publish (``publish_gather``:
the bucketed gather through the ranks' shared memory, cast on the device, hand-off, upload):
version 1 with ``rollout_dtype: fp32``, version 2 with ``rollout_dtype: bf16``. Rank 0 writes the
full fp32 state dict it trained to, the names a version holds, each version's gather metrics, and
the bf16 version as its handles give it (the trainer's ``share_weights_by_handle``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from services.engine.tensor_updates import named_tensors
from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.gather import published_items
from services.trainer.links import IoThread, Publisher
from services.trainer.step import train_step
from services.trainer.trainer import build_models, gather_weights, publish_gather, stream_weights
from services.trainer.weight_handles import HandleSlots
from tests.integration.trainer.fsdp_worker import batch


def main(model_dir: str, address: str, out: str) -> None:
    torch.set_num_threads(1)
    ctx = D.init_distributed("cpu")
    settings = TrainerSettings(model_dir=Path(model_dir), lr=1e-3, ppo_max_token_len_per_gpu=24)
    models = build_models(settings, ctx)
    train_step(models, batch(0), settings, pad_id=0)
    publisher = io = None
    if ctx.is_main:
        from services.paramsync.client import ParamSyncClient

        io = IoThread()
        sink = io.call(_client(ParamSyncClient, address))
        publisher = Publisher(io, sink)
    metrics = {}
    # The bf16 version is also shared by handle (share_weights_by_handle): its slot is filled from
    # the FSDP gather's row ranges, and rank 0 opens its handles as an engine would.
    slots = HandleSlots(ctx.device) if ctx.is_main else None
    by_handle: dict[str, torch.Tensor] = {}
    for version, dtype in ((1, "fp32"), (2, "bf16")):
        gather = publish_gather(settings.model_copy(update={"rollout_dtype": dtype}), ctx.device)
        shared = slots if dtype == "bf16" else None
        metrics[dtype] = stream_weights(models.actor, gather, publisher, version=version, step=1, slots=shared)
        metrics[dtype]["shared"] = gather.shares_host_memory
    if publisher is not None:
        handles = io.call(_announced_handles(sink, 2))
        for payload in handles.buckets:
            by_handle.update({n: t.clone() for n, t in named_tensors([payload], handles.load_format).items()})
    weights = gather_weights(models.actor)
    if publisher is not None:
        publisher.drain()
        assert all(r.ok for r in publisher.records), [r.error for r in publisher.records]
        published = [name for name, _ in published_items(models.actor)]
        torch.save({"weights": dict(weights), "published": published, "metrics": metrics, "by_handle": by_handle}, out)
    D.exit_rank()


async def _client(cls, address: str):
    return cls(address)


async def _announced_handles(client, version: int):
    announcements = client.subscribe("handle-reader", held_version=version - 1)
    try:
        return (await anext(announcements)).handles
    finally:
        await announcements.aclose()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
