"""SFT rows in verl's formats turned into token ids and a loss mask, and the order they are served in.

A row is single-turn (``prompt_key``/``response_key``: verl's ``SFTDataset``) or multi-turn
(``messages_key``: verl's ``MultiTurnSFTDataset``). The loss mask lines up with ``input_ids``:
1 on every token the model is trained to produce, 0 on prompt, template and padding tokens.

- Single-turn: the prompt becomes one user message through the tokenizer's chat template with
  the generation prompt opened; the response follows with the EOS token, and only the response
  and its EOS carry loss. A prompt given as chat messages (verl's RL rows) is used as they are.
- Multi-turn: the whole chat through the template; each assistant turn carries loss from its
  first content token to the end of its templated turn (for ChatML, the content, ``<|im_end|>``
  and the newline after it, as verl trains them), never its ``<|im_start|>assistant`` header.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from services.trainer.data import BUILTIN_PREFIX, read_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SftExample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token at that position is trained

    @property
    def trained_tokens(self) -> int:
        # The first token has no position before it to predict it from.
        return sum(self.loss_mask[1:])


@dataclass(frozen=True, slots=True)
class RowFormat:
    """Column names and the length rule (verl ``data.*``)."""

    prompt_key: str = "prompt"
    response_key: str = "response"
    messages_key: str = "messages"
    max_length: int = 1024
    truncation: str = "error"


def load_rows(source: str, size: int, difficulty: int, seed: int) -> list[dict[str, Any]]:
    """Rows of a ``.parquet``/``.jsonl`` file, or demonstrations of ``builtin:<task>``."""
    if source.startswith(BUILTIN_PREFIX):
        from relayrl.tasks.registry import make_sft_rows

        return make_sft_rows(source.removeprefix(BUILTIN_PREFIX), size, seed=seed, difficulty=difficulty, split="train")
    return read_rows(source, size, difficulty, seed, "train")


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _templated(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return _ids(tokenizer, text)


def _messages(value: Any) -> list[dict[str, str]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]


def encode_single(tokenizer: Any, prompt: Any, response: str) -> SftExample:
    prompt_ids = _templated(tokenizer, _messages(prompt), generation_prompt=True)
    response_ids = _ids(tokenizer, response + tokenizer.eos_token)
    return SftExample(prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids))


def encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> SftExample:
    """The chat templated once; each assistant turn's span is found by templating the turns before it.

    That needs a template whose output for the first k turns is a prefix of the whole chat's
    (ChatML's is); a template that rewrites earlier turns is refused rather than
    trained on misplaced masks.
    """
    full = _templated(tokenizer, messages, generation_prompt=False)
    mask = [0] * len(full)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if turn == 0:
            raise ValueError("the chat opens with an assistant turn; a trained turn must answer something")
        before = _templated(tokenizer, messages[:turn], generation_prompt=True)
        through = _templated(tokenizer, messages[: turn + 1], generation_prompt=False)
        if full[: len(before)] != before or full[: len(through)] != through:
            raise ValueError(
                f"the chat template does not render turn {turn} as a prefix of the whole chat,"
                " so its tokens cannot be located"
            )
        mask[len(before) : len(through)] = [1] * (len(through) - len(before))
    return SftExample(full, mask)


def truncate(example: SftExample, max_length: int, mode: str) -> SftExample:
    """verl's ``truncation``: ``error`` refuses a longer row, ``left`` keeps its end, ``right`` its start."""
    n = len(example.input_ids)
    if n <= max_length:
        return example
    if mode == "left":
        return SftExample(example.input_ids[-max_length:], example.loss_mask[-max_length:])
    if mode == "right":
        return SftExample(example.input_ids[:max_length], example.loss_mask[:max_length])
    raise ValueError(f"{n} tokens is longer than max_length={max_length} (truncation=error; or use left/right)")


def encode_row(row: dict[str, Any], tokenizer: Any, fmt: RowFormat) -> SftExample:
    if row.get(fmt.messages_key) is not None:
        example = encode_chat(tokenizer, _messages(row[fmt.messages_key]))
    elif row.get(fmt.prompt_key) is not None and row.get(fmt.response_key) is not None:
        example = encode_single(tokenizer, row[fmt.prompt_key], str(row[fmt.response_key]))
    else:
        raise ValueError(
            f"has neither {fmt.messages_key!r} nor both {fmt.prompt_key!r} and {fmt.response_key!r}"
            f" (columns: {', '.join(sorted(row))})"
        )
    return truncate(example, fmt.max_length, fmt.truncation)


def encode_rows(rows: list[dict[str, Any]], tokenizer: Any, fmt: RowFormat) -> list[SftExample]:
    """Every row encoded; rows left with no trained token (truncated away) are dropped and counted."""
    examples, empty = [], 0
    for index, row in enumerate(rows):
        try:
            example = encode_row(row, tokenizer, fmt)
        except ValueError as err:
            raise ValueError(f"row {index}: {err}") from None
        if example.trained_tokens == 0:
            empty += 1
            continue
        examples.append(example)
    if empty:
        log.warning("dropped %d rows with no response token left after truncation", empty)
    if not examples:
        raise ValueError("no row has a response token to train on")
    return examples


def epoch_batches(num_examples: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's batches of example indices: a seeded permutation per epoch, the partial
    last batch dropped (verl's ``drop_last``), so every step has ``batch_size`` sequences."""
    order = list(range(num_examples))
    random.Random(f"{seed}/{epoch}").shuffle(order)
    return [order[k : k + batch_size] for k in range(0, num_examples - batch_size + 1, batch_size)]
