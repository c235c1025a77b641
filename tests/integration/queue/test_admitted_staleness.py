"""η that changes during a run (max_staleness auto): admission at the queue follows a new η at once,
and each group is judged by the η its prompt was admitted under, so a group admitted legally is
never dropped because η fell afterwards (relayrl/staleness.py states the rule)."""

from __future__ import annotations

import asyncio

from relayrl.schema import Group, Sample
from services.queue.client import QueueClient
from services.trainer.links import IoThread

from .helpers import make_group, trainer_feed

BATCH = 2


def admitted(i: int, version: int, eta: int | None) -> Group:
    group = make_group(i, version=version)
    group.max_staleness = eta
    return group


async def test_a_group_is_judged_by_the_eta_it_was_admitted_under_not_the_pulls(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        # Started at version 5, consumed at 7 (age 2) while the trainer's η is now 1.
        await client.push([admitted(1, 5, eta=3), admitted(2, 5, eta=0), admitted(3, 5, eta=None)])
        got = await client.pull("trainer-0", current_version=7, max_staleness=1, max_groups=10, block_timeout_s=0)
        assert [(d.group.group_id, d.age_versions, d.group.max_staleness) for d in got] == [("g1", 2, 3)]
        # Admitted under η = 0, and one without an η judged by the pull's bound of 1: both stale.
        assert (await client.stats()).dropped_by_reason["stale"] == 2


async def _lease_all(client: QueueClient, held_version: int) -> list:
    batch = await client.lease_batch("replica-0", 64, held_version, block_timeout_s=0)
    return [lease.prompt for lease in batch.leases]


async def test_admission_follows_a_new_eta_at_once_and_a_lower_eta_drops_nothing_admitted_before(start_queue):
    server = await start_queue()
    io = IoThread()
    feed = trainer_feed(
        server.grpc_address, io, batch_size=BATCH, max_staleness="auto", staleness_initial=0, total_steps=100
    )
    try:
        async with QueueClient(server.grpc_address) as client:
            # η = 0 at step 1, version 1: one batch for version 1, startable only by version 1.
            assert await asyncio.to_thread(feed._release_ahead, 1, 1) == 2 * BATCH  # steps 1 and 2 (η = 0)
            assert await _lease_all(client, held_version=0) == []

            feed.max_staleness = 2  # the controller's decision; the very next release follows it
            assert await asyncio.to_thread(feed._release_ahead, 1, 1) == 2 * BATCH
            ahead = await _lease_all(client, held_version=0)
            # Steps 3 and 4 train at versions 2 and 3: startable from versions 0 and 1, stamped η = 2.
            assert [(p.min_start_version, p.max_staleness) for p in ahead] == [(0, 2)] * BATCH
            rest = await _lease_all(client, held_version=1)
            # Steps 1 and 2 (admitted under η = 0, both training at version 1), and step 4 (η = 2, at version 3).
            expected = [(1, 0)] * 2 * BATCH + [(1, 2)] * BATCH
            assert sorted((p.min_start_version, p.max_staleness) for p in rest) == expected

            feed.max_staleness = 0  # lowered: nothing more is admitted until consumption catches up
            assert await asyncio.to_thread(feed._release_ahead, 1, 1) == 0

            # Version 2 now. Each group answers a prompt above: the one admitted under η = 2 and
            # started at version 0 (age 2) is trained on; one admitted under η = 0 at version 1 is not.
            legal = Group.answering(ahead[0], [_sample(0)], "lease-a")
            late = Group.answering(rest[0], [_sample(1)], "lease-b")
            assert (legal.max_staleness, late.max_staleness) == (2, 0)
            await client.push([legal, late])
            came = await asyncio.to_thread(feed._pull, 2, 10)
            await asyncio.to_thread(feed._drop_stale, 2)
            assert came == 1 and [d.group.group_id for d in feed._buffer] == [legal.group_id]
            assert (await client.stats()).dropped_by_reason["stale"] == 1
    finally:
        io.stop()


def _sample(version: int) -> Sample:
    return Sample([1, 2], [5, 6, 7], [-0.5] * 3, [version] * 3, reward=1.0)
