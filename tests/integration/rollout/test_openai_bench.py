"""``relayrl bench openai`` end to end on a short run: both paths generate every episode's turns
against a real engine process, and the ratio is the one of the two rates it reports."""

from __future__ import annotations

import asyncio

from services.rollout.openai_bench import run_bench

EPISODES, TURNS, MAX_TOKENS = 2, 2, 4


async def test_a_short_openai_bench_reports_both_paths_and_their_ratio():
    result = await asyncio.to_thread(run_bench, EPISODES, TURNS, MAX_TOKENS, 2, 1)
    most = EPISODES * TURNS * MAX_TOKENS
    # No turn generates beyond its budget.
    assert 0 < result.native_tokens <= most
    assert 0 < result.openai_tokens <= most
    assert result.native_tokens_per_s > 0 and result.openai_tokens_per_s > 0
    assert abs(result.ratio - result.openai_tokens_per_s / result.native_tokens_per_s) < 0.01
    assert (result.preset, result.episodes, result.turns, result.rounds) == ("tiny", EPISODES, TURNS, 1)
