"""The generative judge's text handling: the template it completes and the verdict it gives."""

from __future__ import annotations

import pytest

from services.reward.config import DEFAULT_VERDICT_REGEX
from services.reward.judge import Verdict, VerdictParser, render_judge_prompt


@pytest.mark.parametrize(
    ("output", "verdict"),
    [
        ("7", Verdict(7.0, True)),
        (" 8.5/10, good", Verdict(8.5, True)),
        ("Yes.", Verdict(1.0, True)),
        ("no, it is wrong", Verdict(0.0, True)),
        ("score: -2", Verdict(-2.0, True)),
        ("nothing useful", Verdict(-1.0, False)),
        ("", Verdict(-1.0, False)),
    ],
)
def test_the_default_parser_reads_numbers_and_yes_no(output: str, verdict: Verdict) -> None:
    assert VerdictParser(DEFAULT_VERDICT_REGEX, unparsed_score=-1.0)(output) == verdict


def test_the_first_verdict_wins() -> None:
    assert VerdictParser(DEFAULT_VERDICT_REGEX, 0.0)("3 then 9") == Verdict(3.0, True)


def test_a_pattern_without_groups_uses_the_whole_match() -> None:
    assert VerdictParser(r"\d+", 0.0)("rating 42 of 50") == Verdict(42.0, True)


def test_a_match_that_is_no_number_is_unparsed() -> None:
    assert VerdictParser(r"VERDICT: (\w+)", 0.5)("VERDICT: maybe") == Verdict(0.5, False)
    assert VerdictParser(r"(\S+)", 0.5)("nan") == Verdict(0.5, False)


def test_the_template_takes_prompt_and_response_once() -> None:
    text = render_judge_prompt("Q: {prompt}\nA: {response}\n", "what is {response}?", "{prompt} {x}")
    assert text == "Q: what is {response}?\nA: {prompt} {x}\n"
