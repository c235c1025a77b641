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

import asyncio
import time
from dataclasses import dataclass, field, replace

from services.engine.client import EngineClient, EngineError, GenerateOutput, SamplingParams

# An engine that aborts the same sample this many times in a row is broken, not paused.
MAX_RESUBMITS = 64


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
) -> list[SampleResult]:
    """The ``n`` samples of one prompt: one request with ``n`` (the engine shares the prefill and
    the HTTP round trip), then each interrupted sample continues on its own."""
    started = time.perf_counter()
    outputs = await engine.generate(prompt_ids, _params(sampling, sampling.max_new_tokens, n), rid=rid)
    elapsed = time.perf_counter() - started
    if len(outputs) != n:
        raise EngineError(f"asked for {n} samples, engine returned {len(outputs)}")
    results = [_absorb(SampleResult(engine_s=elapsed), out, mode, held_version) for out in outputs]
    unfinished = [i for i, r in enumerate(results) if not r.finish_reason]
    if unfinished:
        resumed = await asyncio.gather(
            *(
                continue_sample(engine, prompt_ids, sampling, mode, held_version, f"{rid}-{i}", results[i])
                for i in unfinished
            )
        )
        for i, result in zip(unfinished, resumed, strict=True):
            results[i] = result
    return results


async def continue_sample(
    engine: EngineClient,
    prompt_ids: list[int],
    sampling: SamplingParams,
    mode: str,
    held_version: int,
    rid: str,
    result: SampleResult,
) -> SampleResult:
    """Resubmits an interrupted sample (prompt + tokens so far, remaining budget) until it finishes."""
    for attempt in range(MAX_RESUBMITS + 1):
        if result.resubmits > MAX_RESUBMITS:
            break
        remaining = sampling.max_new_tokens - len(result.output_ids)
        if remaining <= 0:
            result.finish_reason = "length"
            return result
        started = time.perf_counter()
        outputs = await engine.generate(
            prompt_ids + result.output_ids, _params(sampling, remaining), rid=f"{rid}-{attempt}"
        )
        result.engine_s += time.perf_counter() - started
        if len(outputs) != 1:
            raise EngineError(f"asked for 1 sample, engine returned {len(outputs)}")
        result = _absorb(result, outputs[0], mode, held_version)
        if result.finish_reason:
            return result
    raise GenerationError(f"sample {rid} aborted {MAX_RESUBMITS} times in a row")
