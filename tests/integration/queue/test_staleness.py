"""The staleness check on every pulled message: boundary, one past, η = 0, missing versions."""

from __future__ import annotations

import pytest

from services.queue.client import QueueClient
from services.queue.keys import Keys

from .helpers import make_group


async def test_group_at_the_bound_is_delivered_and_one_past_is_dropped(start_queue, raw_redis):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        # At v = 10, η = 2 the oldest allowed version is 8.
        await client.push([make_group(7, version=7), make_group(8, version=8), make_group(10, version=10)])
        got = await client.pull("trainer-0", current_version=10, max_staleness=2, max_groups=10)
        assert [(d.group.group_id, d.age_versions) for d in got] == [("g8", 2), ("g10", 0)]

        stats = await client.stats()
        assert stats.dropped_by_reason["stale"] == 1
        assert stats.stale_samples_ratio == 1 / 3
        assert stats.max_sample_age_versions == 2
        # The stale group is kept in the stale stream with its reason, and no longer counts as pending.
        assert stats.pending == 2 and stats.queue_size == 0
        stale = await raw_redis.xrange(Keys(server.settings.run_id).stale)
        assert len(stale) == 1 and stale[0][1][b"reason"] == b"stale" and stale[0][1][b"field:gid"] == b"g7"


async def test_eta_zero_delivers_only_the_current_version(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(1, version=4), make_group(2, version=5), make_group(3, version=5, is_eval=True)])
        got = await client.pull("trainer-0", current_version=5, max_staleness=0, max_groups=10)
        assert [d.group.group_id for d in got] == ["g2", "g3"]
        # Eval groups travel the same stream; the flag reaches the trainer intact.
        assert [d.group.is_eval for d in got] == [False, True]
        assert (await client.stats()).dropped_by_reason["stale"] == 1


async def test_a_pull_skips_past_stale_groups_to_fill_its_batch(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        await client.push([make_group(i, version=0) for i in range(5)] + [make_group(9, version=3)])
        got = await client.pull("trainer-0", current_version=3, max_staleness=1, max_groups=1, block_timeout_s=0)
        assert [d.group.group_id for d in got] == ["g9"]
        assert (await client.stats()).dropped_by_reason["stale"] == 5


async def test_entry_without_a_version_is_never_delivered(start_queue, raw_redis):
    server = await start_queue()
    keys = Keys(server.settings.run_id)
    good = make_group(1, version=3).to_proto()
    await raw_redis.xadd(keys.trajectories, {"v_min": -1, "payload": good.SerializeToString()})
    async with QueueClient(server.grpc_address) as client:
        assert await client.pull("trainer-0", current_version=3, max_staleness=4, max_groups=10) == []
        assert (await client.stats()).dropped_by_reason["missing_version"] == 1
    stale = await raw_redis.xrange(keys.stale)
    assert stale[0][1][b"reason"] == b"missing_version"


async def test_stats_measure_the_long_answers_generated_before_any_stale_drop(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        assert (await client.stats()).generated_long_threshold_tokens == 0.0
        # 9 short answers and one long one; the long one goes stale before the trainer pulls it,
        # yet it counts as generated. Evaluation groups are not training work and do not count.
        short = [make_group(i, version=5, samples=1, tokens=10) for i in range(9)]
        await client.push([*short, make_group(9, version=0, samples=1, tokens=100)])
        await client.push([make_group(10, version=5, samples=4, tokens=500, is_eval=True)])
        got = await client.pull("trainer-0", current_version=5, max_staleness=1, max_groups=20)
        assert len(got) == 10 and not any(d.group.group_id == "g9" for d in got)
        stats = await client.stats()
        assert stats.generated_long_threshold_tokens == 100.0
        assert stats.generated_long_token_share == pytest.approx(100 / 190)
