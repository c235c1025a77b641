"""``push`` delivery (transport ``distributed``): paramsync broadcasts each version into the
engines (:mod:`services.paramsync.channels.torch_dist`) and records each replica's outcome.

Replicas whose engines do not answer ``/health`` are left out of the round and retried with
backoff (``max_sync_retries``, ``sync_retry_delay``); every round is bounded by ``sync_timeout``.
A replica still missing the version after its retries is marked lagging; the others have it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from relayrl.retry import retrying
from services.paramsync.channels.torch_dist import EngineGroupLink, TorchDistSender
from services.paramsync.delivery.base import Delivery
from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.errors import sync_retry_policy
from services.paramsync.manifest import Announcement
from services.paramsync.store import StoredVersion
from services.paramsync.table import VersionTable

log = logging.getLogger(__name__)


class RoundIncomplete(Exception):
    """A broadcast round left replicas behind the version: another round is due."""


def _incomplete(exc: BaseException) -> bool:
    return isinstance(exc, RoundIncomplete)


@dataclass(eq=False)
class PushDelivery(Delivery):
    """Paramsync loads each version into every known engine itself, over the ``torch_dist`` channel."""

    name = "distributed"
    mode = "push"
    channels = ("torch_dist",)

    table: VersionTable
    sender: TorchDistSender
    sync_timeout: float
    max_sync_retries: int
    sync_retry_delay: float

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
        clients = {r.replica_id: EngineGroupLink(r.engine_url, self.sync_timeout) for r in replicas}
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
                await self.sender.send(stored, [clients[r.replica_id] for r in healthy])
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
