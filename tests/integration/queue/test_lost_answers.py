"""A Redis SIGKILL right after a replica's call was carried out and before its answer came back.

A push (issue #52's chaos run): the push stored the group, the ``complete`` after it failed while
Redis restarted, the replica gave the lease back (as ``RolloutLoop.process`` does after a failed
delivery), and the prompt was generated a second time. Its second group was one more than the
trainer released for; since the trainer makes up for every drop, that surplus never drained and
came back as stale drops at every step for the rest of the run (649 of 5,398 groups). The push now
completes the prompt in the transaction that stores the group (the replica makes no ``complete``
call of its own), and stores no group for a prompt finished already.

A release: the trainer sent it again, and its prompts went out twice, a surplus of the same kind.
A release now carries an id, and a release id stored already stores nothing again.

An OpenAI agent's group (pushed without a lease): the endpoint pushed it again, and the
trainer could take both copies into its buffer and train on the group twice. A group pushed
without a lease is now stored once per group id.

A lease: the prompts it took stayed leased to a replica that never heard of them, until the
queue's lease timeout (600 s by default) re-issued them; a trainer that needed them waited as
long. A replica whose lease call failed now gives back, before it leases again, every lease the
queue counts as its own but it does not hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from relayrl import http_client
from relayrl.redis_process import RedisProcess
from relayrl.retry import RetryPolicy, any_error, call_with_retries
from relayrl.schema import Group, PromptSpec, Sample
from relayrl.stalls import StallWatch
from services.queue.client import PromptLease, QueueClient
from services.queue.config import QueueSettings
from services.queue.errors import QueueUnavailable
from services.queue.server import QueueServer, start_queue_server
from services.rollout.leases import LeaseKeeper, ReplicaQueue
from services.rollout.metrics import RolloutMetrics
from services.rollout.state import ReplicaState
from services.trainer.links import IoThread
from tests.waiting import wait_until_async

from .helpers import trainer_feed

REPLICA = "replica-0"
log = logging.getLogger(__name__)


class AnswerLostWithRedis:
    """The replica's queue, with redis-server SIGKILLed once right after the first call of ``method``
    was carried out: its answer never reaches the replica, which sees the queue unavailable. With
    ``restart``, Redis is back at once (from its append-only file)."""

    def __init__(self, client: QueueClient, redis: RedisProcess, method: str, restart: bool = False) -> None:
        self._client = client
        self._redis = redis
        self._method = method
        self._restart = restart
        self.killed = False

    def __getattr__(self, name: str) -> object:
        call = getattr(self._client, name)
        if name != self._method:
            return call

        async def answer_lost(*args: object, **kwargs: object) -> object:
            answer = await call(*args, **kwargs)
            if self.killed:
                return answer
            self.killed = True
            self._redis.kill()
            if self._restart:
                self._redis.start()
            raise QueueUnavailable(f"redis-server was killed before the {name}'s answer came back")

        return answer_lost


def _prompt(i: int) -> PromptSpec:
    return PromptSpec(prompt_id=f"lost/{i}", prompt_token_ids=[5 + i, 6, 7], n_samples=2, max_staleness=1)


def _group(lease: PromptLease) -> Group:
    sample = Sample(
        prompt_token_ids=[1, 2],
        response_token_ids=[3, 4],
        behavior_logprobs=[-0.5] * 2,
        policy_versions=[0] * 2,
        reward=1.0,
    )
    return Group.answering(lease.prompt, [sample, sample], lease.lease_id)


def _keeper(queue: ReplicaQueue) -> LeaseKeeper:
    metrics = RolloutMetrics()
    stalls = StallWatch(metrics.stalled, 60.0, log)
    state = ReplicaState(REPLICA, metrics)
    state.set_engine_ready(True)
    return LeaseKeeper(state, queue, metrics, stalls, block_timeout_s=0.0, push_timeout_s=5.0)


@contextlib.asynccontextmanager
async def queue_on_own_redis(
    tmp_path: Path, run_id: str, **settings: Any
) -> AsyncIterator[tuple[RedisProcess, QueueServer]]:
    """A redis-server of this test's own (killed on purpose, so not the suite's) and a queue server on it."""
    redis = RedisProcess(data_dir=tmp_path / "redis", appendfsync="always").start()
    server = None
    try:
        server = await start_queue_server(QueueSettings(redis_url=redis.url, run_id=run_id, **settings))
        yield redis, server
    finally:
        if server is not None:
            await server.stop()
        redis.stop()


async def test_a_prompt_whose_push_answer_died_with_redis_is_not_generated_again(tmp_path) -> None:
    async with queue_on_own_redis(tmp_path, "lost-complete", lease_timeout_s=60.0) as (redis, server):
        async with QueueClient(server.grpc_address) as client:
            await client.release([_prompt(i) for i in range(3)])
            first, *others = await client.lease(REPLICA, 3, held_version=0)
            assert len(others) == 2

            killing = AnswerLostWithRedis(client, redis, "push")
            with pytest.raises(QueueUnavailable):
                await _keeper(killing).deliver(first, _group(first))
            assert killing.killed
            redis.start()
            # What the replica does with a delivery that failed: the lease goes back at once.
            await _keeper(client).give_back(first, "generation_error")

            stats = await client.prompt_stats()
            assert (stats.total_completed, stats.waiting, stats.leased) == (1, 0, 2), stats
            assert await client.lease(REPLICA, 3, held_version=0) == []

            await _keeper(client).deliver(others[0], _group(others[0]))
            # A group for the first prompt (from a lease re-issued meanwhile) is not stored either, not
            # even beside a group that is.
            await client.push([_group(first), _group(others[1])])

            pulled = await client.pull("trainer-0", current_version=1, max_staleness=1, max_groups=10)
            assert sorted(d.group.prompt_id for d in pulled) == ["lost/0", "lost/1", "lost/2"]
            queue_stats = await client.stats()
            assert queue_stats.total_produced == 3
            # The one group not stored is reported as what it was, not as a drop.
            assert queue_stats.duplicate_groups == 1 and not any(queue_stats.dropped_by_reason.values())
            assert (queue_stats.queue_size, queue_stats.pending) == (0, 3)
            assert (await client.prompt_stats()).total_completed == 3

        async with http_client.async_client(base_url=f"http://127.0.0.1:{server.http.port}") as http:

            async def counted() -> bool:
                return "relayrl_queue_duplicates_groups 1.0" in (await http.get("/metrics")).text

            # The gauges are refreshed every stats_refresh_s (2 s).
            await wait_until_async(counted, 10.0, "the duplicate to show on /metrics")


async def test_prompts_leased_by_a_call_whose_answer_died_with_redis_are_leased_again_at_once(tmp_path) -> None:
    working = asyncio.create_task(asyncio.Event().wait())  # the generation of the lease it holds
    try:
        async with (
            queue_on_own_redis(tmp_path, "lost-lease", lease_timeout_s=600.0) as (redis, server),
            QueueClient(server.grpc_address) as client,
        ):
            await client.release([_prompt(i) for i in range(3)])
            keeper = _keeper(AnswerLostWithRedis(client, redis, "lease_batch", restart=True))
            [first] = await client.lease(REPLICA, 1, held_version=0)
            keeper.state.add_lease(first.lease_id, working, first.expires_at)

            # The first call leases the other two and loses its answer; the retry gets them at once.
            again = await keeper.lease(4)
            assert sorted(lease.prompt.prompt_id for lease in again) == ["lost/1", "lost/2"]
            assert {lease.lease_id.split(".")[1] for lease in again} == {"2"}  # each one's second delivery
            stats = await client.prompt_stats()
            assert (stats.waiting, stats.leased, stats.abandoned_by_reason) == (0, 3, {"lost_answer": 2}), stats
            # The lease the replica works on was kept, and is still its own to renew.
            renewed, _ = await client.renew(REPLICA, [first.lease_id])
            assert renewed == [first.lease_id]
            counted = keeper.metrics.abandoned_leases.labels(reason="lost_answer")._value.get()
            assert counted == 2
    finally:
        working.cancel()


async def test_a_release_whose_answer_died_with_redis_puts_its_prompts_out_once(tmp_path) -> None:
    io = IoThread()
    try:
        async with queue_on_own_redis(tmp_path, "lost-release") as (redis, server):
            feed = trainer_feed(server.grpc_address, io, batch_size=2, total_steps=2, max_staleness=0)
            feed.queue = AnswerLostWithRedis(feed.queue, redis, "release", restart=True)
            # The trainer's release is retried while the queue is unavailable, as any queue call is.
            assert await asyncio.to_thread(feed._release_ahead, 0, 0) == 2
            assert feed.queue.killed
            async with QueueClient(server.grpc_address) as client:
                stats = await client.prompt_stats()
                assert (stats.total_released, stats.waiting) == (2, 2), stats
    finally:
        io.stop()


async def test_an_agents_group_whose_push_answer_died_with_redis_is_stored_once(tmp_path) -> None:
    async with (
        queue_on_own_redis(tmp_path, "lost-agent-push") as (redis, server),
        QueueClient(server.grpc_address) as client,
    ):
        group = _group(PromptLease("", _prompt(0), 0.0, 1))  # no lease: an OpenAI conversation's group
        losing = AnswerLostWithRedis(client, redis, "push", restart=True)
        with pytest.raises(QueueUnavailable):
            await losing.push([group])
        # The endpoint pushes it again, as services.rollout.conversations does after any error.
        again = [group, _group(PromptLease("", _prompt(1), 0.0, 1))]
        policy = RetryPolicy(attempts=None, deadline_s=30.0, first_wait_s=0.2, max_wait_s=1.0)
        await call_with_retries("push again", lambda: losing.push(again), any_error, policy, log)
        pulled = await client.pull("trainer-0", current_version=0, max_staleness=0, max_groups=10)
        assert sorted(d.group.prompt_id for d in pulled) == ["lost/0", "lost/1"]
        stats = await client.stats()
        assert (stats.total_produced, stats.duplicate_groups) == (2, 1)
