"""The built-in tasks. Each is small enough for a tiny model to learn on a CPU in minutes.

Scores are in [0, 1]. ``copy_bits``, ``copy`` and ``reverse`` give partial credit per correct character, so
group-normalised advantages carry signal from the very first steps of a random model. ``long_add``
(in :mod:`relayrl.tasks.long_add`) is the reasoning-shaped one: worked answers of 20-300 tokens
that are scored by their final ``#### <result>`` only.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relayrl.tasks import guess, long_add

DATA_SOURCE_PREFIX = "relayrl/"
TRAIN_SPLIT = "train"


def _clean(solution: str) -> str:
    """The answer part of a response: text before the first newline, without spaces."""
    return solution.split("\n", 1)[0].replace(" ", "").strip()


def score_positional(solution: str, ground_truth: str) -> float:
    """Fraction of characters right at their position; extra characters count as wrong."""
    answer = _clean(solution)
    if not ground_truth:
        return float(answer == "")
    hits = sum(a == b for a, b in zip(answer, ground_truth, strict=False))
    return hits / max(len(answer), len(ground_truth))


def score_exact(solution: str, ground_truth: str) -> float:
    return float(_clean(solution) == ground_truth.strip())


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    ability: str
    # (rng, difficulty) -> (question, answer)
    generate: Callable[[random.Random, int], tuple[str, str]]
    score: Callable[[str, str], float]
    description: str
    # question -> the worked solution a demonstration shows; None: the answer is the whole response.
    solve: Callable[[str], str] | None = None
    # question -> whether it belongs to the held-out splits; None: splits differ only by their seed.
    held_out: Callable[[str], bool] | None = None
    # (question, answer, difficulty) -> more extra_info for the row (a multi-turn task's interaction_kwargs).
    extra_info: Callable[[str, str, int], dict[str, Any]] | None = None

    @property
    def data_source(self) -> str:
        return DATA_SOURCE_PREFIX + self.name


def _digits(rng: random.Random, length: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(length))


def _copy_bits(rng: random.Random, length: int) -> tuple[str, str]:
    bits = "".join(rng.choice("01") for _ in range(length))
    return f"copy {bits}", bits


def _copy(rng: random.Random, length: int) -> tuple[str, str]:
    digits = _digits(rng, length)
    return f"copy {digits}", digits


def _reverse(rng: random.Random, length: int) -> tuple[str, str]:
    digits = _digits(rng, length)
    return f"reverse {digits}", digits[::-1]


def _repeat(rng: random.Random, length: int) -> tuple[str, str]:
    """A pattern of up to 96 digits repeated to at most ``length`` characters: long answers, short prompts."""
    pattern = _digits(rng, rng.randint(1, max(1, min(96, length))))
    times = max(1, length // len(pattern))
    return f"repeat {pattern} x{times}", pattern * times


def _add(rng: random.Random, length: int) -> tuple[str, str]:
    high = 10**length - 1
    a, b = rng.randint(0, high), rng.randint(0, high)
    return f"{a}+{b}=", str(a + b)


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("copy_bits", "copy", _copy_bits, score_positional, "Repeat a string of bits (the demo's task)."),
        Task("copy", "copy", _copy, score_positional, "Repeat a string of digits."),
        Task("reverse", "reverse", _reverse, score_positional, "Reverse a string of digits."),
        Task(
            "repeat",
            "copy",
            _repeat,
            score_positional,
            "Repeat a digit pattern k times; difficulty is the answer's length (up to hundreds of tokens).",
        ),
        Task("add", "arithmetic", _add, score_exact, "Add two non-negative integers."),
        Task(
            "long_add",
            "arithmetic",
            long_add.generate,
            long_add.score,
            "Add two numbers of `difficulty` digits column by column with carries, ending in '#### <sum>'.",
            solve=long_add.solve,
            held_out=long_add.is_held_out,
        ),
        Task(
            "guess",
            "agent",
            guess.generate,
            guess.score,
            "Multi-turn: find a secret number in `difficulty` guesses from the interaction's 'higher'/'lower'.",
            extra_info=guess.interaction_kwargs,
        ),
    )
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown built-in task {name!r}; choose one of {sorted(TASKS)}") from None


def _draw(task: Task, rng: random.Random, difficulty: int, split: str) -> tuple[str, str]:
    """One question and answer of ``split``: a task with a held-out part redraws until it is on the split's side."""
    while True:
        question, answer = task.generate(rng, difficulty)
        if task.held_out is None or task.held_out(question) == (split != TRAIN_SPLIT):
            return question, answer


def make_rows(
    name: str, count: int, seed: int = 0, difficulty: int = 1, split: str = TRAIN_SPLIT
) -> list[dict[str, Any]]:
    """``count`` verl-format rows of task ``name``; the same seed gives the same rows.

    Every split but ``train`` is held out: for a task with a ``held_out`` partition its questions
    are never training questions.
    """
    task = get_task(name)
    rng = random.Random(f"{name}/{split}/{seed}/{difficulty}")
    rows = []
    for index in range(count):
        question, answer = _draw(task, rng, difficulty, split)
        extra = task.extra_info(question, answer, difficulty) if task.extra_info else {}
        rows.append(
            {
                "data_source": task.data_source,
                "prompt": [{"role": "user", "content": question}],
                "ability": task.ability,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "difficulty": difficulty, **extra},
            }
        )
    return rows


def make_sft_rows(
    name: str, count: int, seed: int = 0, difficulty: int = 1, split: str = TRAIN_SPLIT
) -> list[dict[str, Any]]:
    """``count`` demonstrations in verl's SFT format, for the questions :func:`make_rows` gives.

    ``prompt`` is the user's question and ``response`` the worked solution where the task has one,
    else the answer itself.
    """
    task = get_task(name)
    demonstrations = []
    for row in make_rows(name, count, seed=seed, difficulty=difficulty, split=split):
        question, answer = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        demonstrations.append(
            {
                "prompt": question,
                "response": task.solve(question) if task.solve else answer,
                "data_source": row["data_source"],
                "extra_info": {**row["extra_info"], "answer": answer},
            }
        )
    return demonstrations


def score_builtin(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """verl's ``compute_score`` for the built-in tasks."""
    if not data_source.startswith(DATA_SOURCE_PREFIX):
        raise ValueError(f"{data_source!r} is not a built-in task (expected prefix {DATA_SOURCE_PREFIX!r})")
    return get_task(data_source.removeprefix(DATA_SOURCE_PREFIX)).score(solution_str, ground_truth)
