"""``distributed``: paramsync broadcasts each version into the engines over torch.distributed.

Per delivery, paramsync forms a process group with itself as rank 0 (it holds the version the
trainer uploaded once) and the engines as ranks ``1..n`` via SGLang's
``/init_weights_update_group``, then sends the tensors in buckets of about ``dist_bucket_bytes``:
for each bucket one ``/update_weights_from_distributed`` call per engine (names, dtypes,
shapes) matched by one ``broadcast`` per tensor. The group is destroyed afterwards
(``/destroy_weights_update_group``), so a replica set that changes between versions just forms
a different group next time. Backend: gloo on CPU, NCCL on GPUs.

Replicas whose engines do not answer ``/health`` are left out of the round and retried with
backoff (``max_sync_retries``, ``sync_retry_delay``); every round is bounded by ``sync_timeout``.
A replica still missing the version after its retries is marked lagging; the others have it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from relayrl.net import free_port
from relayrl.retry import retrying
from services.engine.client import EngineClient
from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.errors import sync_retry_policy
from services.paramsync.manifest import Announcement, TensorSpec
from services.paramsync.store import StoredVersion
from services.paramsync.table import VersionTable
from services.paramsync.transports.base import WeightTransport

log = logging.getLogger(__name__)


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


class RoundIncomplete(Exception):
    """A broadcast round left replicas behind the version: another round is due."""


def _incomplete(exc: BaseException) -> bool:
    return isinstance(exc, RoundIncomplete)


@dataclass(eq=False)
class DistributedTransport(WeightTransport):
    name = "distributed"
    pushes = True

    table: VersionTable
    master_addr: str
    master_port: int
    backend: str
    bucket_bytes: int
    sync_timeout: float
    max_sync_retries: int
    sync_retry_delay: float
    _rounds: int = field(default=0, init=False)

    async def deliver(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> Announcement:
        pending = self._behind(stored, [r for r in replicas if r.engine_url])
        policy = sync_retry_policy(self.max_sync_retries, self.sync_retry_delay)
        with contextlib.suppress(RoundIncomplete):
            async for attempt in retrying(f"broadcast of version {stored.version}", _incomplete, policy, log):
                with attempt:
                    if pending:
                        await self._round(stored, pending)
                        pending = self._behind(stored, pending)
                    if pending:
                        raise RoundIncomplete(f"{len(pending)} replica(s) still behind")
        for replica in pending:
            self.table.mark_lagging(
                replica.replica_id, "retries_exhausted", f"version {stored.version} not delivered after retries"
            )
        return self.announcement(stored)

    def _behind(self, stored: StoredVersion, replicas: Sequence[ReplicaEndpoint]) -> list[ReplicaEndpoint]:
        return [r for r in replicas if self.table.version_of(r.replica_id) < stored.version]

    async def _round(self, stored: StoredVersion, replicas: list[ReplicaEndpoint]) -> None:
        clients = {r.replica_id: EngineClient(r.engine_url, timeout=self.sync_timeout, retries=0) for r in replicas}
        try:
            healthy = []
            answers = await asyncio.gather(*(c.health() for c in clients.values()))
            for replica, ok in zip(replicas, answers, strict=True):
                if ok:
                    healthy.append(replica)
                else:
                    self.table.record_failure(replica.replica_id, "unreachable", f"{replica.engine_url}/health failed")
            if not healthy:
                return
            started = time.perf_counter()
            try:
                await self._broadcast(stored, [clients[r.replica_id] for r in healthy])
            except Exception as exc:  # any failure of the collective fails the round for all its members
                log.warning("broadcast of version %d failed: %s", stored.version, exc)
                for replica in healthy:
                    self.table.record_failure(replica.replica_id, "broadcast", str(exc)[:500])
                return
            elapsed = time.perf_counter() - started
            log.info("version %d broadcast to %d engine(s) in %.2fs", stored.version, len(healthy), elapsed)
            for replica in healthy:
                self.table.record_success(replica.replica_id, stored.version, elapsed)
            self.table.metrics.bytes_sent.labels(self.name).inc(stored.manifest.total_bytes * len(healthy))
        finally:
            await asyncio.gather(*(c.aclose() for c in clients.values()))

    async def _broadcast(self, stored: StoredVersion, engines: list[EngineClient]) -> None:
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
                timeout=timedelta(seconds=self.sync_timeout),
            )
            for result in await asyncio.gather(*joins):
                if not result.success:
                    raise RuntimeError(f"an engine could not join the update group: {result.message}")
            for bucket in buckets(stored, self.bucket_bytes):
                await self._send_bucket(stored, bucket, engines, group)
        finally:
            for task in joins:
                task.cancel()
            if dist.is_initialized():
                await asyncio.to_thread(dist.destroy_process_group)
            await asyncio.gather(*(e.destroy_weights_update_group(group) for e in engines), return_exceptions=True)

    async def _send_bucket(
        self, stored: StoredVersion, bucket: list[tuple[TensorSpec, int]], engines: list[EngineClient], group: str
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
