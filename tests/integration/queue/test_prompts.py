"""The prompt queue: version-gated leases, expiry and re-issue, completion."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from relayrl.schema import PromptSpec
from services.queue.client import QueueClient
from services.queue.errors import BadRequest


def prompt(i: int, min_start: int = 0) -> PromptSpec:
    return PromptSpec(
        prompt_id=f"ds/{i}", prompt_token_ids=[1, 2, i], n_samples=4, min_start_version=min_start, temperature=0.7
    )


async def test_a_replica_only_leases_prompts_its_weights_may_start(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0, min_start=3), prompt(1, min_start=1), prompt(2, min_start=0)])
        old = await client.lease("replica-old", max_prompts=10, held_version=1)
        assert [lease.prompt.prompt_id for lease in old] == ["ds/2", "ds/1"]
        assert old[0].prompt.temperature == 0.7 and old[0].prompt.n_samples == 4
        # The version-3 prompt waits for a replica with newer weights; it is not lost.
        assert await client.lease("replica-old", max_prompts=10, held_version=2) == []
        new = await client.lease("replica-new", max_prompts=10, held_version=3)
        assert [lease.prompt.prompt_id for lease in new] == ["ds/0"]
        assert await client.complete("replica-old", [lease.lease_id for lease in old]) == 2
        stats = await client.prompt_stats()
        assert (stats.waiting, stats.leased, stats.total_released, stats.total_completed) == (0, 1, 3, 2)


async def test_an_expired_lease_is_reissued_to_another_replica(start_queue):
    server = await start_queue(lease_timeout_s=0.4)
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0), prompt(1)])
        crashed = await client.lease("replica-a", max_prompts=1, held_version=0)
        assert [lease.delivery_count for lease in crashed] == [1]
        # Until it expires, the other replica only gets the other prompt.
        other = await client.lease("replica-b", max_prompts=5, held_version=0)
        assert [lease.prompt.prompt_id for lease in other] == ["ds/1"]
        assert await client.complete("replica-b", [other[0].lease_id]) == 1

        await asyncio.sleep(0.5)  # past the lease timeout: only time expires a lease
        reissued = await client.lease("replica-b", max_prompts=5, held_version=0, block_timeout_s=1)
        assert [lease.prompt.prompt_id for lease in reissued] == ["ds/0"]
        assert reissued[0].delivery_count == 2 and reissued[0].lease_id != crashed[0].lease_id
        assert (await client.prompt_stats()).total_reissued == 1

        assert await client.complete("replica-b", [reissued[0].lease_id]) == 1
        # The crashed replica's late completion finds the prompt already done.
        assert await client.complete("replica-a", [crashed[0].lease_id]) == 0
        stats = await client.prompt_stats()
        assert (stats.waiting, stats.leased, stats.total_completed) == (0, 0, 2)


async def test_lease_blocks_until_a_prompt_is_released(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as trainer, QueueClient(server.grpc_address) as replica:
        waiting = asyncio.create_task(replica.lease("replica-a", max_prompts=1, held_version=0, block_timeout_s=30))
        await asyncio.sleep(0.2)  # what is under test: the lease stays blocked while nothing is released
        assert not waiting.done()
        await trainer.release([prompt(7)])
        # Woken by the release itself, long before the fallback re-check (5 s here).
        leases = await asyncio.wait_for(waiting, 2.5)
        assert [lease.prompt.prompt_id for lease in leases] == ["ds/7"]


async def test_a_lease_does_not_block_when_only_prompts_for_newer_weights_wait(start_queue):
    """A blocked lease keeps the version it was sent with; were it to keep blocking here, a
    replica whose weights move on meanwhile could not lease these prompts until it timed out."""
    server = await start_queue()
    async with QueueClient(server.grpc_address) as trainer, QueueClient(server.grpc_address) as replica:
        await trainer.release([prompt(0, min_start=3)])
        batch = await asyncio.wait_for(replica.lease_batch("replica-a", 4, held_version=2, block_timeout_s=30), 5)
        assert batch.leases == [] and batch.newer_version_waiting

        # Blocked with nothing waiting, then woken by a release only newer weights may start.
        (only,) = await replica.lease("replica-b", max_prompts=1, held_version=3)
        waiting = asyncio.create_task(replica.lease_batch("replica-a", 4, held_version=2, block_timeout_s=30))
        await asyncio.sleep(0.2)  # what is under test: blocked while nothing at all waits
        assert not waiting.done()
        await trainer.release([prompt(1, min_start=4)])
        batch = await asyncio.wait_for(waiting, 5)
        assert batch.leases == [] and batch.newer_version_waiting

        # Prompts it may start are leased as before, and the flag stays down.
        await trainer.release([prompt(2, min_start=1)])
        batch = await replica.lease_batch("replica-a", 4, held_version=2, block_timeout_s=30)
        assert [lease.prompt.prompt_id for lease in batch.leases] == ["ds/2"]
        assert not batch.newer_version_waiting
        assert await replica.complete("replica-b", [only.lease_id]) == 1


async def test_a_blocked_lease_is_woken_by_a_give_back_and_by_a_lease_expiring(start_queue):
    server = await start_queue(lease_timeout_s=1.0)
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0), prompt(1)])
        first, _ = await client.lease("replica-a", max_prompts=2, held_version=0)
        waiting = asyncio.create_task(client.lease("replica-b", max_prompts=1, held_version=0, block_timeout_s=30))
        await asyncio.sleep(0.2)  # the second lease is blocked before the give-back, not after
        await client.abandon("replica-a", [first.lease_id], "stale")
        (given_back,) = await asyncio.wait_for(waiting, 2.5)
        # The other lease expires after 1 s; a lease blocked on nothing else wakes for it.
        (expired,) = await asyncio.wait_for(
            client.lease("replica-b", max_prompts=1, held_version=0, block_timeout_s=30), 3.5
        )
    assert given_back.prompt.prompt_id == "ds/0" and expired.prompt.prompt_id == "ds/1"


async def test_a_renewed_lease_outlives_its_timeout_and_a_reissued_one_cannot_be_renewed(start_queue):
    server = await start_queue(lease_timeout_s=0.6)
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0), prompt(1)])
        (slow,) = await client.lease("replica-a", max_prompts=1, held_version=0)
        (lost,) = await client.lease("replica-a", max_prompts=1, held_version=0)
        for _ in range(4):  # a generation four times as long as the lease timeout
            await asyncio.sleep(0.3)  # the generation's time: renewals must outlast the lease timeout
            renewed, expires_at = await client.renew("replica-a", [slow.lease_id])
            assert renewed == [slow.lease_id] and expires_at > slow.expires_at
        # Not renewed: it expired and went to another replica, who now holds it alone.
        other = await client.lease("replica-b", max_prompts=5, held_version=0)
        assert [lease.prompt.prompt_id for lease in other] == ["ds/1"]
        renewed, _ = await client.renew("replica-a", [slow.lease_id, lost.lease_id])
        assert renewed == [slow.lease_id]
        assert (await client.renew("replica-a", [other[0].lease_id]))[0] == []  # not replica-a's
        assert (await client.prompt_stats()).total_reissued == 1
        with pytest.raises(BadRequest) as err:
            await client.renew("replica-a", ["not-a-lease"])
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "not a lease id" in err.value.details


async def test_an_abandoned_lease_is_leased_again_at_once_not_after_its_timeout(start_queue):
    server = await start_queue(lease_timeout_s=600)
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0), prompt(1)])
        first, second = await client.lease("replica-a", max_prompts=2, held_version=0)
        requeued, dropped = await client.abandon("replica-a", [first.lease_id], "generation_error")
        assert (requeued, dropped) == ([first.lease_id], [])
        (again,) = await client.lease("replica-b", max_prompts=5, held_version=0)
        assert again.prompt.prompt_id == "ds/0" and again.delivery_count == 2
        # Only the current holder gives a lease back: the old lease id and another replica are refused.
        assert await client.abandon("replica-a", [first.lease_id], "stale") == ([], [])
        assert await client.abandon("replica-a", [again.lease_id], "stale") == ([], [])
        assert await client.complete("replica-b", [again.lease_id]) == 1
        assert await client.complete("replica-a", [second.lease_id]) == 1
        stats = await client.prompt_stats()
    assert (stats.waiting, stats.leased, stats.total_completed, stats.total_reissued) == (0, 0, 2, 0)
    assert stats.abandoned_by_reason == {"generation_error": 1} and stats.dropped_by_reason == {}


async def test_a_stale_give_back_raises_the_start_version_so_the_old_replica_cannot_retake_it(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0, min_start=1)])
        (lease,) = await client.lease("replica-old", max_prompts=1, held_version=1)
        await client.abandon("replica-old", [lease.lease_id], "stale", min_start_version=3)
        assert await client.lease("replica-old", max_prompts=1, held_version=2) == []
        (fresh,) = await client.lease("replica-new", max_prompts=1, held_version=3)
        # A lower start version never lowers the prompt's own.
        await client.abandon("replica-new", [fresh.lease_id], "stale", min_start_version=0)
        assert await client.lease("replica-old", max_prompts=1, held_version=2) == []
        assert len(await client.lease("replica-new", max_prompts=1, held_version=3)) == 1


async def test_a_prompt_given_back_too_often_is_dropped_and_counted(start_queue):
    server = await start_queue(max_prompt_abandons=3)
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0)])
        outcomes = []
        for _ in range(3):
            (lease,) = await client.lease("replica-a", max_prompts=1, held_version=0)
            outcomes.append(await client.abandon("replica-a", [lease.lease_id], "generation_error"))
        assert [bool(requeued) for requeued, _ in outcomes] == [True, True, False]
        assert outcomes[-1][1] == [lease.lease_id]
        assert await client.lease("replica-a", max_prompts=1, held_version=0) == []
        stats = await client.prompt_stats()
    assert (stats.waiting, stats.leased, stats.total_completed) == (0, 0, 0)
    assert stats.abandoned_by_reason == {"generation_error": 2}
    assert stats.dropped_by_reason == {"generation_error": 1}


@pytest.mark.parametrize(
    ("reason", "lease_ids", "min_start", "message"),
    [
        ("Stale!", ["000000000001.1"], 0, "reason must be"),
        ("", ["000000000001.1"], 0, "reason must be"),
        ("stale", ["not-a-lease"], 0, "not a lease id"),
        ("stale", ["000000000001.1"], -1, "min_start_version must be >= 0"),
    ],
)
async def test_a_bad_give_back_is_invalid_argument(start_queue, reason, lease_ids, min_start, message):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        with pytest.raises(BadRequest) as err:
            await client.abandon("replica-a", lease_ids, reason, min_start_version=min_start)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and message in err.value.details


async def test_a_restarted_replica_gives_back_every_lease_its_predecessor_held(start_queue):
    server = await start_queue(lease_timeout_s=600)
    async with QueueClient(server.grpc_address) as client:
        await client.release([prompt(0), prompt(1), prompt(2)])
        held = await client.lease("replica-a", max_prompts=2, held_version=0)
        (other,) = await client.lease("replica-b", max_prompts=1, held_version=0)
        requeued, dropped = await client.abandon("replica-a", [], "replica_restart", all_held=True)
        assert sorted(requeued) == sorted(lease.lease_id for lease in held) and dropped == []
        again = await client.lease("replica-c", max_prompts=5, held_version=0)
        # replica-b's lease is untouched.
        renewed, _ = await client.renew("replica-b", [other.lease_id])
        assert renewed == [other.lease_id]
        stats = await client.prompt_stats()
    assert sorted(lease.prompt.prompt_id for lease in again) == sorted(lease.prompt.prompt_id for lease in held)
    assert stats.abandoned_by_reason == {"replica_restart": 2}


async def test_oversized_lease_calls_are_refused_before_they_reach_redis(start_queue):
    server = await start_queue()
    async with QueueClient(server.grpc_address) as client:
        with pytest.raises(BadRequest) as err:
            await client.lease("replica-a", max_prompts=2**31 - 1, held_version=0)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "max_prompts must be in" in err.value.details
        with pytest.raises(BadRequest) as err:
            await client.complete("replica-a", [f"{i:012d}.1" for i in range(5000)])
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "at most 4096 lease ids" in err.value.details
        # The queue still serves.
        await client.release([prompt(0)])
        assert len(await client.lease("replica-a", max_prompts=1, held_version=0)) == 1
