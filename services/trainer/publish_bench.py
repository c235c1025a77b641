"""The trainer side of ``relayrl bench weights``: one rank of a torchrun job that publishes versions
of the FSDP2-sharded model through the trainer's own publish code, one version per command.

Run as ``torchrun --nproc-per-node 2 -m services.trainer.publish_bench MODEL_DIR CONTROL_PORT
[LORA_RANK]``; with a LORA_RANK above 0 the actor gets a peft adapter before it is sharded, as the
trainer's ``lora_rank`` does, and each version is that adapter.
Rank 0 connects to the bench on ``CONTROL_PORT`` (loopback), says hello with its pid (the bench
reads its peak memory) and reads ``{"paramsync": "host:port"}``: the job loads the model while
the bench starts the stack. Then for each line ``{"version": v}`` every rank perturbs its shard (so
each version differs, as after an optimizer step), and the job publishes; rank 0 answers one
:class:`~commands.stack.weights_figures.PublishedVersion` as a JSON line. ``{"stop": true}`` ends
the job. No optimizer and no data: the step is the perturbation alone, so the bench times the
weight path and nothing else. The publish takes the trainer's settings from the environment
(``RELAYRL_TRAINER_ROLLOUT_DTYPE=bf16`` publishes bf16 versions, ``..._UPDATE_WEIGHTS_BUCKET_MEGABYTES``
the bucket size).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from services.trainer.gather import BucketGather
    from services.trainer.links import Publisher

# The longest rank 0 waits for the bench's next command, and for one upload.
COMMAND_TIMEOUT_S = 600.0
UPLOAD_TIMEOUT_S = 600.0
# Added to every trained weight per version: changes every published tensor's bytes, keeps the model sane.
PERTURBATION = 1e-4
# The adapter's alpha (the trainer's default); the bench's replicas are given the same.
LORA_ALPHA = 16.0


@dataclass(frozen=True, slots=True)
class PublishedVersion:
    """Rank 0's answer to one ``{"version": v}`` command, sent as a JSON object field for field.

    Defined here, with torch imported only inside the functions, so the bench reads it light.
    """

    version: int
    # When the (perturbed) weights were final, as a training step ends.
    step_end_unix_s: float
    gather_s: float
    # The streamed upload from its start (with the gather, which it runs beside) to paramsync's commit.
    upload_s: float
    # Bytes the publish moved, and the trainer's bucket size (update_weights_bucket_megabytes).
    model_bytes: int
    bucket_bytes: int


def publish_version(
    actor: torch.nn.Module, gather: BucketGather, publisher: Publisher | None, version: int
) -> PublishedVersion | None:
    """Publishes the actor's weights as ``version`` the way the trainer does (collective: the
    bucketed, streamed publish of ``Trainer.publish``); rank 0 returns the timings once paramsync
    holds the version, the other ranks None. This is the one place the bench calls it."""
    from services.trainer.gather import published_items, weight_specs
    from services.trainer.trainer import stream_weights

    step_end = time.time()
    metrics = stream_weights(actor, gather, publisher, version, version)
    if publisher is None:
        return None
    publisher.drain(UPLOAD_TIMEOUT_S)
    record = publisher.records[-1]
    if not record.ok:
        raise RuntimeError(f"publishing version {version} to paramsync failed: {record.error}")
    model_bytes = sum(spec.num_bytes for spec in weight_specs(published_items(actor), gather.dtype))
    return PublishedVersion(
        version, step_end, metrics["timing/gather_s"], record.seconds, model_bytes, gather.bucket_bytes
    )


def perturb(actor: torch.nn.Module) -> None:
    """What an optimizer step changes: the trained parameters (with LoRA, the adapter's only)."""
    import torch

    with torch.no_grad():
        for param in actor.parameters():
            if param.requires_grad:
                param.add_(PERTURBATION)


async def _open_sink(address: str) -> Any:
    # gRPC asyncio channels belong to the loop that creates them: build it on the I/O loop.
    from services.paramsync.client import ParamSyncClient

    return ParamSyncClient(address)


class BenchLink:
    """Rank 0's line-delimited JSON connection to the bench."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=COMMAND_TIMEOUT_S)
        self._lines = self._sock.makefile("r")

    def send(self, message: dict[str, Any]) -> None:
        self._sock.sendall((json.dumps(message) + "\n").encode())

    def command(self) -> dict[str, Any]:
        line = self._lines.readline()
        if not line:
            raise ConnectionError("the bench closed the control connection")
        return json.loads(line)

    def close(self) -> None:
        self._lines.close()
        self._sock.close()


def run(model_dir: Path, control_port: int, lora_rank: int = 0) -> None:
    import torch

    from services.trainer import distributed as D
    from services.trainer import lora
    from services.trainer.config import ALL_LINEAR, TrainerSettings
    from services.trainer.links import IoThread, Publisher
    from services.trainer.model import load_actor, shard_model
    from services.trainer.trainer import publish_gather

    ctx = D.init_distributed("cpu")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    actor = load_actor(model_dir, ctx.device)
    if lora_rank:
        actor = lora.add_adapter(actor, lora.LoraSpec(lora_rank, LORA_ALPHA, ALL_LINEAR))
    actor = shard_model(actor, bf16=ctx.device.type == "cuda")
    # The trainer's publish as RELAYRL_TRAINER_* sets it (bucket size, rollout_dtype): the bench
    # measures the publish a run with those settings gets.
    gather = publish_gather(TrainerSettings(device=ctx.device.type), ctx.device)
    io = sink = link = publisher = None
    finished = False
    try:
        if ctx.is_main:
            link = BenchLink(control_port)
            link.send({"pid": os.getpid()})
            io = IoThread()
            sink = io.call(_open_sink(link.command()["paramsync"]))
            publisher = Publisher(io, sink)
        while not (command := D.broadcast_object(link.command() if link else None)).get("stop"):
            perturb(actor)
            published = publish_version(actor, gather, publisher, int(command["version"]))
            if link is not None and published is not None:
                link.send(asdict(published))
        finished = True
    finally:
        if link is not None:
            link.close()
        if io is not None:
            if sink is not None:
                io.call(sink.close(), timeout_s=30)
            io.stop()
        D.shutdown()
    if finished:
        D.exit_rank()


if __name__ == "__main__":
    run(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
