"""Backpressure: a full queue blocks pushes, then fails them; nothing is silently dropped or trimmed."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.queue.client import QueueClient
from services.queue.errors import QueueFull
from services.queue.keys import Keys

from .helpers import make_group


async def test_push_beyond_capacity_waits_then_fails_without_losing_data(start_queue):
    server = await start_queue(capacity=4)
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(i) for i in range(3)])
        started = time.monotonic()
        with pytest.raises(QueueFull, match="capacity of 4"):
            # All or nothing: two groups do not fit in the one free slot.
            await client.push([make_group(3), make_group(4)], timeout_s=0.4)
        assert time.monotonic() - started >= 0.4
        stats = await client.stats()
        assert stats.total_produced == 3 and stats.queue_size == 3
        got = await client.pull("trainer-0", current_version=0, max_staleness=0, max_groups=10)
        assert [d.group.group_id for d in got] == ["g0", "g1", "g2"]


async def test_pending_groups_hold_capacity_until_acked_and_a_blocked_push_then_proceeds(start_queue):
    server = await start_queue(capacity=2)
    async with QueueClient(server.grpc_address) as producer, QueueClient(server.grpc_address) as trainer:
        await producer.push([make_group(0), make_group(1)])
        held = await trainer.pull("trainer-0", current_version=0, max_staleness=0, max_groups=2)
        # Delivered but not acked still counts: the trainer may crash before its checkpoint.
        with pytest.raises(QueueFull):
            await producer.push([make_group(2)], timeout_s=0.2)

        blocked = asyncio.create_task(producer.push([make_group(2)], timeout_s=5))
        await asyncio.sleep(0.3)  # what is under test: the push stays blocked while the queue is full
        assert not blocked.done()
        await trainer.ack("trainer-0", [held[0].entry_id])
        assert len(await asyncio.wait_for(blocked, 5)) == 1
        stats = await producer.stats()
        assert (stats.queue_size, stats.pending, stats.total_produced) == (1, 1, 3)


async def test_acked_entries_are_trimmed_and_unacked_ones_survive(start_queue, raw_redis):
    server = await start_queue()
    stream = Keys(server.settings.run_id).trajectories
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(i) for i in range(6)])
        got = await client.pull("trainer-0", current_version=0, max_staleness=0, max_groups=6)
        acked, kept = got[::2], got[1::2]
        assert await client.ack("trainer-0", [d.entry_id for d in acked]) == 3
        # Acking twice counts nothing and trims nothing more.
        assert await client.ack("trainer-0", [d.entry_id for d in acked]) == 0
        # An id never delivered is not acked, and so not trimmed either.
        await client.push([make_group(6)])
        undelivered = (await raw_redis.xrange(stream))[-1][0].decode()
        assert await client.ack("trainer-0", [undelivered]) == 0

    remaining = [entry_id.decode() for entry_id, _ in await raw_redis.xrange(stream)]
    assert remaining == [d.entry_id for d in kept] + [undelivered]

    async with QueueClient(server.grpc_address) as restarted:
        again = await restarted.pull("trainer-0", current_version=0, max_staleness=0, max_groups=10)
        assert [d.group.group_id for d in again] == ["g1", "g3", "g5"]
        assert again[0].group.samples == kept[0].group.samples
        new = await restarted.pull("trainer-0", current_version=0, max_staleness=0, max_groups=10)
        assert [d.group.group_id for d in new] == ["g6"]


async def test_concurrent_pushes_never_overshoot_capacity(start_queue, raw_redis):
    server = await start_queue(capacity=5)
    stream = Keys(server.settings.run_id).trajectories
    clients = [QueueClient(server.grpc_address) for _ in range(6)]
    try:
        results = await asyncio.gather(
            *(c.push([make_group(2 * i), make_group(2 * i + 1)], timeout_s=0.3) for i, c in enumerate(clients)),
            return_exceptions=True,
        )
    finally:
        for c in clients:
            await c.close()
    accepted = [r for r in results if not isinstance(r, BaseException)]
    assert len(accepted) == 2
    assert all(isinstance(r, QueueFull) for r in results if isinstance(r, BaseException))
    assert await raw_redis.xlen(stream) == 4


async def test_room_held_by_a_push_that_died_midway_is_freed_when_its_reservation_expires(start_queue, raw_redis):
    server = await start_queue(capacity=4)
    reservations = Keys(server.settings.run_id).push_reservations
    now_ms = int(time.time() * 1000)
    # A live reservation for the whole capacity (a push between its check and its append)...
    await raw_redis.zadd(reservations, {"live:4": now_ms + 60_000})
    async with QueueClient(server.grpc_address) as client:
        with pytest.raises(QueueFull):
            await client.push([make_group(0)], timeout_s=0.2)
        # ...and the same left behind by a service that died: expired, it holds nothing.
        await raw_redis.zadd(reservations, {"live:4": now_ms - 1})
        assert len(await client.push([make_group(0)], timeout_s=0.2)) == 1
    assert await raw_redis.zcard(reservations) == 0
