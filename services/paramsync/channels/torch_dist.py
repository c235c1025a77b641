"""``torch_dist``: a version broadcast over torch.distributed into engines, SGLang's way.

The sending end (:class:`TorchDistSender`, paramsync) forms a process group with itself as rank
0 (it holds the version the trainer uploaded once) and the engines as ranks ``1..n`` via their
``/init_weights_update_group``, then sends the tensors in buckets of about ``bucket_bytes``: for
each bucket one ``/update_weights_from_distributed`` call per engine (names, dtypes, shapes)
matched by one ``broadcast`` per tensor. The group is destroyed afterwards
(``/destroy_weights_update_group``), so a replica set that changes between versions just forms a
different group next time. Backend: gloo on CPU, NCCL on GPUs.

The sending end reaches each engine over SGLang's HTTP API (:class:`EngineGroupLink`: those
three calls and ``/health``, the wire format the engine serves), so paramsync needs nothing of
the engine's code. The receiving end is behind those calls: SGLang's own, or the built-in
engine's :class:`TorchDistReceiver`, which joins the group and receives one broadcast per tensor
in the order the call names.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import httpx

from relayrl import http_client
from relayrl.net import free_port
from services.paramsync.manifest import TensorSpec
from services.paramsync.store import StoredVersion

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True)
class GroupCallResult:
    """SGLang's answer to a weight-update-group call: ``{"success", "message"}``."""

    success: bool
    message: str


