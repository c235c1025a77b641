"""gRPC servicers of TrajectoryQueue and PromptQueue: wire messages in, store calls, status codes out.

Bad arguments → INVALID_ARGUMENT, full queue → RESOURCE_EXHAUSTED, Redis down →
UNAVAILABLE (the caller retries); no request can take the service down.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from relayrl.v1 import queue_pb2 as qpb
from relayrl.v1 import queue_pb2_grpc as qgrpc
from services.queue.errors import BadRequest, QueueError, QueueUnavailable
from services.queue.metrics import QueueMetrics
from services.queue.prompts import PromptQueue
from services.queue.trajectories import PullResult, TrajectoryQueue
from services.queue.wire import RawPushRequest

log = logging.getLogger(__name__)

R = TypeVar("R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[R]]


def _status_mapped(handler: Handler[R]) -> Handler[R]:
    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await handler(self, request, context)
        except QueueError as err:
            await context.abort(err.code, err.details)
        except (RedisConnectionError, RedisTimeoutError, OSError) as err:
            log.warning("%s: Redis unavailable: %s", handler.__name__, err)
            await context.abort(QueueUnavailable.code, f"Redis unavailable: {err}")
        except ResponseError as err:
            # A Redis key of the wrong type or a refused command: an operator problem, not the caller's.
            log.error("%s: Redis refused a command: %s", handler.__name__, err)
            await context.abort(grpc.StatusCode.INTERNAL, f"Redis refused a command: {err}")
        raise AssertionError("context.abort returns only by raising")

    return wrapper


class TrajectoryQueueServicer(qgrpc.TrajectoryQueueServicer):
    def __init__(self, store: TrajectoryQueue, metrics: QueueMetrics) -> None:
        self._store = store
        self._metrics = metrics

    @_status_mapped
    async def Push(self, request: RawPushRequest | ValueError, context: grpc.aio.ServicerContext) -> qpb.PushResponse:
        if isinstance(request, ValueError):
            raise BadRequest(f"PushRequest does not decode: {request}")
        started = time.perf_counter()
        ids = await self._store.push(request.groups, request.timeout_s)
        self._metrics.push_latency.observe(time.perf_counter() - started)
        return qpb.PushResponse(entry_ids=ids)

    @_status_mapped
    async def Pull(self, request: qpb.PullRequest, context: grpc.aio.ServicerContext) -> PullResult:
        started = time.perf_counter()
        pulling = asyncio.ensure_future(
            self._store.pull(
                consumer=request.consumer,
                session_id=request.session_id,
                current_version=request.current_version,
                max_staleness=request.max_staleness,
                max_groups=request.max_groups,
                block_timeout_s=request.block_timeout_s,
                held=list(request.held.entry_ids) if request.HasField("held") else None,
            )
        )
        try:
            # Shielded: a caller that gives up must not interrupt a Redis read half done.
            result = await asyncio.shield(pulling)
        except asyncio.CancelledError:
            pulling.add_done_callback(functools.partial(self._give_back, request.consumer))
            raise
        # Entries read but never received would stay pending on a live consumer for good.
        context.add_done_callback(
            lambda ctx: self._store.not_received(request.consumer, result.deliveries) if ctx.cancelled() else None
        )
        self._metrics.pull_latency.observe(time.perf_counter() - started)
        return result

    def _give_back(self, consumer: str, pulling: asyncio.Future[PullResult]) -> None:
        if not pulling.cancelled() and pulling.exception() is None:
            self._store.not_received(consumer, pulling.result().deliveries)

    @_status_mapped
    async def Ack(self, request: qpb.AckRequest, context: grpc.aio.ServicerContext) -> qpb.AckResponse:
        return qpb.AckResponse(acked=await self._store.ack(request.consumer, list(request.entry_ids)))

    @_status_mapped
    async def Rollback(self, request: qpb.RollbackRequest, context: grpc.aio.ServicerContext) -> qpb.RollbackResponse:
        readmitted = await self._store.rollback(request.checkpoint_version, request.resumed_version)
        return qpb.RollbackResponse(readmitted_prompts=readmitted)

    @_status_mapped
    async def Stats(self, request: qpb.StatsRequest, context: grpc.aio.ServicerContext) -> qpb.QueueStats:
        s = await self._store.stats()
        return qpb.QueueStats(
            queue_size=s.queue_size,
            total_produced=s.total_produced,
            total_consumed=s.total_consumed,
            dropped_by_reason=s.dropped_by_reason,
            pending=s.pending,
            capacity=s.capacity,
            avg_sample_age_versions=s.ages.avg_versions,
            max_sample_age_versions=s.ages.max_versions,
            avg_sample_age_s=s.ages.avg_s,
            max_sample_age_s=s.ages.max_s,
            stale_samples_ratio=s.stale_samples_ratio,
            consumer_lag=s.queue_size,
            generated_long_threshold_tokens=s.lengths.long_threshold_tokens,
            generated_long_token_share=s.lengths.long_token_share,
            duplicate_groups=s.duplicates,
        )


class PromptQueueServicer(qgrpc.PromptQueueServicer):
    def __init__(self, store: PromptQueue) -> None:
        self._store = store

    @_status_mapped
    async def Release(self, request: qpb.ReleaseRequest, context: grpc.aio.ServicerContext) -> qpb.ReleaseResponse:
        return qpb.ReleaseResponse(released=await self._store.release(list(request.prompts), request.release_id))

    @_status_mapped
    async def Lease(self, request: qpb.LeaseRequest, context: grpc.aio.ServicerContext) -> qpb.LeaseResponse:
        outcome = await self._store.lease(
            request.replica_id, request.max_prompts, request.held_version, request.block_timeout_s
        )
        return qpb.LeaseResponse(
            newer_version_waiting=outcome.newer_version_waiting,
            leases=[
                qpb.Lease(
                    lease_id=g.lease_id,
                    prompt=g.prompt,
                    expires_at_unix_s=g.expires_at_unix_s,
                    delivery_count=g.delivery_count,
                )
                for g in outcome.grants
            ],
        )

    @_status_mapped
    async def Complete(self, request: qpb.CompleteRequest, context: grpc.aio.ServicerContext) -> qpb.CompleteResponse:
        return qpb.CompleteResponse(completed=await self._store.complete(request.replica_id, list(request.lease_ids)))

    @_status_mapped
    async def Renew(self, request: qpb.RenewRequest, context: grpc.aio.ServicerContext) -> qpb.RenewResponse:
        renewed, expires = await self._store.renew(request.replica_id, list(request.lease_ids))
        return qpb.RenewResponse(renewed=renewed, expires_at_unix_s=expires)

    @_status_mapped
    async def Abandon(self, request: qpb.AbandonRequest, context: grpc.aio.ServicerContext) -> qpb.AbandonResponse:
        requeued, dropped = await self._store.abandon(
            request.replica_id,
            list(request.lease_ids),
            request.reason,
            request.min_start_version,
            request.all_held,
            list(request.keep_lease_ids),
        )
        return qpb.AbandonResponse(requeued=requeued, dropped=dropped)

    @_status_mapped
    async def Stats(self, request: qpb.PromptStatsRequest, context: grpc.aio.ServicerContext) -> qpb.PromptQueueStats:
        return (await self._store.stats()).to_proto()
