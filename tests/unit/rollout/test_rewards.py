from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.rollout.rewards import RewardRunner, resolve_reward
from services.rollout.rewards.registry import by_data_source
from services.rollout.rewards.verifiers import boxed_math, exact_match, extract_gsm8k_answer, gsm8k


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("She pays 3 * 4 = 12 dollars.\n#### 12", "12", 1.0),
        ("#### 1,234", "1234", 1.0),
        ("#### $18.", "18", 1.0),
        ("#### 13", "12", 0.0),
        ("the answer is 12", "12", 0.0),
        ("#### 7 then #### 12", "Natalia sold 48/2 = 24 clips.\n#### 12", 1.0),
    ],
)
def test_gsm8k_reads_the_last_hash_answer(solution: str, truth: str, expected: float) -> None:
    assert gsm8k("openai/gsm8k", solution, truth) == expected


def test_gsm8k_extraction_without_answer_is_none() -> None:
    assert extract_gsm8k_answer("no marker here") is None


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("so the result is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("no answer", "4", 0.0),
    ],
)
def test_boxed_math_uses_math_verify_equivalence(solution: str, truth: str, expected: float) -> None:
    assert boxed_math("lighteval/MATH", solution, truth) == expected


def test_dispatch_by_data_source() -> None:
    assert by_data_source("relayrl/copy", "123", "123") == 1.0
    assert by_data_source("relayrl/add", "124", "123") == 0.0
    assert by_data_source("openai/gsm8k", "#### 5", "5") == 1.0
    assert by_data_source("DigitalLearningGmbH/MATH-lighteval", "\\boxed{5}", "5") == 1.0
    assert by_data_source("my/qa", " yes ", "yes") == exact_match("x", "yes", "yes") == 1.0


def test_resolve_reward_names_and_import_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "verl_reward_file.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth), 'len': len(solution_str)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = resolve_reward("verl_reward_file:compute_score")
    assert fn("d", "ab", "ab") == {"score": 1.0, "len": 2}
    assert resolve_reward("gsm8k") is gsm8k
    for bad in ("nope", "no_such_module_xyz:f", "verl_reward_file:missing"):
        with pytest.raises(ValueError):
            resolve_reward(bad)


def _raises(*_: object) -> float:
    raise RuntimeError("boom")


def _hangs(*_: object) -> float:
    time.sleep(2)  # a reward function that outlives its timeout
    return 1.0


async def test_runner_turns_exceptions_and_timeouts_into_zero_with_an_error() -> None:
    runner = RewardRunner(_raises, timeout_s=1.0)
    outcome = await runner.score("d", "s", "t", None)
    assert outcome.reward == 0.0 and "boom" in outcome.error
    runner = RewardRunner(_hangs, timeout_s=0.1)
    started = time.monotonic()
    outcome = await runner.score("d", "s", "t", None)
    assert outcome.reward == 0.0 and "timed out" in outcome.error
    assert time.monotonic() - started < 1.0
    runner.close()


@pytest.mark.parametrize(
    ("returned", "reward", "extra", "failed"),
    [
        (0.75, 0.75, {}, False),
        (True, 1.0, {}, False),
        ({"score": 0.5, "acc": True, "note": "text"}, 0.5, {"acc": 1.0}, False),
        ({"acc": 1.0}, 0.0, {}, True),
        ("high", 0.0, {}, True),
        (float("nan"), 0.0, {}, True),
    ],
)
async def test_runner_accepts_verl_return_shapes(returned: object, reward: float, extra: dict, failed: bool) -> None:
    runner = RewardRunner(lambda *_: returned, timeout_s=1.0)
    outcome = await runner.score("d", "s", "t", None)
    runner.close()
    assert outcome.reward == reward and outcome.extra == extra and bool(outcome.error) == failed
