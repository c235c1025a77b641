from __future__ import annotations

import pytest

from services.engine.client import EngineError, GenerateOutput, SamplingParams
from services.rollout.generation import parse_version


def _body(**meta: object) -> dict:
    base = {
        "id": "r1",
        "finish_reason": {"type": "length", "length": 3},
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, None], [-0.3, 9, None]],
        "weight_version": "4",
    }
    base.update(meta)
    return {"text": "abc", "output_ids": [7, 8, 9], "meta_info": base}


def test_parses_sglang_generate_answer() -> None:
    out = GenerateOutput.from_sglang(_body())
    assert (out.rid, out.output_ids, out.logprobs, out.finish_reason) == ("r1", [7, 8, 9], [-0.1, -0.2, -0.3], "length")
    assert out.token_versions() == ["4", "4", "4"]


def test_weight_version_spans_give_per_token_versions() -> None:
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}]
    assert GenerateOutput.from_sglang(_body(weight_versions=spans)).token_versions() == ["3", "3", "4"]


def test_answer_not_in_sglang_shape_is_an_engine_error() -> None:
    with pytest.raises(EngineError):
        GenerateOutput.from_sglang({"text": "x"})


def test_sampling_params_are_sglang_keys() -> None:
    body = SamplingParams(max_new_tokens=5, n=2, stop_token_ids=[1]).to_json()
    assert body == {
        "max_new_tokens": 5,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "n": 2,
        "ignore_eos": False,
        "stop_token_ids": [1],
    }


def test_non_integer_versions_fall_back_to_the_held_one() -> None:
    assert parse_version("12", 0) == 12
    assert parse_version("default", 3) == 3
