"""The actor's full weights, gathered bucket by bucket for a publish (collective on every rank).

verl's FSDP weight sync gathers one bucket of parameters at a time (its
``update_weights_bucket_megabytes``) instead of the whole state dict, so no rank ever holds a
second full copy of the model. Here every rank walks the sharded state dict in the same order and
all-gathers each tensor (``DTensor.full_tensor``) where the weights live, with the process group's
own device (NCCL: the GPU; gloo: the CPU). Rank 0 casts each bucket to the rollout's dtype there
(``rollout_dtype``: the engine loads what it is sent, bf16 on a GPU), copies it once to host memory
(:mod:`services.trainer.staging`: pinned and overlapped with the next bucket's gather on CUDA) and
hands it on as private CPU tensors; the other ranks drop theirs at once.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator

import torch

from services.paramsync.manifest import TensorSpec
from services.paramsync.tensors import open_spec
from services.trainer import distributed as D
from services.trainer import lora
from services.trainer.host_gather import HostGather, buffer_bytes
from services.trainer.rows import Rows
from services.trainer.staging import Gathered, HostStaging, Staged, SyncStaging

Items = list[tuple[str, torch.Tensor]]


def state_items(actor: torch.nn.Module) -> Items:
    """The whole state dict, tied names included: what a model directory holds."""
    return list(actor.state_dict().items())


def published_items(actor: torch.nn.Module) -> Items:
    """What a version holds: the state dict with each tensor once. A tied tensor (Qwen2.5's
    lm_head, which is the embedding) is one parameter under two names; the engine's model ties
    it the same way, so sending it twice would only add its bytes again (27 % of the 0.5B
    shape). ``named_parameters`` lists a shared parameter under its first name only.

    With LoRA a version is the adapter alone, in peft's names (``lora.adapter_items``): the
    engines keep the base weights they loaded, and only the adapter ever changes."""
    if lora.is_peft(actor):
        return lora.adapter_items(actor)
    listed = {name for name, _ in actor.named_parameters()}
    aliases = {name for name, _ in actor.named_parameters(remove_duplicate=False)} - listed
    return [(name, t) for name, t in state_items(actor) if name not in aliases]


def published_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype ``tensor`` is published in: ``dtype`` (the rollout's) for floating-point weights,
    its own otherwise (integer buffers, or no cast asked for)."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def weight_specs(items: Items, dtype: torch.dtype | None = None) -> list[TensorSpec]:
    """Every tensor's name, dtype (as published, see :func:`published_dtype`) and full shape,
    known before anything is gathered."""
    specs = []
    for name, t in items:
        cast = published_dtype(t, dtype)
        spec = open_spec(name, t)
        if cast != t.dtype:
            spec = TensorSpec(name, str(cast).removeprefix("torch."), spec.shape, t.numel() * cast.itemsize, "")
        specs.append(spec)
    return specs


class BucketGather:
    """Gathers the actor's full tensors in buckets of about ``bucket_bytes`` and keeps count of the
    gathered bytes alive on rank 0 (``peak_live_bytes``: what publishing costs in memory there).

    With ``share_host_memory`` (a CPU trainer), row-sharded tensors are gathered through memory
    the ranks share when they all run on one host (:class:`~services.trainer.host_gather.HostGather`,
    found at the first gather), else by an all-gather. ``staging`` copies each of rank 0's buckets to
    the host (default: at once, for weights on the CPU). With ``dtype`` (the rollout's, for a
    publish), rank 0 casts each gathered floating-point tensor where it was gathered, before the
    copy to the host, which then moves (and the upload sends) the cast bytes only; buckets are still
    sized by the gathered bytes.
    """

    def __init__(
        self,
        bucket_bytes: int,
        share_host_memory: bool = False,
        staging: HostStaging | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self.share_host_memory = share_host_memory
        self.staging = staging if staging is not None else SyncStaging()
        self.dtype = dtype
        self._host: HostGather | None = None
        self._lock = threading.Lock()
        self.live_bytes = 0
        self.peak_live_bytes = 0

    def _track(self, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            self.live_bytes += nbytes
            self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        weakref.finalize(tensor, self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.live_bytes -= nbytes

    @property
    def shares_host_memory(self) -> bool:
        """Whether gathers go through shared memory (known after the first gather)."""
        return self._host is not None

    def buckets(
        self, items: Items, on_gathered: Callable[[list[torch.Tensor]], None] | None = None
    ) -> Iterator[list[torch.Tensor]]:
        """Yields rank 0's buckets of the full CPU tensors of ``items``, in order (empty lists elsewhere),
        each of at most ``bucket_bytes``: a larger tensor comes as row ranges, each in its own bucket.

        Collective: every rank must drain the iterator. Nothing else writes a bucket's tensors while
        they live, because training goes on while the upload reads them: they are private copies,
        or views of a shared buffer that is not reused before the last of them is gone. A bucket's
        FSDP2 shards travel in one gather: one per tensor (``DTensor.full_tensor``) cost a
        collective's fixed latency each, most of a small model's publish. With a staging of depth
        1 (CUDA) a bucket is yielded once the next one's gather is queued, so its copy to the host
        overlaps that gather; rank 0 then holds up to three buckets on the host, not two.

        ``on_gathered`` sees each of rank 0's buckets where it was gathered (cast), in order, before
        its copy to the host is queued (a version shared by handle copies it into its slot there).
        """
        if self.share_host_memory and self._host is None:
            self.share_host_memory = False  # one try: the answer holds for the job's life
            self._host = HostGather.connect()
        parts: list[list[tuple[Rows, bool]]] = [[]]
        size = 0
        for _, tensor in items:
            row_sharded = _row_sharded(tensor)
            whole = Rows.whole(tensor)
            # A tensor larger than a bucket goes by row ranges, each its own bucket: rank 0 then
            # never holds more than a bucket of it. Only row-sharded and plain tensors can.
            splittable = tensor.dim() > 0 and (row_sharded or not hasattr(tensor, "full_tensor"))
            pieces = whole.split(self.bucket_bytes) if splittable and whole.nbytes > self.bucket_bytes else [whole]
            for piece in pieces:
                # No bucket holds more than bucket_bytes (but a larger tensor that cannot be split);
                # a tensor without bytes joins the bucket before it, so no bucket is bytes-free.
                if size + piece.nbytes > self.bucket_bytes and piece.nbytes and parts[-1]:
                    parts.append([])
                    size = 0
                parts[-1].append((piece, row_sharded))
                size += piece.nbytes
        # Every bucket's shared buffer the size of the largest: one set of buffers serves them all.
        capacity = max(buffer_bytes([r for r, rows in part if rows]) for part in parts) if self._host is not None else 0
        # Buckets whose host copy is under way while the next is gathered (none where staging is at once).
        in_flight: list[Staged] = []
        for part in [p for p in parts if p]:
            gathered = self._gather(part, capacity)
            if on_gathered is not None and D.get_rank() == 0:
                on_gathered([g.tensor for g in gathered])
            staged = self.staging.stage(gathered) if D.get_rank() == 0 else Staged([])
            for tensor in staged.tensors:
                self._track(tensor)
            in_flight.append(staged)
            if len(in_flight) > self.staging.depth:
                yield in_flight.pop(0).wait()
        while in_flight:
            yield in_flight.pop(0).wait()

    def _gather(self, bucket: list[tuple[Rows, bool]], capacity: int) -> list[Gathered]:
        is_main = D.get_rank() == 0
        sharded = [r for r, rows in bucket if rows]
        shared = self._host.gather(sharded, capacity) if sharded and self._host is not None else None
        if not sharded:
            rows: Iterator[torch.Tensor] = iter(())
        elif shared is not None:
            rows = iter(shared)
        else:
            rows = iter(_all_gather_rows(sharded))
        kept: list[Gathered] = []
        for part, row_sharded in bucket:
            tensor = part.tensor
            if row_sharded:
                if not is_main:
                    continue
                full = next(rows)
            elif hasattr(tensor, "full_tensor"):
                full = tensor.full_tensor()
            else:
                full = tensor if part.is_whole else tensor[part.start : part.stop]
            if is_main:
                # Gathered bytes are new memory already; a plain tensor (or its rows) is the live parameter.
                private = (row_sharded or hasattr(tensor, "full_tensor")) and full is not tensor
                cast = published_dtype(full, self.dtype)
                if cast != full.dtype:
                    # On the gathering device: the host copy moves the cast bytes, and a cast is new memory.
                    full, private = full.to(cast), True
                kept.append(Gathered(full, private))
        return kept


def _row_sharded(tensor: torch.Tensor) -> bool:
    """An FSDP2 parameter: a DTensor split by rows over a 1-D mesh."""
    from torch.distributed.tensor import DTensor, Shard

    return (
        isinstance(tensor, DTensor)
        and tensor.device_mesh.ndim == 1
        and tuple(tensor.placements) == (Shard(0),)
        and tensor.dim() > 0
    )


def _all_gather_rows(parts: list[Rows]) -> list[torch.Tensor]:
    """The full rows of row ranges of row-sharded DTensors of one mesh, through one all-gather of
    their bytes. Each rank pads its rows of a range (:meth:`Rows.own`) to the most any rank can
    hold of it, so every rank sends the same bytes."""
    import torch.distributed as dist

    mesh = parts[0].tensor.device_mesh
    world, group = mesh.size(), mesh.get_group()
    rank = mesh.get_local_rank()
    layout = []  # (offset in the padded buffer, padded bytes per rank)
    offset = 0
    for part in parts:
        padded = min(part.rows_per_rank(world), part.stop - part.start) * part.row_bytes
        layout.append((offset, padded))
        offset += padded
    # The group's own device: NCCL moves GPU memory only, gloo host memory.
    nccl = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    send = torch.zeros(offset, dtype=torch.uint8, device=device)
    for part, (start, _) in zip(parts, layout, strict=True):
        local, _, count = part.own(rank, world)
        shard = part.tensor.to_local().detach().to(device).contiguous().view(torch.uint8).reshape(-1)
        mine = shard[local * part.row_bytes : (local + count) * part.row_bytes]
        send[start : start + mine.numel()] = mine
    received = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(received, send, group=group)
    full = []
    for part, (start, _) in zip(parts, layout, strict=True):
        pieces = [received[r][start : start + part.own(r, world)[2] * part.row_bytes] for r in range(world)]
        full.append(torch.cat(pieces).view(part.tensor.dtype).reshape(part.shape))
    return full
