"""Typed asyncio client of the queue service, used by the trainer (consumer) and the rollout (producer).

It converts between the wire messages and :mod:`relayrl.schema` dataclasses, so callers
never touch protobuf. A failed call raises the :mod:`services.queue.errors` class of its status
(``QueueUnavailable`` when the queue or its Redis is down or did not answer in time, ``QueueFull``
for a push that found the queue full for its whole timeout, ``BadRequest``), never a gRPC error.

Each client instance is one consumer *session*: a restarted trainer (a new client) that pulls
under the same consumer name gets its own un-acknowledged entries re-delivered first.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypeVar

import grpc

from relayrl.schema import Group, PromptSpec
from relayrl.serving import grpc_channel
from relayrl.v1 import queue_pb2 as qpb
from relayrl.v1 import queue_pb2_grpc as qgrpc
from relayrl.v1 import trajectory_pb2 as tpb
from services.queue.errors import from_rpc_error
from services.queue.stats import PromptQueueStats, QueueStats, from_proto

Request = TypeVar("Request")
Reply = TypeVar("Reply")


@dataclass(frozen=True, slots=True)
class DeliveredGroup:
    """A trajectory group handed to the trainer; ack ``entry_id`` once its step is durable."""

    entry_id: str
    group: Group
    # 1 on first delivery; higher after a consumer restart or a reclaim from a dead consumer.
    delivery_count: int
    # consumer version − group's min policy version at delivery.
    age_versions: int

    @classmethod
    def from_proto(cls, d: qpb.DeliveredGroup) -> DeliveredGroup:
        return cls(d.entry_id, Group.from_proto(d.group), d.delivery_count, d.age_versions)


@dataclass(frozen=True, slots=True)
class PromptLease:
    """A prompt leased to one rollout replica until ``expires_at`` (unix seconds)."""

    lease_id: str
    prompt: PromptSpec
    expires_at: float
    # 1 on first lease; higher when the prompt was re-issued after an expired lease.
    delivery_count: int

    @classmethod
    def from_proto(cls, lease: qpb.Lease) -> PromptLease:
        return cls(lease.lease_id, PromptSpec.from_proto(lease.prompt), lease.expires_at_unix_s, lease.delivery_count)


@dataclass(frozen=True, slots=True)
class LeaseBatch:
    leases: list[PromptLease]
    # No lease came because the waiting prompts need a newer held_version than the one asked with.
    newer_version_waiting: bool


@dataclass
class QueueClient:
    """One channel to the queue service at ``address`` (``host:port``)."""

    address: str
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        self._channel = grpc_channel(self.address)
        self._trajectories = qgrpc.TrajectoryQueueStub(self._channel)
        self._prompts = qgrpc.PromptQueueStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> QueueClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # Trajectory queue -------------------------------------------------------------------

    async def push(self, groups: list[Group], timeout_s: float = 0.0) -> list[str]:
        """Stores ``groups`` (all or none) and returns their entry ids; waits up to ``timeout_s``
        (0: the server default) for capacity, then raises :class:`services.queue.errors.QueueFull`."""
        return await self.push_protos([g.to_proto() for g in groups], timeout_s)

    async def push_protos(self, groups: list[tpb.TrajectoryGroup], timeout_s: float = 0.0) -> list[str]:
        """:meth:`push` for callers that already hold ``TrajectoryGroup`` messages."""
        request = qpb.PushRequest(groups=groups, timeout_s=timeout_s)
        # The server bounds its own wait by timeout_s; the deadline only guards a dead server.
        reply = await _call(self._trajectories.Push, request, _deadline(timeout_s, default_s=600.0))
        return list(reply.entry_ids)

    async def pull(
        self,
        consumer: str,
        current_version: int,
        max_staleness: int,
        max_groups: int,
        block_timeout_s: float = 0.0,
        held: Sequence[str] | None = None,
    ) -> list[DeliveredGroup]:
        """Up to ``max_groups`` groups fresh for ``current_version`` under bound ``max_staleness``.

        Blocks up to ``block_timeout_s`` for the first group; returns ``[]`` when none came.
        ``held``: the entries this consumer holds unacknowledged, given when more are pending for it
        than that; the others are delivered again first (their replies were lost).
        """
        request = qpb.PullRequest(
            consumer=consumer,
            current_version=current_version,
            max_staleness=max_staleness,
            max_groups=max_groups,
            block_timeout_s=block_timeout_s,
            session_id=self.session_id,
            held=None if held is None else qpb.HeldEntries(entry_ids=held),
        )
        reply = await _call(self._trajectories.Pull, request, _deadline(block_timeout_s, default_s=60.0))
        return [DeliveredGroup.from_proto(d) for d in reply.groups]

    async def ack(self, consumer: str, entry_ids: list[str]) -> int:
        """Acknowledges entries whose training step is durable; returns how many were pending."""
        reply = await _call(self._trajectories.Ack, qpb.AckRequest(consumer=consumer, entry_ids=entry_ids), 60.0)
        return reply.acked

    async def stats(self) -> QueueStats:
        return from_proto(QueueStats, await _call(self._trajectories.Stats, qpb.StatsRequest(), 30.0))

    async def rollback(self, checkpoint_version: int, resumed_version: int) -> int:
        """Tells the queue the trainer resumed from ``checkpoint_version`` as ``resumed_version``; returns
        the waiting prompts held back until ``resumed_version``."""
        request = qpb.RollbackRequest(checkpoint_version=checkpoint_version, resumed_version=resumed_version)
        return (await _call(self._trajectories.Rollback, request, 30.0)).readmitted_prompts

    # Prompt queue -----------------------------------------------------------------------

    async def release(self, prompts: list[PromptSpec], release_id: str = "") -> int:
        """Makes ``prompts`` available for leasing; returns how many were released. A caller that
        retries a release passes the same ``release_id`` each time, so its prompts go out once."""
        request = qpb.ReleaseRequest(prompts=[p.to_proto() for p in prompts], release_id=release_id)
        return (await _call(self._prompts.Release, request, 60.0)).released

    async def lease(
        self, replica_id: str, max_prompts: int, held_version: int, block_timeout_s: float = 0.0
    ) -> list[PromptLease]:
        """Leases up to ``max_prompts`` prompts that may start at ``held_version``.

        Blocks up to ``block_timeout_s`` for the first one; returns ``[]`` when none came.
        """
        return (await self.lease_batch(replica_id, max_prompts, held_version, block_timeout_s)).leases

    async def lease_batch(
        self, replica_id: str, max_prompts: int, held_version: int, block_timeout_s: float = 0.0
    ) -> LeaseBatch:
        """As :meth:`lease`, and says whether it returned early because only prompts for a
        newer version wait (then ask again once the held version changed)."""
        request = qpb.LeaseRequest(
            replica_id=replica_id, max_prompts=max_prompts, held_version=held_version, block_timeout_s=block_timeout_s
        )
        reply = await _call(self._prompts.Lease, request, _deadline(block_timeout_s, default_s=60.0))
        return LeaseBatch([PromptLease.from_proto(lease) for lease in reply.leases], reply.newer_version_waiting)

    async def complete(self, replica_id: str, lease_ids: list[str]) -> int:
        """Marks leases done (their groups were pushed); returns how many prompts it finished."""
        request = qpb.CompleteRequest(replica_id=replica_id, lease_ids=lease_ids)
        return (await _call(self._prompts.Complete, request, 60.0)).completed

    async def renew(self, replica_id: str, lease_ids: list[str]) -> tuple[list[str], float]:
        """Extends the leases this replica still holds; returns (renewed lease ids, their new expiry)."""
        request = qpb.RenewRequest(replica_id=replica_id, lease_ids=lease_ids)
        reply = await _call(self._prompts.Renew, request, 60.0)
        return list(reply.renewed), reply.expires_at_unix_s

    async def abandon(
        self,
        replica_id: str,
        lease_ids: list[str],
        reason: str,
        min_start_version: int = 0,
        all_held: bool = False,
        keep_lease_ids: Sequence[str] = (),
    ) -> tuple[list[str], list[str]]:
        """Gives leases back for leasing again now (with ``all_held``, every one ``replica_id`` holds
        but ``keep_lease_ids``); returns (requeued lease ids, dropped lease ids)."""
        request = qpb.AbandonRequest(
            replica_id=replica_id,
            lease_ids=lease_ids,
            reason=reason,
            min_start_version=min_start_version,
            all_held=all_held,
            keep_lease_ids=keep_lease_ids,
        )
        reply = await _call(self._prompts.Abandon, request, 60.0)
        return list(reply.requeued), list(reply.dropped)

    async def prompt_stats(self) -> PromptQueueStats:
        return from_proto(PromptQueueStats, await _call(self._prompts.Stats, qpb.PromptStatsRequest(), 30.0))


async def _call(method: Callable[..., Awaitable[Reply]], request: Request, timeout_s: float) -> Reply:
    """One RPC, its failure raised as the queue error of its status: the one place the client translates."""
    try:
        return await method(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err) from err


def _deadline(wait_s: float, default_s: float) -> float:
    # The server may legitimately wait `wait_s`; give it room before declaring it dead.
    return (wait_s if wait_s > 0 else default_s) + 30.0
