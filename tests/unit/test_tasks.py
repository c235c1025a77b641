import re

import pytest

from relayrl.tasks import TASKS, make_rows, make_sft_rows, score_builtin
from relayrl.tasks.long_add import is_held_out


def test_rows_are_verl_format_and_reproducible():
    rows = make_rows("add", 5, seed=3)
    assert rows == make_rows("add", 5, seed=3)
    assert rows != make_rows("add", 5, seed=4)
    row = rows[0]
    assert row["prompt"][0]["role"] == "user"
    assert row["reward_model"]["style"] == "rule"
    assert row["data_source"] == "relayrl/add"


@pytest.mark.parametrize("name", sorted(name for name, task in TASKS.items() if task.solve is None))
def test_ground_truth_scores_one(name):
    for row in make_rows(name, 20, difficulty=2):
        truth = row["reward_model"]["ground_truth"]
        assert score_builtin(row["data_source"], truth, truth) == 1.0


@pytest.mark.parametrize("name", sorted(TASKS))
def test_demonstrations_score_one(name):
    for row in make_sft_rows(name, 20, difficulty=2):
        truth = row["extra_info"]["answer"]
        assert score_builtin(row["data_source"], row["response"], truth) == 1.0


def test_partial_credit_per_position():
    assert score_builtin("relayrl/copy", "12x", "123") == pytest.approx(2 / 3)
    assert score_builtin("relayrl/copy", "1234", "12") == pytest.approx(0.5)
    assert score_builtin("relayrl/reverse", "", "12") == 0.0


def test_answer_is_text_before_the_first_newline():
    assert score_builtin("relayrl/add", "12\nsome rambling", "12") == 1.0
    assert score_builtin("relayrl/add", "13", "12") == 0.0


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="built-in task"):
        score_builtin("relayrl/nope", "1", "1")
    with pytest.raises(ValueError, match="not a built-in task"):
        score_builtin("openai/gsm8k", "1", "1")


# Rows computed before long_add existed: users' saved datasets and seeds must keep meaning the same prompts.
_ROWS_BEFORE_LONG_ADD = {
    ("add", 1, 4, "train"): [
        ("7746+2920=", "10666", "arithmetic"),
        ("6887+4902=", "11789", "arithmetic"),
    ],
    ("copy_bits", 5, 3, "val"): [("copy 111", "111", "copy"), ("copy 010", "010", "copy")],
    ("repeat", 2, 12, "train"): [("repeat 29072 x2", "2907229072", "copy"), ("repeat 5767071 x1", "5767071", "copy")],
    ("reverse", 0, 6, "train"): [("reverse 613144", "441316", "reverse")],
}


@pytest.mark.parametrize(("name", "seed", "difficulty", "split"), sorted(_ROWS_BEFORE_LONG_ADD))
def test_existing_tasks_give_the_same_rows_as_before(name, seed, difficulty, split):
    expected = _ROWS_BEFORE_LONG_ADD[(name, seed, difficulty, split)]
    rows = make_rows(name, len(expected), seed=seed, difficulty=difficulty, split=split)
    assert rows == [
        {
            "data_source": f"relayrl/{name}",
            "prompt": [{"role": "user", "content": question}],
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "difficulty": difficulty},
        }
        for index, (question, answer, ability) in enumerate(expected)
    ]


_COLUMN = re.compile(r"(\d)\+(\d)\+([01])=(\d+) carry ([01])")


def _check_worked_addition(question: str, response: str) -> None:
    """Recomputes every column line of a long_add solution and the result it ends in."""
    a, b = question.removesuffix(" step by step").split("+")
    *columns, last = response.split("\n")
    assert len(columns) == len(a) == len(b)
    carry, digits = 0, ""
    for line, x, y in zip(columns, reversed(a), reversed(b), strict=True):
        match = _COLUMN.fullmatch(line)
        assert match, line
        assert (match[1], match[2], int(match[3])) == (x, y, carry)
        total = int(match[4])
        assert total == int(x) + int(y) + carry and int(match[5]) == total // 10
        carry, digits = total // 10, str(total % 10) + digits
    assert last == f"#### {int(a) + int(b)}" == f"#### {int(str(carry) + digits)}"


