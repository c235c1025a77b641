import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relayrl.models.tokenizer import build_byte_tokenizer
from relayrl.tasks import make_rows
from services.trainer.data import PromptDataset, read_rows, response_budget, tokenize_rows


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def test_builtin_rows_get_the_chat_template(tokenizer):
    rows = tokenize_rows(read_rows("builtin:copy", 3, 2, 0, "train"), tokenizer, "copy", 512)
    text = tokenizer.decode(rows[0].prompt_ids)
    assert text.startswith("<|im_start|>user\ncopy ") and text.endswith("<|im_start|>assistant\n")
    assert rows[0].data_source == "relayrl/copy" and rows[0].prompt_id == "copy/0"
    assert rows[0].ground_truth == text.split("copy ")[1][:2]


def test_parquet_and_jsonl_rows_read_alike(tmp_path, tokenizer):
    raw = make_rows("add", 4, seed=1)
    pq.write_table(pa.Table.from_pylist(raw), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in raw))
    a = tokenize_rows(read_rows(str(tmp_path / "d.parquet"), 0, 1, 0, "train"), tokenizer, "d", 512)
    b = tokenize_rows(read_rows(str(tmp_path / "d.jsonl"), 0, 1, 0, "train"), tokenizer, "d", 512)
    assert a == b and len(a) == 4


def test_bad_dataset_names_are_refused():
    with pytest.raises(ValueError, match="neither"):
        read_rows("/nope.parquet", 1, 1, 0, "train")
    with pytest.raises(ValueError, match="unknown built-in task"):
        read_rows("builtin:chess", 1, 1, 0, "train")


def test_long_prompts_are_skipped(tokenizer):
    rows = read_rows("builtin:copy", 3, 2, 0, "train")
    with pytest.raises(ValueError, match="no usable prompts"):
        tokenize_rows(rows, tokenizer, "copy", max_prompt_tokens=3)


def test_position_survives_a_restart_and_epochs_reshuffle(tokenizer):
    rows = tokenize_rows(read_rows("builtin:copy", 5, 2, 0, "train"), tokenizer, "copy", 512)
    first = PromptDataset(rows, seed=3)
    first.take(3)
    state = first.state_dict()
    expected = [r.prompt_id for r in first.take(6)]
    resumed = PromptDataset(rows, seed=3)
    resumed.load_state_dict(state)
    assert [r.prompt_id for r in resumed.take(6)] == expected
    epoch0 = [r.prompt_id for r in PromptDataset(rows, seed=3).take(5)]
    epoch1 = [r.prompt_id for r in PromptDataset(rows, seed=3).take(10)[5:]]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1


def test_a_row_may_carry_a_smaller_response_budget(tokenizer):
    rows = make_rows("copy", 3)
    rows[0]["extra_info"]["max_new_tokens"] = 4
    rows[1]["extra_info"]["max_new_tokens"] = 500
    prompts = tokenize_rows(rows, tokenizer, "t", max_prompt_tokens=64)
    assert [response_budget(p, 32) for p in prompts] == [4, 32, 32]


def test_a_bad_response_budget_fails_at_load_time(tokenizer):
    rows = make_rows("copy", 1)
    rows[0]["extra_info"]["max_new_tokens"] = "lots"
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        tokenize_rows(rows, tokenizer, "t", max_prompt_tokens=64)
