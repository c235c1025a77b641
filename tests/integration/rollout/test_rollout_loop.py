"""The replica loop with a real engine process and a real queue service (redis-server + gRPC)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from relayrl.redis_process import RedisProcess
from services.engine.client import EngineClient
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.keys import Keys
from services.queue.server import QueueServer, start_queue_server
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import prompt, pull_groups, running_replica, sample_value
from tests.waiting import wait_until_async


@pytest.fixture
async def queue(redis_server: RedisProcess, run_id: str) -> QueueServer:
    server = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id, lease_timeout_s=2.0)))
    yield server
    await server.stop()


def _reward_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, body: str) -> str:
    """A verl ``compute_score`` with ``body`` (``time`` imported) in an importable module; its import path."""
    (tmp_path / f"{module}.py").write_text(
        f"import time\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n{body}"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:compute_score"


async def test_each_prompt_becomes_one_group_with_per_token_versions(
    engine: EngineProcess, redis_server: RedisProcess, run_id: str
) -> None:
    async with EngineClient(engine.url) as client:
        version = int(await client.weight_version())
    # Exactly 9 samples, so no lease may expire: with the module's 2 s lease this failed once in a
    # loaded suite (a renewal a second late lets the prompt be re-issued and generated again).
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id, lease_timeout_s=30.0)))
    try:
        await _one_group_per_prompt(engine, queue, version)
    finally:
        await queue.stop()


async def _one_group_per_prompt(engine: EngineProcess, queue: QueueServer, version: int) -> None:
    async with QueueClient(queue.grpc_address) as q:
        await q.release([prompt(i, n=3) for i in range(3)])
        async with running_replica(engine.url, queue.grpc_address, replica_id="r-loop") as replica:
            groups = await pull_groups(queue.grpc_address, 3, version=version)
            await wait_until_async(lambda: q.prompt_stats(), what="stats")
            stats = await q.prompt_stats()
            assert replica.state.status().total_generated_samples == 9
    assert sorted(g.prompt_id for g in groups) == ["test/0", "test/1", "test/2"]
    assert stats.total_completed == 3 and stats.leased == 0
    for group in groups:
        assert len(group.samples) == 3
        assert group.data_source == "relayrl/copy"
        for sample in group.samples:
            n = len(sample.response_token_ids)
            assert 1 <= n <= 8
            assert sample.prompt_token_ids == [5 + int(group.prompt_id.split("/")[1]), 6, 7, 8]
            assert sample.policy_versions == [version] * n
            assert len(sample.behavior_logprobs) == n and all(lp <= 0 for lp in sample.behavior_logprobs)
            assert 0.0 <= sample.reward <= 1.0 and not sample.reward_error
            assert sample.replica_id == "r-loop"


async def test_no_training_generation_starts_while_validation_prompts_generate(
    engine: EngineProcess, queue: QueueServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.rollout import loop

    spans: list[tuple[str, float, float]] = []
    generate = loop.generate_group

    async def timed(*args: Any, rid: str, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await generate(*args, rid=rid, **kwargs)
        finally:
            spans.append(("eval" if "-val/" in rid else "train", started, time.monotonic()))

    monkeypatch.setattr(loop, "generate_group", timed)
    # Training and validation prompts interleaved in the queue, all leased at once.
    prompts = []
    for i in range(4):
        prompts.append(prompt(i, n=2))
        held_out = prompt(10 + i, n=1, is_eval=True, temperature=0.0, max_new_tokens=16)
        prompts.append(replace(held_out, prompt_id=f"val/{i}"))
    async with QueueClient(queue.grpc_address) as q:
        await q.release(prompts)
        async with running_replica(engine.url, queue.grpc_address, max_inflight_prompts=8) as replica:
            groups = await pull_groups(queue.grpc_address, len(prompts))
            held = sample_value(replica, "held_for_validation_seconds_total")
    assert sorted(g.prompt_id for g in groups) == sorted(p.prompt_id for p in prompts)
    evals = [(start, end) for kind, start, end in spans if kind == "eval"]
    starts = [start for kind, start, _ in spans if kind == "train"]
    assert len(evals) == 4 and len(starts) == 4
    overlapping = [s for s in starts if any(a < s < b for a, b in evals)]
    assert overlapping == [], "a training prompt started generating while validation was generating"
    # Training prompts were leased beside the validation ones and had to wait: the hold engaged.
    assert held > 0


async def test_pause_stops_leasing_and_resume_finishes_the_work(engine: EngineProcess, queue: QueueServer) -> None:
    async with QueueClient(queue.grpc_address) as q, running_replica(engine.url, queue.grpc_address) as replica:
        await wait_until_async(replica.state.ready, what="engine ready")
        await replica.control.pause("retract")
        try:
            await q.release([prompt(10)])
            # Nothing is generated while paused (a Lease call already waiting when the pause came
            # may still take the prompt; the paused engine then holds its requests).
            assert await q.pull("trainer-0", 0, 100, 1, block_timeout_s=1.0) == []
            stats = await q.prompt_stats()
            assert stats.total_completed == 0 and stats.waiting + stats.leased == 1
            assert replica.state.status().paused and replica.state.status().pause_mode == "retract"
        finally:
            await replica.control.resume()
        (group,) = await pull_groups(queue.grpc_address, 1)
    assert group.prompt_id == "test/10"


async def test_reward_that_raises_or_hangs_gives_zero_and_is_counted(
    engine: EngineProcess, queue: QueueServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reward = _reward_function(
        tmp_path,
        monkeypatch,
        "user_reward",
        "    if data_source == 'raise':\n"
        "        raise RuntimeError('broken reward')\n"
        "    if data_source == 'hang':\n"
        "        time.sleep(3)\n"
        "    return {'score': 1.0, 'acc': 1.0}\n",
    )
    async with QueueClient(queue.grpc_address) as q:
        await q.release([prompt(20, data_source="raise"), prompt(21, data_source="hang"), prompt(22, data_source="ok")])
        async with running_replica(
            engine.url, queue.grpc_address, reward_function=reward, reward_timeout_s=0.3
        ) as replica:
            groups = {g.data_source: g for g in await pull_groups(queue.grpc_address, 3)}
            errors = sample_value(replica, "reward_errors_total")
    for source in ("raise", "hang"):
        assert all(s.reward == 0.0 and s.reward_error for s in groups[source].samples)
    assert all(s.reward == 1.0 and s.reward_extra == {"acc": 1.0} for s in groups["ok"].samples)
    assert errors == 4


async def test_group_already_stale_is_dropped_counted_and_given_back_for_newer_weights(
    engine: EngineProcess, queue: QueueServer
) -> None:
    async with (
        QueueClient(queue.grpc_address) as q,
        running_replica(engine.url, queue.grpc_address, max_staleness=0) as replica,
    ):
        await wait_until_async(replica.state.ready, what="engine ready")
        held = replica.state.held_version
        # Paramsync has announced a version newer than the one the engine still serves.
        replica.state.note_latest(held + 1)
        await q.release([prompt(50, n=2)])
        await wait_until_async(lambda: sample_value(replica, "dropped_stale_samples_total") >= 2, what="stale drop")
        await wait_until_async(lambda: replica.state.leases_held == 0, what="the lease to be given back")
        assert await q.pull("trainer-0", 0, 100, 10, block_timeout_s=0.2) == []
        stats = await q.prompt_stats()
        # Given back at once (not after the lease timeout), waiting for weights that keep it fresh.
        assert (stats.waiting, stats.leased, stats.total_completed) == (1, 0, 0)
        assert stats.abandoned_by_reason == {"stale": 1}
        assert await q.lease("replica-other", max_prompts=1, held_version=held) == []
        (lease,) = await q.lease("replica-other", max_prompts=1, held_version=held + 1)
    assert lease.prompt.prompt_id == "test/50" and lease.delivery_count == 2


async def test_a_failing_prompt_is_given_back_at_once_until_the_queue_drops_it(
    engine: EngineProcess, queue: QueueServer
) -> None:
    async def dropped() -> bool:
        return (await q.prompt_stats()).dropped_by_reason == {"generation_error": 1}

    async with QueueClient(queue.grpc_address) as q, running_replica(engine.url, queue.grpc_address) as replica:
        await wait_until_async(replica.state.ready, what="engine ready")
        # A token id outside the vocabulary: the engine answers 400 to every attempt.
        await q.release([replace(prompt(60, n=1), prompt_token_ids=[1_000_000])])
        await wait_until_async(dropped, what="the failing prompt to be dropped after its give-backs")
        stats = await q.prompt_stats()
    # Each attempt was given back at once (the lease timeout here is 2 s, and nothing expired).
    assert stats.abandoned_by_reason == {"generation_error": QueueSettings().max_prompt_abandons - 1}
    assert (stats.total_reissued, stats.total_completed, stats.waiting, stats.leased) == (0, 0, 0, 0)


async def test_a_restarted_replica_gives_back_its_predecessors_leases_before_leasing(
    engine: EngineProcess, queue: QueueServer
) -> None:
    async with QueueClient(queue.grpc_address) as q:
        await q.release([prompt(70), prompt(71)])
        # A replica of this id leased both prompts, then was killed.
        assert len(await q.lease("r-restarted", max_prompts=2, held_version=0)) == 2
        async with running_replica(engine.url, queue.grpc_address, replica_id="r-restarted"):
            groups = await pull_groups(queue.grpc_address, 2)
            stats = await q.prompt_stats()
    assert sorted(g.prompt_id for g in groups) == ["test/70", "test/71"]
    assert stats.abandoned_by_reason == {"replica_restart": 2} and stats.total_reissued == 0


async def test_a_prompt_that_outlasts_its_lease_is_renewed_and_delivered_once(
    engine: EngineProcess, redis_server: RedisProcess, run_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 6 s lease, renewed at half its span, and a reward that outlasts it: one renewal late by
    # more than 3 s loses it (with the module's 2 s lease, 1 s late did on a loaded machine).
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id, lease_timeout_s=6.0)))
    reward = _reward_function(tmp_path, monkeypatch, "slow_reward", "    time.sleep(7)\n    return 1.0\n")
    try:
        async with QueueClient(queue.grpc_address) as q:
            await q.release([prompt(30)])
            async with running_replica(engine.url, queue.grpc_address, reward_function=reward, reward_timeout_s=20):
                (group,) = await pull_groups(queue.grpc_address, 1)
                # Without renewal the expired lease is re-issued and the prompt generated again.
                assert await q.pull("trainer-0", 0, 100, 10, block_timeout_s=1.0) == []
                stats = await q.prompt_stats()
    finally:
        await queue.stop()
    assert group.prompt_id == "test/30"
    assert (stats.total_reissued, stats.total_completed, stats.leased, stats.waiting) == (0, 1, 0, 0)


async def _keep_renewing(q: QueueClient, replica_id: str, lease_id: str) -> None:
    while True:
        await q.renew(replica_id, [lease_id])
        await asyncio.sleep(0.2)


async def test_a_prompt_whose_lease_was_reissued_is_dropped_not_pushed(
    engine: EngineProcess,
    queue: QueueServer,
    redis_server: RedisProcess,
    run_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reward = _reward_function(tmp_path, monkeypatch, "slower_reward", "    time.sleep(3)\n    return 1.0\n")
    redis = aioredis.Redis.from_url(redis_server.url)
    async with QueueClient(queue.grpc_address) as q:
        await q.release([prompt(40)])
        async with running_replica(
            engine.url,
            queue.grpc_address,
            reward_function=reward,
            reward_timeout_s=10,
            max_inflight_prompts=1,
        ) as replica:
            await wait_until_async(lambda: replica.state.leases_held == 1, what="the replica to lease the prompt")
            # The replica's lease lapses as if its renewals had not reached the queue, and another
            # replica gets the prompt.
            leased_key = Keys(run_id).prompts_leased
            (key,) = await redis.zrange(leased_key, 0, -1)
            await redis.zadd(leased_key, {key: 0})
            (other,) = await q.lease("replica-other", max_prompts=1, held_version=0)
            assert other.delivery_count == 2
            # The other replica renews its lease as a live one would: on a loaded machine the wait
            # below can outlast the 2 s lease timeout, and a lapse would re-issue the prompt again.
            renewing = asyncio.create_task(_keep_renewing(q, "replica-other", other.lease_id))
            try:
                await wait_until_async(lambda: replica.state.leases_held == 0, what="the lost prompt to be dropped")
            finally:
                renewing.cancel()
            assert await q.complete("replica-other", [other.lease_id]) == 1
            # The dropped generation would have pushed its group about 3 s after it started.
            assert await q.pull("trainer-0", 0, 100, 10, block_timeout_s=4.0) == []
            stats = await q.prompt_stats()
    await redis.aclose()
    assert (stats.total_reissued, stats.total_completed, stats.leased, stats.waiting) == (1, 1, 0, 0)


async def test_a_prompt_held_by_a_pause_longer_than_pause_wait_s_goes_back_to_the_queue_and_is_not_lost(
    engine: EngineProcess, redis_server: RedisProcess, run_id: str
) -> None:
    # Long leases: the prompt must come back because of the pause, not because its lease expired.
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id, lease_timeout_s=60.0)))
    try:
        async with QueueClient(queue.grpc_address) as q:
            # Greedy: the session engine's weights never end this prompt within 1,500 tokens. Sampled, the
            # answer's length hung on the engine's random state, which earlier tests advance: in some test
            # orders it ended after a few tokens, before the wait below saw it generating.
            await q.release([prompt(0, n=1, max_new_tokens=1500, temperature=0.0)])
            overrides = {"pause_wait_s": 0.5, "max_new_tokens": 1500}
            async with running_replica(engine.url, queue.grpc_address, **overrides) as replica:
                await wait_until_async(lambda: replica.state.status().in_flight > 0, what="the prompt generating")
                await replica.control.pause("abort")
                paused_at = time.monotonic()
                stats = await wait_until_async(
                    lambda: _given_back_as_paused(q), timeout_s=10, what="the prompt given back as paused"
                )
                given_back_s = time.monotonic() - paused_at
                assert replica.state.status().in_flight == 0, "nothing waits in the paused engine"
                await replica.control.resume()
                (group,) = await pull_groups(queue.grpc_address, 1, timeout_s=60)
    finally:
        await queue.stop()
    assert given_back_s < 5.0, f"given back {given_back_s:.1f}s after the pause; pause_wait_s is 0.5"
    assert stats.abandoned_by_reason["paused"] == 1
    assert group.prompt_id == "test/0", "the prompt given back was generated again after the resume"


async def _given_back_as_paused(q: QueueClient) -> Any:
    stats = await q.prompt_stats()
    return stats if stats.abandoned_by_reason.get("paused") else None
