import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relayrl.models.tokenizer import IM_END, IM_START, build_byte_tokenizer
from services.trainer.sft.data import (
    RowFormat,
    SftExample,
    encode_chat,
    encode_row,
    encode_rows,
    encode_single,
    epoch_batches,
    load_rows,
    truncate,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_byte_tokenizer()


def text(tokenizer, s: str) -> list[int]:
    """Plain text: the byte tokenizer gives one id per character."""
    ids = tokenizer(s, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(s)
    return ids


def header(tokenizer, role: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(IM_START), *text(tokenizer, role + "\n")]


def turn_end(tokenizer) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(IM_END), *text(tokenizer, "\n")]


def test_single_turn_trains_exactly_the_response_and_its_eos(tokenizer):
    example = encode_single(tokenizer, "copy 01", "01")
    user = header(tokenizer, "user") + text(tokenizer, "copy 01") + turn_end(tokenizer)
    prompt = user + header(tokenizer, "assistant")
    response = [*text(tokenizer, "01"), tokenizer.eos_token_id]
    assert example.input_ids == prompt + response
    assert example.loss_mask == [0] * len(prompt) + [1, 1, 1]
    assert example.input_ids[-1] == tokenizer.eos_token_id and example.loss_mask[-1] == 1
    assert example.trained_tokens == 3


def test_a_prompt_given_as_chat_messages_is_templated_as_is(tokenizer):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    example = encode_single(tokenizer, chat, "yo")
    prompt = (
        header(tokenizer, "system")
        + text(tokenizer, "be brief")
        + turn_end(tokenizer)
        + header(tokenizer, "user")
        + text(tokenizer, "hi")
        + turn_end(tokenizer)
        + header(tokenizer, "assistant")
    )
    assert example.input_ids == [*prompt, *text(tokenizer, "yo"), tokenizer.eos_token_id]
    assert example.loss_mask == [0] * len(prompt) + [1] * 3


def test_multi_turn_trains_only_assistant_turns_without_their_headers(tokenizer):
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a22"},
    ]
    example = encode_chat(tokenizer, messages)
    ids, mask = [], []
    for m in messages:
        body = text(tokenizer, m["content"]) + turn_end(tokenizer)
        ids += header(tokenizer, m["role"]) + body
        trained = 1 if m["role"] == "assistant" else 0
        mask += [0] * len(header(tokenizer, m["role"])) + [trained] * len(body)
    assert example.input_ids == ids
    assert example.loss_mask == mask
    # Each assistant turn: its content, then <|im_end|> (the EOS) and the newline, all trained.
    eos_positions = [i for i, t in enumerate(ids) if t == tokenizer.eos_token_id]
    assert [mask[i] for i in eos_positions] == [0, 0, 1, 0, 1]
    assert example.trained_tokens == (2 + 2) + (3 + 2)


def test_a_chat_that_opens_with_the_assistant_is_refused(tokenizer):
    with pytest.raises(ValueError, match="opens with an assistant turn"):
        encode_chat(tokenizer, [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}])


def test_rows_pick_their_format_by_column_and_custom_keys_work(tokenizer):
    fmt = RowFormat(prompt_key="question", response_key="answer", messages_key="chat")
    single = encode_row({"question": "q", "answer": "a"}, tokenizer, fmt)
    assert single == encode_single(tokenizer, "q", "a")
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    multi = encode_row({"chat": chat, "question": "ignored", "answer": "ignored"}, tokenizer, fmt)
    assert multi == encode_chat(tokenizer, chat)
    with pytest.raises(ValueError, match="row 1: has neither 'chat' nor both 'question' and 'answer'"):
        encode_rows([{"question": "q", "answer": "a"}, {"prompt": "q"}], tokenizer, fmt)


def test_truncation_left_keeps_the_end_right_the_start_error_refuses():
    example = SftExample(list(range(10)), [0] * 6 + [1] * 4)
    assert truncate(example, 6, "left") == SftExample([4, 5, 6, 7, 8, 9], [0, 0, 1, 1, 1, 1])
    assert truncate(example, 6, "right") == SftExample([0, 1, 2, 3, 4, 5], [0] * 6)
    assert truncate(example, 10, "error") == example
    with pytest.raises(ValueError, match="10 tokens is longer than max_length=6"):
        truncate(example, 6, "error")


def test_rows_truncated_to_no_response_are_dropped_and_the_rest_kept(tokenizer):
    short = {"prompt": "q", "response": "a"}
    long = {"prompt": "q" * 40, "response": "a"}
    length = len(encode_single(tokenizer, "q", "a").input_ids)
    fmt = RowFormat(max_length=length, truncation="right")
    assert encode_rows([short, long], tokenizer, fmt) == [encode_single(tokenizer, "q", "a")]
    with pytest.raises(ValueError, match="no row has a response token"):
        encode_rows([long], tokenizer, fmt)
    with pytest.raises(ValueError, match=r"row 1: .* longer than max_length"):
        encode_rows([short, long], tokenizer, RowFormat(max_length=length))


def test_parquet_and_jsonl_files_give_the_same_examples(tmp_path, tokenizer):
    chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    rows = [
        {"prompt": "copy 1", "response": "1", "messages": None},
        {"prompt": None, "response": None, "messages": chat},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    fmt = RowFormat()
    a = encode_rows(load_rows(str(tmp_path / "d.parquet"), 0, 1, 0), tokenizer, fmt)
    b = encode_rows(load_rows(str(tmp_path / "d.jsonl"), 0, 1, 0), tokenizer, fmt)
    assert a == b and len(a) == 2


def test_epochs_are_seeded_permutations_of_full_batches():
    first = epoch_batches(10, 4, seed=3, epoch=0)
    assert [len(b) for b in first] == [4, 4]  # the partial last batch is dropped
    assert len({i for b in first for i in b}) == 8
    assert first == epoch_batches(10, 4, seed=3, epoch=0)
    assert first != epoch_batches(10, 4, seed=3, epoch=1)
