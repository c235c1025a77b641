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
from dataclasses import dataclass, field

from services.rollout.engine_client import EngineClient, EngineError, SamplingParams

# An engine that aborts the same sample this many times in a row is broken, not paused.
MAX_RESUBMITS = 64


class GenerationError(RuntimeError):
    """A sample could not be generated; its prompt stays leased until the lease expires."""


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


def parse_version(version: str, fallback: int) -> int:
    """RelayRL writes integer policy versions into SGLang's string ``weight_version``."""
    try:
        return int(version)
    except ValueError:
        return fallback


async def generate_sample(
    engine: EngineClient,
    prompt_ids: list[int],
    sampling: SamplingParams,
    mode: str,
    held_version: int,
    rid: str,
) -> SampleResult:
    result = SampleResult()
    budget = sampling.max_new_tokens
    for attempt in range(MAX_RESUBMITS + 1):
        remaining = budget - len(result.output_ids)
        if remaining <= 0:
            result.finish_reason = "length"
            return result
        params = SamplingParams(
            max_new_tokens=remaining,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop_token_ids=sampling.stop_token_ids,
            ignore_eos=sampling.ignore_eos,
        )
        started = time.perf_counter()
        outputs = await engine.generate(prompt_ids + result.output_ids, params, rid=f"{rid}-{attempt}")
        result.engine_s += time.perf_counter() - started
        if len(outputs) != 1:
            raise EngineError(f"asked for 1 sample, engine returned {len(outputs)}")
        out = outputs[0]
        if len(out.logprobs) != len(out.output_ids):
            raise EngineError(f"{len(out.logprobs)} logprobs for {len(out.output_ids)} tokens")
        if out.finish_reason == "abort" and mode == "restart":
            result = SampleResult(engine_s=result.engine_s, resubmits=result.resubmits + 1)
            continue
        result.output_ids += out.output_ids
        result.logprobs += out.logprobs
        result.versions += [parse_version(v, held_version) for v in out.token_versions()]
        # Segments are decoded separately; joined they are the response (byte-level tokenizers
        # may split one multi-byte character across a resubmission).
        result.text += out.text
        if out.finish_reason != "abort":
            result.finish_reason = out.finish_reason
            return result
        result.resubmits += 1
    raise GenerationError(f"sample {rid} aborted {MAX_RESUBMITS} times in a row")
