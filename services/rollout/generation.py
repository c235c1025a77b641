"""Generating one sample through the engine, across weight updates (partial rollout).

A request that comes back with ``finish_reason.type == "abort"`` was interrupted: by a weight
update in ``abort_resume`` / ``restart`` mode, or by a pause in abort mode. Then

- ``abort_resume`` (and ``in_place``, whose weight updates never abort) resubmits prompt +
  tokens so far with the remaining budget; each token keeps the version that produced it;
- ``restart`` throws the partial response away and starts again.

A paused engine holds resubmitted requests until it continues, so nothing here waits for a
resume itself.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from services.engine.client import EngineClient, EngineError, GenerateOutput, SamplingParams

# An engine that aborts the same sample this many times in a row is broken, not paused.
MAX_RESUBMITS = 64

# Awaited before each resubmission: holds it while the replica is paused (see pause_bound.py).
Gate = Callable[[], Awaitable[None]]


class GenerationError(RuntimeError):
    """A sample could not be generated; its prompt is given back to the queue."""


@dataclass(slots=True)
class SampleResult:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = ""
    text: str = ""
    engine_s: float = 0.0
    # How many times the sample was resubmitted after an abort.
    resubmits: int = 0
    # Multi-turn episodes only (empty otherwise), as in relayrl.schema.Sample.
    loss_mask: list[int] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    token_rewards: list[float] = field(default_factory=list)
    # What the reward function scores; None: ``text``. An episode's is its last model turn.
    solution_text: str | None = None
    # Episode-level extras (tool rewards), merged into the sample's reward_extra.
    extra: dict[str, float] = field(default_factory=dict)


def parse_version(version: str, fallback: int) -> int:
    """RelayRL writes integer policy versions into SGLang's string ``weight_version``."""
    try:
        return int(version)
    except ValueError:
        return fallback


def _params(sampling: SamplingParams, max_new_tokens: int, n: int = 1) -> SamplingParams:
    return replace(sampling, max_new_tokens=max_new_tokens, n=n)


def _absorb(result: SampleResult, out: GenerateOutput, mode: str, held_version: int) -> SampleResult:
    """Adds one engine output to ``result``; returns the result to continue (restart: a fresh one)."""
    if len(out.logprobs) != len(out.output_ids):
        raise EngineError(f"{len(out.logprobs)} logprobs for {len(out.output_ids)} tokens")
    if out.finish_reason == "abort":
        if mode == "restart":
            return SampleResult(engine_s=result.engine_s, resubmits=result.resubmits + 1)
        result.resubmits += 1
    result.output_ids += out.output_ids
    result.logprobs += out.logprobs
    result.versions += [parse_version(v, held_version) for v in out.token_versions()]
    # Segments are decoded separately; joined they are the response (byte-level tokenizers
    # may split one multi-byte character across a resubmission).
    result.text += out.text
    if out.finish_reason != "abort":
        result.finish_reason = out.finish_reason
    return result


async def generate_group(
    engine: EngineClient,
    prompt_ids: list[int],
    sampling: SamplingParams,
    n: int,
    mode: str,
    held_version: int,
    rid: str,
    gate: Gate | None = None,
) -> list[SampleResult]:
    """The ``n`` samples of one prompt: one request with ``n`` (the engine shares the prefill and
    the HTTP round trip); samples a weight update interrupted continue together (:func:`continue_samples`)."""
    started = time.perf_counter()
    outputs = await engine.generate(prompt_ids, _params(sampling, sampling.max_new_tokens, n), rid=rid)
    elapsed = time.perf_counter() - started
    if len(outputs) != n:
        raise EngineError(f"asked for {n} samples, engine returned {len(outputs)}")
    results = [_absorb(SampleResult(engine_s=elapsed), out, mode, held_version) for out in outputs]
    if all(r.finish_reason for r in results):
        return results
    return await continue_samples(engine, prompt_ids, sampling, mode, held_version, rid, results, gate)


async def continue_sample(
    engine: EngineClient,
    prompt_ids: list[int],
    sampling: SamplingParams,
    mode: str,
    held_version: int,
    rid: str,
    result: SampleResult,
    gate: Gate | None = None,
) -> SampleResult:
    """Resubmits an interrupted sample (prompt + tokens so far, remaining budget) until it finishes."""
    (done,) = await continue_samples(engine, prompt_ids, sampling, mode, held_version, rid, [result], gate)
    return done


async def continue_samples(
    engine: EngineClient,
    prompt_ids: list[int],
    sampling: SamplingParams,
    mode: str,
    held_version: int,
    rid: str,
    results: list[SampleResult],
    gate: Gate | None = None,
) -> list[SampleResult]:
    """Resubmits the unfinished ones of ``results`` (samples of one prompt) until each finishes.

    All that a weight update interrupted go back in one batched request, not one each: in
    ``abort_resume`` mode every switch interrupts every sample in flight, and a request apiece
    (the engine parsing and the rollout answering each) slowed the switches themselves.
    """
    results = list(results)
    for attempt in range(MAX_RESUBMITS + 1):
        todo = []
        for i, result in enumerate(results):
            if result.finish_reason:
                continue
            if result.resubmits > MAX_RESUBMITS:
                raise GenerationError(f"sample {rid}-{i} aborted {MAX_RESUBMITS} times in a row")
            if len(result.output_ids) >= sampling.max_new_tokens:
                result.finish_reason = "length"
                continue
            todo.append(i)
        if not todo:
            return results
        if gate is not None:
            await gate()
        inputs = [prompt_ids + results[i].output_ids for i in todo]
        params = [_params(sampling, sampling.max_new_tokens - len(results[i].output_ids)) for i in todo]
        rids = [f"{rid}-{i}-{attempt}" for i in todo]
        started = time.perf_counter()
        if len(todo) == 1:
            outputs = await engine.generate(inputs[0], params[0], rid=rids[0])
        else:
            outputs = await engine.generate_batch(inputs, params, rids)
        elapsed = time.perf_counter() - started
        if len(outputs) != len(todo):
            raise EngineError(f"asked for {len(todo)} samples, engine returned {len(outputs)}")
        for i, out in zip(todo, outputs, strict=True):
            results[i].engine_s += elapsed
            results[i] = _absorb(results[i], out, mode, held_version)
    raise GenerationError(f"samples of {rid} aborted {MAX_RESUBMITS} times in a row")