@pytest.mark.parametrize("difficulty", range(1, 18))
def test_long_add_solutions_are_right_column_by_column_and_score_one(difficulty):
    for row in make_sft_rows("long_add", 30, seed=difficulty, difficulty=difficulty):
        truth = row["extra_info"]["answer"]
        _check_worked_addition(row["prompt"], row["response"])
        assert len(row["prompt"].split("+")[0]) == difficulty
        assert score_builtin("relayrl/long_add", row["response"], truth) == 1.0
        # The byte-level tokenizer spends one token per character.
        assert 17 * difficulty + 5 <= len(row["response"]) <= 18 * difficulty + 6


def test_long_add_answers_span_20_to_300_tokens_from_difficulty_1_to_16():
    easiest = [len(r["response"]) for r in make_sft_rows("long_add", 200, difficulty=1)]
    hardest = [len(r["response"]) for r in make_sft_rows("long_add", 200, difficulty=16)]
    assert min(easiest) >= 20
    assert min(hardest) >= 270 and max(hardest) <= 300
    assert max(len(r["response"]) for r in make_sft_rows("long_add", 200, difficulty=17)) > 300


def test_long_add_worked_example():
    [row] = make_sft_rows("long_add", 1, seed=0, difficulty=4)
    assert row["prompt"] == "1359+5996 step by step"
    assert row["response"] == ("9+6+0=15 carry 1\n5+9+1=15 carry 1\n3+9+1=13 carry 1\n1+5+1=7 carry 0\n#### 7355")


@pytest.mark.parametrize(
    ("solution", "score"),
    [
        ("9+6+0=15 carry 1\n#### 7355", 1.0),
        ("#### 7355", 1.0),
        ("#### 7356", 0.0),
        ("7355", 0.0),
        ("the sum is 7355", 0.0),
        ("####", 0.0),
        ("#### \n7355", 0.0),
        ("####   7355  \n", 1.0),
        ("####7355", 1.0),
        ("#### 7,355", 1.0),
        ("#### 73 55", 0.0),
        ("#### 1\n#### 7355", 1.0),
        ("#### 7355\n#### 1", 0.0),
        ("#### 7355\n####", 0.0),
    ],
)
def test_long_add_scores_only_the_number_after_the_last_marker(solution, score):
    assert score_builtin("relayrl/long_add", solution, "7355") == score


def _questions(count, difficulty, split):
    return {r["prompt"][0]["content"] for r in make_rows("long_add", count, seed=0, difficulty=difficulty, split=split)}


@pytest.mark.parametrize("difficulty", [2, 3, 8])
def test_long_add_held_out_questions_are_never_training_questions(difficulty):
    train, held_out = _questions(5000, difficulty, "train"), _questions(500, difficulty, "val")
    assert len(held_out) > 300 and not train & held_out
    assert all(is_held_out(q) for q in held_out) and not any(is_held_out(q) for q in train)


def test_long_add_splits_partition_the_hundred_one_digit_questions():
    train, held_out = _questions(2000, 1, "train"), _questions(500, 1, "val")
    assert len(train | held_out) == 100 and not train & held_out
    # About a tenth held out; with only 100 questions the hash's share drifts from it.
    assert 3 <= len(held_out) <= 30


def test_long_add_needs_at_least_one_digit():
    with pytest.raises(ValueError, match="at least 1 digit"):
        make_rows("long_add", 1, difficulty=0)


def test_sft_rows_are_verl_sft_format_for_the_questions_of_the_rl_rows():
    rl_rows = make_rows("long_add", 3, seed=7, difficulty=5, split="val")
    sft_rows = make_sft_rows("long_add", 3, seed=7, difficulty=5, split="val")
    assert [r["prompt"] for r in sft_rows] == [r["prompt"][0]["content"] for r in rl_rows]
    for rl, sft in zip(rl_rows, sft_rows, strict=True):
        assert set(sft) == {"prompt", "response", "data_source", "extra_info"}
        assert sft["data_source"] == rl["data_source"] == "relayrl/long_add"
        assert sft["response"].endswith("#### " + rl["reward_model"]["ground_truth"])
        assert sft["extra_info"] == {**rl["extra_info"], "answer": rl["reward_model"]["ground_truth"]}
    assert rl_rows[0]["ability"] == "arithmetic"
    copy = make_sft_rows("copy", 2, seed=1, difficulty=3)
    assert [r["response"] for r in copy] == [
        r["reward_model"]["ground_truth"] for r in make_rows("copy", 2, seed=1, difficulty=3)
    ]
