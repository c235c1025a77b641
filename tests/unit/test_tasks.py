import pytest

from relayrl.tasks import TASKS, make_rows, score_builtin


def test_rows_are_verl_format_and_reproducible():
    rows = make_rows("add", 5, seed=3)
    assert rows == make_rows("add", 5, seed=3)
    assert rows != make_rows("add", 5, seed=4)
    row = rows[0]
    assert row["prompt"][0]["role"] == "user"
    assert row["reward_model"]["style"] == "rule"
    assert row["data_source"] == "relayrl/add"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_ground_truth_scores_one(name):
    for row in make_rows(name, 20, difficulty=2):
        truth = row["reward_model"]["ground_truth"]
        assert score_builtin(row["data_source"], truth, truth) == 1.0


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
