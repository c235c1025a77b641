"""At-least-once delivery: crashed consumers, restarted consumers, live consumers, max_deliveries."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from relayrl.v1 import queue_pb2 as qpb
from relayrl.v1 import queue_pb2_grpc as qgrpc
from services.queue.client import QueueClient
from services.queue.keys import TRAINER_GROUP, Keys
from services.trainer.links import IoThread
from tests.waiting import wait_until_async

from .helpers import make_group, trainer_feed

# A trainer stand-in: pulls, reports what it got, then hangs until killed (never acks).
_CONSUMER = """
import asyncio, json, sys
from services.queue.client import QueueClient

async def main(address, consumer, n):
    async with QueueClient(address) as client:
        got = await client.pull(consumer, current_version=0, max_staleness=0, max_groups=n, block_timeout_s=5)
        print(json.dumps([d.entry_id for d in got]), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_entries_of_a_sigkilled_consumer_are_redelivered_to_another_after_idle_timeout(start_queue):
    server = await start_queue(consumer_idle_timeout_s=1.0)
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(i) for i in range(5)])
        proc = subprocess.Popen(
            [sys.executable, "-c", _CONSUMER, server.grpc_address, "trainer-a", "3"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.getcwd(),
        )
        try:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
            held = json.loads(line)
            assert len(held) == 3
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()

        # Right away only the two never-delivered groups are available; the dead one's are not yet reclaimed.
        first = await client.pull("trainer-b", current_version=0, max_staleness=0, max_groups=10)
        assert len(first) == 2 and not set(held) & {d.entry_id for d in first}

        await asyncio.sleep(1.3)  # past the dead consumer's claim idle time: only time reclaims its groups
        again = await client.pull("trainer-b", current_version=0, max_staleness=0, max_groups=10, block_timeout_s=2)
        assert sorted(d.entry_id for d in again) == sorted(held)
        assert {d.delivery_count for d in again} == {2}
        assert await client.ack("trainer-b", [d.entry_id for d in first + again]) == 5
        stats = await client.stats()
        assert stats.total_consumed == 5 and stats.pending == 0 and stats.queue_size == 0


async def test_a_live_consumer_keeps_its_pending_entries_across_many_pulls(start_queue):
    # The service checks for dead consumers at most every idle_timeout / 4. The other consumer
    # pulls just after each check falls due, so every one of its pulls judges the trainer, whose
    # last pull is then 0.8 s old: 2.2 s short of the timeout, room for a loaded machine's stalls.
    idle_timeout_s = 3.0
    server = await start_queue(consumer_idle_timeout_s=idle_timeout_s)
    async with QueueClient(server.grpc_address) as trainer, QueueClient(server.grpc_address) as other:
        await trainer.push([make_group(i) for i in range(2)])
        held = await trainer.pull("trainer-0", current_version=0, max_staleness=0, max_groups=2)
        assert len(held) == 2
        # Past the timeout the entries themselves are idle enough to claim: only the trainer's
        # pulls keep them. Two judgements fall after that point.
        deadline = time.monotonic() + idle_timeout_s + 1.6
        while time.monotonic() < deadline:
            # The trainer keeps training (pulling) without acking: its checkpoint is not durable yet.
            assert await trainer.pull("trainer-0", current_version=0, max_staleness=0, max_groups=2) == []
            await asyncio.sleep(idle_timeout_s / 4 + 0.05)
            assert await other.pull("trainer-1", current_version=0, max_staleness=0, max_groups=2) == []
        assert await trainer.ack("trainer-0", [d.entry_id for d in held]) == 2


async def test_a_restarted_consumer_gets_its_own_pending_entries_first(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as before:
        await before.push([make_group(i) for i in range(3)])
        held = await before.pull("trainer-0", current_version=0, max_staleness=0, max_groups=2)
        await before.push([make_group(9)])
    # A new process (new client session) under the same consumer name.
    async with QueueClient(server.grpc_address) as after:
        first = await after.pull("trainer-0", current_version=0, max_staleness=0, max_groups=2)
        assert [d.entry_id for d in first] == [d.entry_id for d in held]
        assert [d.group.group_id for d in first] == ["g0", "g1"]
        assert {d.delivery_count for d in first} == {2}
        rest = await after.pull("trainer-0", current_version=0, max_staleness=0, max_groups=10)
        assert [d.group.group_id for d in rest] == ["g2", "g9"]
        assert {d.delivery_count for d in rest} == {1}


async def test_an_entry_delivered_too_often_is_dead_lettered(start_queue, raw_redis):
    server = await start_queue(max_deliveries=2)
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(0)])
    for expected in (1, 2):
        async with QueueClient(server.grpc_address) as crashing:
            got = await crashing.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1)
            assert [d.delivery_count for d in got] == [expected]
    async with QueueClient(server.grpc_address) as last:
        assert await last.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1) == []
        stats = await last.stats()
        assert stats.dropped_by_reason["max_deliveries"] == 1 and stats.pending == 0
    dead = await raw_redis.xrange(Keys(server.settings.run_id).dead_letter)
    assert dead[0][1][b"reason"] == b"max_deliveries" and dead[0][1][b"field:gid"] == b"g0"


