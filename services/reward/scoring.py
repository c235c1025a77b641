"""The two reward models behind ``/score``: a sequence classifier and a generative judge.

Each turns an item into token ids (``encode``, on the request's task, where bad input becomes a
``ValueError`` naming the item) and scores a batch of them in one forward pass (``score``, on
the batcher's one thread that owns the model). A batch is right-padded to its longest
sequence: with causal attention the padding comes after every real token and cannot change
its logits, so a score does not depend on what it was batched with.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from relayrl.models.loading import check_model_dir, load_tokenizer
from services.reward.config import RewardSettings
from services.reward.judge import Verdict, VerdictParser, render_judge_prompt
from services.reward.schemas import ScoreItem

log = logging.getLogger(__name__)


class TooLong(ValueError):
    """An item longer than the service's ``max_length`` (answered with 413)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    ids: list[int]


class Scorer(Protocol):
    max_length: int

    def encode(self, item: ScoreItem, index: int) -> Encoded: ...

    def score(self, batch: list[list[int]]) -> list[Verdict]: ...


def plain_rendering(messages: list[dict[str, Any]]) -> str:
    """A conversation for a tokenizer without a chat template: ``"<role>: <content>\\n"`` per message."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages)


class _TokenizerSide:
    def __init__(self, settings: RewardSettings, tokenizer: Any, config: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(config.vocab_size)
        self.max_length = settings.max_length or int(getattr(config, "max_position_embeddings", 0) or 4096)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else config.pad_token_id
        self.pad_id = int(pad if pad is not None else (tokenizer.eos_token_id or 0))

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        if self.tokenizer.chat_template:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False)
            # The template writes any BOS itself; adding special tokens would double it.
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self.tokenizer(plain_rendering(messages))["input_ids"]

    def checked(self, ids: list[int], index: int, field: str) -> Encoded:
        # min/max run in C; the offending token is looked for only once there is one.
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"items[{index}].{field}: token {bad} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) > self.max_length:
            raise TooLong(f"items[{index}].{field}: {len(ids)} tokens, more than max_length {self.max_length}")
        return Encoded(ids)


class ClassifierScorer(_TokenizerSide):
    """``AutoModelForSequenceClassification``: the score is the logit of ``label_index``."""

    def __init__(self, settings: RewardSettings, model: Any, tokenizer: Any) -> None:
        super().__init__(settings, tokenizer, model.config)
        if settings.label_index >= model.config.num_labels:
            raise ValueError(f"label_index {settings.label_index} but the model has {model.config.num_labels} labels")
        # *ForSequenceClassification pools at the last token that is not padding; it needs the id.
        model.config.pad_token_id = self.pad_id
        self.model = model
        self.label_index = settings.label_index
        self.device = settings.device

    def encode(self, item: ScoreItem, index: int) -> Encoded:
        if item.input_ids is not None:
            return self.checked(item.input_ids, index, "input_ids")
        field = "messages" if item.messages is not None else "response"
        return self.checked(self.chat_ids(item.conversation()), index, field)

    def score(self, batch: list[list[int]]) -> list[Verdict]:
        import torch

        ids, mask = _right_padded(batch, self.pad_id, self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask).logits
        return [Verdict(float(v), parsed=True) for v in logits[:, self.label_index].float().cpu()]


class JudgeScorer(_TokenizerSide):
    """A causal LM completing ``judge_template``; its greedy output is parsed into the score."""

    def __init__(self, settings: RewardSettings, model: Any, tokenizer: Any) -> None:
        super().__init__(settings, tokenizer, model.config)
        self.model = model
        self.template = settings.judge_template
        self.max_new_tokens = settings.judge_max_new_tokens
        self.parse = VerdictParser(settings.judge_verdict_regex, settings.judge_unparsed_score)
        self.device = settings.device

    def texts(self, item: ScoreItem) -> tuple[str, str]:
        """The (prompt, response) the judge is shown."""
        if item.prompt is not None and item.response is not None:
            return item.prompt, item.response
        if item.messages is not None:
            turns = item.conversation()
            history = turns[:-1]
            prompt = plain_rendering(history) if len(history) > 1 else (history[0]["content"] if history else "")
            return prompt, turns[-1]["content"]
        assert item.input_ids is not None
        start = item.response_start or 0
        decode = self.tokenizer.decode
        return decode(item.input_ids[:start], skip_special_tokens=True), decode(
            item.input_ids[start:], skip_special_tokens=True
        )

    def encode(self, item: ScoreItem, index: int) -> Encoded:
        if item.input_ids is not None:
            self.checked(item.input_ids, index, "input_ids")
        prompt, response = self.texts(item)
        text = render_judge_prompt(self.template, prompt, response)
        field = "input_ids" if item.input_ids is not None else "messages" if item.messages is not None else "response"
        return self.checked(self.tokenizer(text, add_special_tokens=False)["input_ids"], index, field)

    def score(self, batch: list[list[int]]) -> list[Verdict]:
        import torch

        # Generation continues every row from its last position, so the batch is left-padded here;
        # generate() derives position ids from the mask, so padding leaves each row's output alone.
        width = max(len(s) for s in batch)
        ids = torch.tensor([[self.pad_id] * (width - len(s)) + s for s in batch], device=self.device)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in batch], device=self.device)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.pad_id,
            )
        texts = self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        return [self.parse(text) for text in texts]


def _right_padded(batch: list[list[int]], pad_id: int, device: str) -> tuple[Any, Any]:
    import torch

    # One flat tensor scattered under the mask: no padded Python list per row.
    lengths = torch.tensor([len(s) for s in batch])
    mask = torch.arange(int(lengths.max())) < lengths[:, None]
    ids = torch.full(mask.shape, pad_id, dtype=torch.long)
    ids[mask] = torch.tensor([t for s in batch for t in s], dtype=torch.long)
    return ids.to(device), mask.long().to(device)


def set_torch_threads(settings: RewardSettings) -> None:
    """Sizes torch's intra-op pool for the calling thread: OpenMP keeps the size per thread, so the
    thread that runs the forward passes must set it itself."""
    import torch

    torch.set_num_threads(settings.resolved_torch_threads())


def load_scorer(settings: RewardSettings) -> Scorer:
    """Loads the configured model from local disk (nothing is fetched from a hub)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    directory = Path(settings.model_path)
    check_model_dir(directory)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    auto = AutoModelForSequenceClassification if settings.kind == "classifier" else AutoModelForCausalLM
    model = auto.from_pretrained(str(directory), dtype=getattr(torch, settings.dtype), local_files_only=True)
    model = model.to(settings.device).eval()
    tokenizer = load_tokenizer(directory)
    scorer: Scorer = (
        ClassifierScorer(settings, model, tokenizer)
        if settings.kind == "classifier"
        else JudgeScorer(settings, model, tokenizer)
    )
    log.info("loaded %s %s (%s)", settings.kind, directory, type(model).__name__)
    return scorer
