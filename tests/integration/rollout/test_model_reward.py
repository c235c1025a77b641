"""The reward service as the rollout's reward source: groups scored by the real service, and a
reward-service restart mid-run that loses no prompt and pushes none twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from relayrl.net import free_port
from relayrl.redis_process import RedisProcess
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server
from services.reward.client import RewardClient
from tests.integration.reward.conftest import RewardProcess
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import prompt, pull_groups, running_replica, sample_value
from tests.waiting import wait_until_async


@pytest.fixture(scope="module")
def tiny_rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relayrl.models.tiny import init_tiny, preset_spec

    return init_tiny(tmp_path_factory.mktemp("tiny-rm"), preset_spec("tiny-rm"))


async def test_reward_service_restart_loses_no_prompt_and_pushes_none_twice(
    engine: EngineProcess, redis_server: RedisProcess, run_id: str, tiny_rm_dir: Path
) -> None:
    reward = RewardProcess(tiny_rm_dir, free_port()).start()
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    restarted: RewardProcess | None = None
    try:
        async with (
            QueueClient(queue.grpc_address) as q,
            running_replica(
                engine.url,
                queue.grpc_address,
                reward_kind="rule+model",
                reward_model_url=reward.url,
                reward_model_deadline_s=2.0,
                reward_model_retry_wait_s=0.2,
                reward_model_timeout_s=5.0,
                reward_rule_weight=0.5,
                reward_model_weight=2.0,
            ) as replica,
        ):
            await wait_until_async(replica.state.ready, what="engine ready")
            await q.release([prompt(i, n=2) for i in range(2)])
            await wait_until_async(lambda: _completed(q, 2), timeout_s=60, what="2 groups scored and pushed")
            reward.kill()
            await q.release([prompt(i, n=2) for i in range(2, 6)])
            await wait_until_async(
                lambda: _abandoned(q, "reward_unavailable"), timeout_s=60, what="a prompt given back"
            )
            assert sample_value(replica, "reward_service_up") == 0
            assert (await q.prompt_stats()).total_completed == 2
            restarted = RewardProcess(tiny_rm_dir, reward.port).start()
            groups = await pull_groups(queue.grpc_address, 6, timeout_s=90)
            extra = await q.prompt_stats()
            errors = sample_value(replica, "reward_service_errors_total", kind="unavailable")
            async with RewardClient(reward.url, timeout_s=30) as client:
                first = groups[0]
                model_scores = await client.score(
                    [{"input_ids": s.prompt_token_ids + s.response_token_ids} for s in first.samples]
                )
    finally:
        await queue.stop()
        reward.stop()
        if restarted is not None:
            restarted.stop()
    assert sorted(g.prompt_id for g in groups) == [f"test/{i}" for i in range(6)]
    assert extra.total_completed == 6 and not extra.dropped_by_reason
    assert extra.abandoned_by_reason["reward_unavailable"] >= 1
    assert errors >= 1
    for group in groups:
        for sample in group.samples:
            assert not sample.reward_error and "model_score" in sample.reward_extra
            expected = 0.5 * sample.reward_extra["rule_score"] + 2.0 * sample.reward_extra["model_score"]
            assert sample.reward == pytest.approx(expected, abs=1e-6)
    assert [s.reward_extra["model_score"] for s in first.samples] == pytest.approx(model_scores, abs=1e-5)


async def _completed(q: QueueClient, count: int) -> bool:
    return (await q.prompt_stats()).total_completed >= count


async def _abandoned(q: QueueClient, reason: str) -> bool:
    return (await q.prompt_stats()).abandoned_by_reason.get(reason, 0) >= 1