async def test_groups_read_for_a_pull_the_consumer_gave_up_on_come_back_to_it(start_queue):
    server = await start_queue()
    request = qpb.PullRequest(consumer="trainer-0", current_version=0, max_staleness=0, max_groups=1, block_timeout_s=2)
    async with grpc.aio.insecure_channel(server.grpc_address) as channel, QueueClient(server.grpc_address) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await qgrpc.TrajectoryQueueStub(channel).Pull(request, timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server is still blocked in Redis for the trainer that stopped waiting; it reads this group.
        await client.push([make_group(0)])

        async def pending() -> int:
            return (await client.stats()).pending

        await wait_until_async(pending, 5, "the abandoned read to leave the group pending")
        assert (await client.stats()).pending == 1
        got = await client.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1)
        assert [(d.group.group_id, d.delivery_count) for d in got] == [("g0", 2)]


async def test_a_group_whose_pull_was_not_received_is_delivered_once_after_the_consumer_restarts(start_queue):
    # The chaos test's -4: a trainer killed mid-pull, restarted under the same name, got the group
    # twice (once as not received, once walking its own pending entries), and the second copy was
    # dropped as stale while the first was trained: counted both ways.
    server = await start_queue()
    request = qpb.PullRequest(
        consumer="trainer-0", session_id="first", current_version=0, max_staleness=0, max_groups=1, block_timeout_s=2
    )
    async with grpc.aio.insecure_channel(server.grpc_address) as channel, QueueClient(server.grpc_address) as client:
        with pytest.raises(grpc.aio.AioRpcError):
            await qgrpc.TrajectoryQueueStub(channel).Pull(request, timeout=0.3)
        await client.push([make_group(0)])

        async def pending() -> int:
            return (await client.stats()).pending

        await wait_until_async(pending, 5, "the abandoned read to leave the group pending")
    delivered = []
    async with QueueClient(server.grpc_address) as restarted:
        for _ in range(3):
            got = await restarted.pull("trainer-0", 0, 0, max_groups=10, block_timeout_s=0.2)
            delivered += [d.group.group_id for d in got]
    assert delivered == ["g0"]


async def test_groups_read_for_a_reply_that_died_with_the_service_come_to_the_live_consumer_that_says_what_it_holds(
    start_queue, raw_redis
):
    # The chaos test's stall: a queue instance (or Redis) died between reading groups for a live
    # trainer's pull and answering it. The trainer kept its session, so nothing walked its pending
    # entries again, and it waited for those groups for good.
    first, second = await start_queue(), await start_queue()
    keys = Keys(first.settings.run_id)
    async with QueueClient(first.grpc_address) as trainer:
        await trainer.push([make_group(i) for i in range(3)])
        held = await trainer.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1)
        # What the dying instance did before it could answer: read the next two for the same consumer.
        await raw_redis.xreadgroup(TRAINER_GROUP, "trainer-0", {keys.trajectories: ">"}, count=2)
    async with QueueClient(second.grpc_address, session_id=trainer.session_id) as same_session:
        assert await same_session.pull("trainer-0", 0, 0, max_groups=10, block_timeout_s=0.2) == []
        assert (await same_session.stats()).pending == 3
        owed = await same_session.pull("trainer-0", 0, 0, max_groups=10, held=[d.entry_id for d in held])
        assert [(d.group.group_id, d.delivery_count) for d in owed] == [("g1", 2), ("g2", 2)]
        # The group it holds was not handed out again: one delivery, as before.
        pending = await raw_redis.xpending_range(keys.trajectories, TRAINER_GROUP, "-", "+", 10)
        assert {p["message_id"].decode(): p["times_delivered"] for p in pending}[held[0].entry_id] == 1
        everything = [d.entry_id for d in held + owed]
        again = await same_session.pull("trainer-0", 0, 0, max_groups=10, block_timeout_s=0.2, held=everything)
        assert again == []
        assert await same_session.ack("trainer-0", everything) == 3


async def test_the_trainer_trains_on_groups_whose_pull_reply_died_with_the_queue_instance(start_queue, raw_redis):
    server = await start_queue()
    io = IoThread()
    feed = trainer_feed(server.grpc_address, io, batch_size=2, total_steps=10, pull_timeout_s=0.2)
    # Without its groups the trainer would wait for good: bound the wait, and say so.
    give_up = threading.Timer(30, feed.control.stop_requested.set)
    try:
        async with QueueClient(server.grpc_address) as client:
            await client.push([make_group(i) for i in range(2)])
        # Read for the trainer by an instance that died before answering.
        await raw_redis.xreadgroup(
            TRAINER_GROUP, feed.settings.consumer, {Keys(server.settings.run_id).trajectories: ">"}, count=2
        )
        give_up.start()
        batch = await asyncio.to_thread(feed.next_batch, 0, 0)
        assert batch is not None, "the trainer waited 30 s for groups pending to it that it never received"
        assert sorted(g.group_id for g in batch.groups) == ["g0", "g1"]
    finally:
        give_up.cancel()
        io.stop()


async def test_restart_redelivery_works_across_service_instances(start_queue):
    first, second = await start_queue(), await start_queue()
    async with QueueClient(first.grpc_address) as before:
        await before.push([make_group(i) for i in range(4)])
        held = await before.pull("trainer-0", current_version=0, max_staleness=0, max_groups=4)
    async with QueueClient(second.grpc_address) as after:
        # Re-delivery is paged (max_groups=1 per pull) and every page may land on another instance.
        pages = [await after.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1) for _ in range(2)]
    async with QueueClient(first.grpc_address, session_id=after.session_id) as again:
        pages += [await again.pull("trainer-0", current_version=0, max_staleness=0, max_groups=1) for _ in range(3)]
    assert [d.entry_id for page in pages for d in page] == [d.entry_id for d in held]
