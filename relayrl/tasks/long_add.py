"""``long_add``: addition written out column by column, the built-in reasoning-shaped task.

The question is ``"<a>+<b> step by step"``, two operands of exactly ``difficulty`` digits (a
leading digit of 1-9, except at difficulty 1, where 0-9 are allowed). The worked solution has one
line per column, from the rightmost to the leftmost, then the result in GSM8K's style::

    <digit of a>+<digit of b>+<carry in>=<column sum> carry <carry out>
    ...
    #### <a+b>

For example ``5907+3215 step by step`` is worked as::

    7+5+0=12 carry 1
    0+1+1=2 carry 0
    9+2+0=11 carry 1
    5+3+1=9 carry 0
    #### 9122

The carry in of a line is the carry out of the line above (0 for the first), and the result is
the last carry (if 1) followed by each line's last sum digit read from the bottom up.

Length, in tokens of the byte-level tokenizer (one per character): a column line is 16 or 17
with its newline and the last line is 5 plus the result's ``d`` or ``d + 1`` digits, so an answer
at difficulty ``d`` has ``17d + 5`` to ``18d + 6`` tokens: 22-24 at difficulty 1, 277-294 at 16
(the largest difficulty that stays within 300 tokens), 294-312 at 17.

The ground truth is the result alone, and :func:`score` reads only what follows the last
``####``, as verl's GSM8K ``compute_score`` does. The held-out split is a fixed tenth of the
question space (by a hash of the question), so no held-out question is ever a training question,
whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
import re

HELD_OUT_FRACTION = 0.1
ANSWER_MARK = "####"

_QUESTION = re.compile(r"(\d+)\+(\d+) step by step")
# verl's GSM8K answer: a number, on the marker's line, that may carry thousands separators.
_NUMBER = re.compile(r"[ \t]*(-?[0-9.,]+)")


def generate(rng: random.Random, difficulty: int) -> tuple[str, str]:
    """A question with two operands of ``difficulty`` digits, and their sum."""
    if difficulty < 1:
        raise ValueError(f"long_add needs a difficulty of at least 1 digit, got {difficulty}")
    low = 0 if difficulty == 1 else 10 ** (difficulty - 1)
    high = 10**difficulty - 1
    a, b = rng.randint(low, high), rng.randint(low, high)
    return f"{a}+{b} step by step", str(a + b)


def solve(question: str) -> str:
    """The worked solution of ``question``: one line per column, then ``#### <sum>``."""
    match = _QUESTION.fullmatch(question)
    if match is None:
        raise ValueError(f"{question!r} is not a long_add question ('<a>+<b> step by step')")
    a, b = match.groups()
    width = max(len(a), len(b))
    lines, carry = [], 0
    for x, y in zip(reversed(a.zfill(width)), reversed(b.zfill(width)), strict=True):
        total = int(x) + int(y) + carry
        lines.append(f"{x}+{y}+{carry}={total} carry {total // 10}")
        carry = total // 10
    lines.append(f"{ANSWER_MARK} {int(a) + int(b)}")
    return "\n".join(lines)


def extract_answer(solution: str) -> str | None:
    """The number right after the last ``####``, without commas; None when there is none."""
    _, mark, tail = solution.rpartition(ANSWER_MARK)
    match = _NUMBER.match(tail) if mark else None
    return match.group(1).replace(",", "") if match else None


def score(solution: str, ground_truth: str) -> float:
    """1.0 when the final answer is the ground truth exactly, else 0.0 (also with no ``####``)."""
    return float(extract_answer(solution) == ground_truth.strip())


def is_held_out(question: str) -> bool:
    """Whether ``question`` belongs to the held-out split; a hash, so every process agrees."""
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:8], "big") < HELD_OUT_FRACTION * 2**64
