"""``relayrl bench openai`` end to end on a short run: both paths generate every episode's turns
against a real engine process, the ratio is the one of the two rates it reports, and each path's
engine passes are its own."""

from __future__ import annotations

import asyncio

from services.rollout.openai_bench import run_bench

EPISODES, TURNS, MAX_TOKENS = 2, 2, 4


async def test_a_short_openai_bench_reports_both_paths_their_ratio_and_their_engine_passes():
    concurrency = 2
    result = await asyncio.to_thread(run_bench, EPISODES, TURNS, MAX_TOKENS, concurrency, 1)
    most = EPISODES * TURNS * MAX_TOKENS
    # No turn generates beyond its budget.
    assert 0 < result.native_tokens <= most
    assert 0 < result.openai_tokens <= most
    assert result.native_tokens_per_s > 0 and result.openai_tokens_per_s > 0
    assert abs(result.ratio - result.openai_tokens_per_s / result.native_tokens_per_s) < 0.01
    assert (result.preset, result.episodes, result.turns, result.rounds) == ("tiny", EPISODES, TURNS, 1)
    turns = EPISODES * TURNS
    paths = {
        "native": (result.native_tokens, result.native_prefill_passes, result.native_decode_passes),
        "openai": (result.openai_tokens, result.openai_prefill_passes, result.openai_decode_passes),
    }
    for path, (tokens, prefill, decode) in paths.items():
        # Every turn is prefilled once, alone or beside the other episode's turn.
        assert 1 <= prefill <= turns, (path, prefill)
        # A turn's first token comes from its prefill; each later one from a decode pass that the
        # turn shares with at most one other.
        assert (tokens - turns) / concurrency <= decode <= tokens - turns, (path, tokens, decode)
