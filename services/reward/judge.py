"""The generative judge's text around the model: the prompt it completes and the verdict it gives."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_PLACEHOLDER = re.compile(r"\{(prompt|response)\}")


def render_judge_prompt(template: str, prompt: str, response: str) -> str:
    """``template`` with ``{prompt}`` and ``{response}`` replaced in one pass, so braces in the
    texts themselves (code, JSON, a response that quotes ``{prompt}``) are left alone."""
    values = {"prompt": prompt, "response": response}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


@dataclass(frozen=True, slots=True)
class Verdict:
    score: float
    parsed: bool


class VerdictParser:
    """Reads a score from the judge's output: the first match of ``pattern`` (its first group when
    it has one); ``yes`` is 1, ``no`` is 0, a number is itself; anything else is unparsed."""

    def __init__(self, pattern: str, unparsed_score: float) -> None:
        self.pattern = re.compile(pattern)
        self.unparsed_score = unparsed_score

    def __call__(self, text: str) -> Verdict:
        match = self.pattern.search(text)
        if match is None:
            return Verdict(self.unparsed_score, parsed=False)
        found = (match.group(1) if self.pattern.groups else match.group(0)).strip().lower()
        if found == "yes":
            return Verdict(1.0, parsed=True)
        if found == "no":
            return Verdict(0.0, parsed=True)
        try:
            value = float(found)
        except ValueError:
            return Verdict(self.unparsed_score, parsed=False)
        if not math.isfinite(value):
            return Verdict(self.unparsed_score, parsed=False)
        return Verdict(value, parsed=True)
