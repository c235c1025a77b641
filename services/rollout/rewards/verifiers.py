"""Rule-based verifiers with verl's ``compute_score`` signature; each returns 1.0 or 0.0."""

from __future__ import annotations

import re
from typing import Any

# verl's GSM8K convention: the final answer follows "#### ".
_GSM8K_ANSWER = re.compile(r"####\s*(-?[0-9.,$]+)")


def extract_gsm8k_answer(solution: str) -> str | None:
    """The last ``#### <number>`` of ``solution``, without commas, dollar signs or a trailing dot."""
    found = _GSM8K_ANSWER.findall(solution)
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "").rstrip(".")


def _same_number(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


def gsm8k(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    answer = extract_gsm8k_answer(solution_str)
    truth = extract_gsm8k_answer(ground_truth) or ground_truth.strip().replace(",", "")
    return float(answer is not None and _same_number(answer, truth))


def boxed_math(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """Equivalence of the answer (``\\boxed{}`` or the last expression) with the truth, by math-verify."""
    from math_verify import parse, verify

    # math-verify's own timeouts use SIGALRM, which only works on the main thread; rewards run
    # on worker threads and RewardRunner enforces the timeout instead.
    truth_text = ground_truth if "\\boxed" in ground_truth or "$" in ground_truth else f"${ground_truth}$"
    gold = parse(truth_text, parsing_timeout=None)
    answer = parse(solution_str, parsing_timeout=None)
    if not gold or not answer:
        return 0.0
    return float(verify(gold, answer, timeout_seconds=None))


def exact_match(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    return float(solution_str.strip() == ground_truth.strip())