class EngineGroupLink:
    """The sending end's control link to one engine at ``base_url``: ``/health`` and the three
    weight-update-group calls, each bounded by ``timeout_s`` and sent once (a collective must not
    be entered twice, and a failed round is retried whole by the delivery)."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._http = http_client.async_client(base_url=self.base_url, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> bool:
        try:
            response = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def _call(self, path: str, body: dict[str, Any]) -> GroupCallResult:
        response = await self._http.post(path, json=body)
        try:
            payload = response.json()
            return GroupCallResult(bool(payload["success"]), str(payload.get("message", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(
                f"POST {self.base_url}{path} -> {response.status_code}, not SGLang's answer: {response.text[:200]}"
            ) from exc

    async def init_weights_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> GroupCallResult:
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self._call("/init_weights_update_group", body)

    async def update_weights_from_distributed(
        self,
        names: Sequence[str],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        group_name: str,
        weight_version: int,
    ) -> GroupCallResult:
        body = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(s) for s in shapes],
            "group_name": group_name,
            "flush_cache": True,
            "abort_all_requests": False,
            "weight_version": str(weight_version),
        }
        return await self._call("/update_weights_from_distributed", body)

    async def destroy_weights_update_group(self, group_name: str) -> GroupCallResult:
        return await self._call("/destroy_weights_update_group", {"group_name": group_name})


def buckets(stored: StoredVersion, bucket_bytes: int) -> Iterator[list[tuple[TensorSpec, int]]]:
    """Groups (spec, offset) pairs in manifest order into runs of about ``bucket_bytes``."""
    bucket: list[tuple[TensorSpec, int]] = []
    size = 0
    for spec, offset in zip(stored.manifest.tensors, stored.manifest.offsets(), strict=True):
        if bucket and size + spec.num_bytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((spec, offset))
        size += spec.num_bytes
    if bucket:
        yield bucket


@dataclass(eq=False)
class TorchDistSender:
    """Paramsync's end: rank 0 of one process group per round, at ``master_addr:master_port``
    (0: a free port each round); every step of a round is bounded by ``timeout_s``."""

    master_addr: str
    master_port: int
    backend: str
    bucket_bytes: int
    timeout_s: float
    _rounds: int = field(default=0, init=False)

    async def send(self, stored: StoredVersion, engines: list[EngineGroupLink]) -> None:
        """Broadcasts ``stored`` into ``engines`` in one new process group; raises if any step fails."""
        import torch.distributed as dist

        self._rounds += 1
        group = f"relayrl-paramsync-{stored.version}-{self._rounds}"
        port = self.master_port or free_port(self.master_addr)
        world = len(engines) + 1
        joins = [
            asyncio.create_task(e.init_weights_update_group(self.master_addr, port, i + 1, world, group, self.backend))
            for i, e in enumerate(engines)
        ]
        try:
            await asyncio.to_thread(
                dist.init_process_group,
                backend=self.backend,
                init_method=f"tcp://{self.master_addr}:{port}",
                world_size=world,
                rank=0,
                timeout=timedelta(seconds=self.timeout_s),
            )
            for result in await asyncio.gather(*joins):
                if not result.success:
                    raise RuntimeError(f"an engine could not join the update group: {result.message}")
            for bucket in buckets(stored, self.bucket_bytes):
                await _send_bucket(stored, bucket, engines, group)
        finally:
            for task in joins:
                task.cancel()
            if dist.is_initialized():
                await asyncio.to_thread(dist.destroy_process_group)
            await asyncio.gather(*(e.destroy_weights_update_group(group) for e in engines), return_exceptions=True)


async def _send_bucket(
    stored: StoredVersion, bucket: list[tuple[TensorSpec, int]], engines: list[EngineGroupLink], group: str
) -> None:
    import torch
    import torch.distributed as dist

    names = [spec.name for spec, _ in bucket]
    dtypes = [spec.dtype for spec, _ in bucket]
    shapes = [list(spec.shape) for spec, _ in bucket]
    # Views into the stored bytes: the broadcast reads them in place, nothing is copied.
    tensors = [
        torch.frombuffer(stored.data, dtype=torch.uint8, count=spec.num_bytes, offset=offset)
        .view(getattr(torch, spec.dtype))
        .reshape(spec.shape)
        if spec.num_bytes
        else torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
        for spec, offset in bucket
    ]
    calls = [
        asyncio.create_task(
            e.update_weights_from_distributed(names, dtypes, shapes, group, weight_version=stored.version)
        )
        for e in engines
    ]

    def send() -> None:
        for tensor in tensors:
            dist.broadcast(tensor, src=0)

    try:
        await asyncio.to_thread(send)
        for result in await asyncio.gather(*calls):
            if not result.success:
                raise RuntimeError(f"an engine refused the update: {result.message}")
    finally:
        for task in calls:
            task.cancel()


# --- the engine's end ------------------------------------------------------------------------


def _dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


class TorchDistReceiver:
    """The engine's end of a weight-update process group, behind its ``/init_weights_update_group``,
    ``/update_weights_from_distributed`` and ``/destroy_weights_update_group``.

    It joins through the process's default group (rendezvous over TCP at
    ``master_address:master_port``, as rank ``rank_offset`` of ``world_size``), so an engine serves
    one update group at a time. Only gloo: the built-in engine runs on CPU.
    """

    def __init__(self) -> None:
        self.group_name: str | None = None
        self._lock = threading.Lock()

    def init_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        import torch.distributed as dist

        with self._lock:
            if self.group_name is not None:
                raise ValueError(f"weight update group {self.group_name!r} already exists; destroy it first")
            if backend != "gloo":
                raise ValueError(f"the CPU engine supports backend 'gloo' only, got {backend!r}")
            dist.init_process_group(
                backend=backend,
                init_method=f"tcp://{master_address}:{master_port}",
                world_size=world_size,
                rank=rank_offset,
                timeout=timedelta(seconds=120),
            )
            self.group_name = group_name

    def receive(
        self, group_name: str, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]]
    ) -> dict[str, torch.Tensor]:
        """Receives one broadcast from rank 0 per name, in order."""
        import torch
        import torch.distributed as dist

        if self.group_name != group_name:
            raise ValueError(f"no weight update group {group_name!r} (have {self.group_name!r})")
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError(f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}")
        buffers = {
            name: torch.empty(tuple(shape), dtype=_dtype(dtype))
            for name, dtype, shape in zip(names, dtypes, shapes, strict=True)
        }
        for name in names:
            dist.broadcast(buffers[name], src=0)
        return buffers

    def destroy(self, group_name: str) -> None:
        import torch.distributed as dist

        with self._lock:
            if self.group_name != group_name:
                raise ValueError(f"no weight update group {group_name!r} (have {self.group_name!r})")
            dist.destroy_process_group()
            self.group_name = None
