"""A trainer rollback told to the queue: groups from the discarded versions are dropped with their own
reason, groups started at or below the checkpoint are judged along the trainer's lineage (kept
when they are within η of it), and waiting prompts may start only at the resumed version."""

from __future__ import annotations

import pytest

from services.queue.client import QueueClient
from services.queue.errors import BadRequest

from .helpers import make_group
from .test_prompts import prompt


async def test_after_a_rollback_discarded_groups_are_dropped_and_the_checkpoints_are_kept(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        # Checkpoint at v10, trained on to v14, killed: paramsync holds v14, so the resumed trainer
        # goes on as v15 with the weights of v10.
        await client.push([make_group(i, version=v) for i, v in enumerate((8, 9, 10, 12, 14, 15))])
        await client.rollback(checkpoint_version=10, resumed_version=15)
        got = await client.pull("trainer-0", current_version=15, max_staleness=1, max_groups=10, block_timeout_s=0)
        # v10 is the resumed weights themselves (age 0) and v9 one step behind them; v8 is two.
        assert [(d.group.group_id, d.age_versions) for d in got] == [("g1", 1), ("g2", 0), ("g5", 0)]
        dropped = (await client.stats()).dropped_by_reason
        assert dropped["rolled_back"] == 2 and dropped["stale"] == 1

        # Once the trainer moved on, a group from before the checkpoint ages as it would have.
        await client.push([make_group(20, version=10)])
        assert await client.pull("trainer-0", current_version=17, max_staleness=1, max_groups=10) == []
        assert (await client.stats()).dropped_by_reason["stale"] == 2


async def test_a_rollback_holds_waiting_prompts_back_until_the_resumed_version(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(1, min_start=13), prompt(2, min_start=14), prompt(3, min_start=16)])
        assert await client.rollback(checkpoint_version=10, resumed_version=15) == 2
        # A replica still holding the discarded v14 starts nothing; the resumed v15 starts both.
        assert await client.lease("r0", 10, held_version=14) == []
        leased = await client.lease("r0", 10, held_version=15)
        assert sorted(lease.prompt.prompt_id for lease in leased) == ["ds/1", "ds/2"]


async def test_a_rollback_to_a_later_version_than_it_resumes_at_is_refused(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        with pytest.raises(BadRequest, match="checkpoint_version"):
            await client.rollback(checkpoint_version=12, resumed_version=11)
