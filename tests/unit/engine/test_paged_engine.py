"""The scheduler over the paged KV cache: greedy answers equal a plain forward pass's argmax token for
token (what the engine before the paged cache gave), and aborts, pauses and a full pool leave no
block held."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import torch

from services.engine.kv_pool import BlockPool, KVLayout
from services.engine.model_runner import ModelRunner
from services.engine.sampling import SamplingConfig
from services.engine.scheduler import Scheduler, Sequence
from tests.unit.engine.models import random_causal_lm

PROMPTS = [[(11 * i + 3 * t) % 97 for t in range(5 + 6 * i)] for i in range(5)]


def scheduler_over(
    model: torch.nn.Module, max_blocks: int = 256, cache_bytes: int = 1 << 20, overlap: bool = True
) -> Scheduler:
    pool = BlockPool(KVLayout.of(model), block_size=4, max_blocks=max_blocks, initial_blocks=4)
    runner = ModelRunner(model, pool=pool, prefix_cache_bytes=cache_bytes)
    return Scheduler(runner, lambda ids: "", set(), 64, 512, 256, "0", seed=0, overlap=overlap)


# A step queues its next pass before reading its tokens back, or (disable_overlap_schedule) after.
SCHEDULES = pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])


def sequences(prompts: list[list[int]], config: SamplingConfig) -> list[Sequence]:
    loop = asyncio.get_running_loop()
    return [
        Sequence(f"r{i}", f"r{i}", list(p), config, False, loop, loop.create_future()) for i, p in enumerate(prompts)
    ]


async def on_thread(scheduler: Scheduler, fn: Callable[[], Any]) -> Any:
    return await asyncio.wait_for(scheduler.call(fn), timeout=60)


@SCHEDULES
async def test_greedy_answers_equal_a_plain_forward_pass_token_for_token(overlap: bool) -> None:
    scheduler = scheduler_over(random_causal_lm(), overlap=overlap)
    config = SamplingConfig(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    batch = sequences(PROMPTS, config)
    scheduler.submit(batch)
    scheduler.start()
    try:
        bodies = await asyncio.wait_for(asyncio.gather(*(s.future for s in batch)), timeout=120)
    finally:
        scheduler.stop()
    reference = random_causal_lm()  # the same seeded weights, attention untouched by the engine
    with torch.inference_mode():
        for prompt, body in zip(PROMPTS, bodies, strict=True):
            ids = list(prompt)
            for _ in range(12):
                ids.append(int(torch.argmax(reference(input_ids=torch.tensor([ids])).logits[0, -1])))
            assert body["output_ids"] == ids[len(prompt) :]


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
async def test_pauses_and_aborts_under_load_leave_no_block_held(mode: str) -> None:
    scheduler = scheduler_over(random_causal_lm())
    pool = scheduler.runner.pool
    batch = sequences(PROMPTS * 3, SamplingConfig(max_new_tokens=200, temperature=1.0, ignore_eos=True))
    scheduler.submit(batch)
    scheduler.start()
    try:
        for _ in range(1200):
            if scheduler.generated_tokens > 60:
                break
            await asyncio.sleep(0.05)
        await on_thread(scheduler, lambda: scheduler.pause(mode))
        if mode == "retract":
            # Nothing has finished into the prefix cache, and retracted sequences gave their blocks back.
            assert pool.used_blocks == 0
        elif mode == "in_place":
            assert pool.used_blocks > 0  # running sequences keep theirs
        await on_thread(scheduler, scheduler.resume)
        await on_thread(scheduler, lambda: scheduler.abort(abort_all=True))
        bodies = await asyncio.wait_for(asyncio.gather(*(s.future for s in batch)), timeout=60)
        assert {body["meta_info"]["finish_reason"]["type"] for body in bodies} == {"abort"}
        await on_thread(scheduler, scheduler.runner.prefixes.clear)
        assert pool.used_blocks == 0 and len(scheduler.runner.kv) == 0
    finally:
        scheduler.stop()


@SCHEDULES
async def test_a_full_pool_retracts_and_still_finishes_every_request_with_the_same_answers(overlap: bool) -> None:
    model = random_causal_lm()
    config = SamplingConfig(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    answers = []
    for max_blocks in (256, 24):  # 23 usable blocks of 4 tokens: fewer than the five sequences need at once
        scheduler = scheduler_over(model, max_blocks=max_blocks, cache_bytes=0, overlap=overlap)
        batch = sequences(PROMPTS, config)
        scheduler.submit(batch)
        scheduler.start()
        try:
            bodies = await asyncio.wait_for(asyncio.gather(*(s.future for s in batch)), timeout=120)
        finally:
            scheduler.stop()
        answers.append([body["output_ids"] for body in bodies])
        assert scheduler.runner.pool.used_blocks == 0
    assert all(len(ids) == 30 for ids in answers[1])
    assert answers[1] == answers[0]


async def answers_of(scheduler: Scheduler, configs: list[SamplingConfig]) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    batch = [
        Sequence(f"r{i}", f"r{i}", list(p), config, False, loop, loop.create_future())
        for i, (p, config) in enumerate(zip(PROMPTS, configs, strict=True))
    ]
    scheduler.submit(batch)
    scheduler.start()
    try:
        return await asyncio.wait_for(asyncio.gather(*(s.future for s in batch)), timeout=120)
    finally:
        scheduler.stop()


class RecordingRetractions(Scheduler):
    """Records each retraction as (request id, tokens the sequence had when its next one was sampled)."""

    retractions: list[tuple[str, int]]

    def _retract(self, seq: Sequence) -> None:
        self.retractions.append((seq.rid, len(seq.output_ids)))
        super()._retract(seq)


def recording_scheduler(model: torch.nn.Module) -> RecordingRetractions:
    pool = BlockPool(KVLayout.of(model), block_size=4, max_blocks=24, initial_blocks=4)  # retracts: see above
    scheduler = RecordingRetractions(ModelRunner(model, pool=pool), lambda ids: "", set(), 64, 512, 256, "0", seed=0)
    scheduler.retractions = []
    return scheduler


@SCHEDULES
async def test_stop_tokens_end_answers_where_a_lone_run_does_and_hold_nothing_after(overlap: bool) -> None:
    # A step queues the next pass before it knows which rows sampled their stop token: those rows'
    # next logits must be dropped, their blocks given back, and no token generated for them again.
    model = random_causal_lm()
    greedy = SamplingConfig(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    full = [body["output_ids"] for body in await answers_of(scheduler_over(model, cache_bytes=0), [greedy] * 5)]
    for offset in range(0, 30, 5):
        stops = [ids[(offset + 7 * i) % 30] for i, ids in enumerate(full)]
        configs = [SamplingConfig(max_new_tokens=30, temperature=0.0, stop_token_ids=(stop,)) for stop in stops]
        scheduler = scheduler_over(model, max_blocks=24, cache_bytes=0, overlap=overlap)

        bodies = await answers_of(scheduler, configs)

        for ids, stop, body in zip(full, stops, bodies, strict=True):
            assert body["output_ids"] == ids[: ids.index(stop) + 1]
            assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert scheduler.generated_tokens == sum(len(body["output_ids"]) for body in bodies)
        assert scheduler.runner.pool.used_blocks == 0 and not scheduler.waiting


async def test_a_sequence_retracted_in_the_step_that_samples_its_stop_token_ends_there_once() -> None:
    # Retraction happens while the step's tokens are still on the device: the sequence waits to be
    # prefilled again, then its token turns out to be its last. It must end, and leave the queue.
    model = random_causal_lm()
    greedy = SamplingConfig(max_new_tokens=30, temperature=0.0, ignore_eos=True)
    full = [body["output_ids"] for body in await answers_of(scheduler_over(model, cache_bytes=0), [greedy] * 5)]
    probe = recording_scheduler(model)
    await answers_of(probe, [greedy] * 5)
    rid, at = next((rid, k) for rid, k in probe.retractions if full[int(rid[1:])][k] not in full[int(rid[1:])][:k])
    row = int(rid[1:])
    configs = [greedy] * 5
    configs[row] = SamplingConfig(max_new_tokens=30, temperature=0.0, stop_token_ids=(full[row][at],))
    scheduler = recording_scheduler(model)

    bodies = await answers_of(scheduler, configs)

    assert (rid, at) in scheduler.retractions
    assert bodies[row]["output_ids"] == full[row][: at + 1]
    assert [body["output_ids"] for i, body in enumerate(bodies) if i != row] == full[:row] + full[row + 1 :]
    assert scheduler.generated_tokens == sum(len(body["output_ids"]) for body in bodies)
    assert scheduler.runner.pool.used_blocks == 0 and not scheduler.waiting


@SCHEDULES
async def test_tokens_drawn_from_logits_computed_before_a_weight_change_keep_the_old_version(overlap: bool) -> None:
    # The step after an update draws from logits the old weights computed (their pass was queued
    # before the update): that token is the old version's, the ones after it the new one's.
    scheduler = scheduler_over(random_causal_lm(), overlap=overlap)
    # Long enough that the update lands mid-answer however fast the machine steps.
    batch = sequences(PROMPTS[:2], SamplingConfig(max_new_tokens=200, temperature=0.0, ignore_eos=True))
    scheduler.submit(batch)
    scheduler.start()
    try:
        for _ in range(1200):
            if len(batch[0].output_ids) >= 5:
                break
            await asyncio.sleep(0.01)

        def update() -> int:
            scheduler.set_weight_version("1")
            return len(batch[0].output_ids)

        held = await on_thread(scheduler, update)
        bodies = await asyncio.wait_for(asyncio.gather(*(s.future for s in batch)), timeout=60)
    finally:
        scheduler.stop()

    assert 5 <= held < 200
    assert bodies[0]["meta_info"]["weight_versions"] == [
        {"version": "0", "start": 0, "end": held + 1},
        {"version": "1", "start": held + 1, "end": 200},
    ]
