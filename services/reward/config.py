"""Settings of the reward-model service (``relayrl reward serve``), read from ``RELAYRL_REWARD_*``.

Two kinds of model, chosen by ``kind``:

- ``classifier``: a Hugging Face ``AutoModelForSequenceClassification`` directory (verl's
  ``reward_model.model.path``); the score of a sequence is the logit of ``label_index`` at its
  last token, as ``*ForSequenceClassification`` pools it.
- ``judge``: a causal LM asked, through ``judge_template``, for a verdict on one response; it
  generates greedily up to ``judge_max_new_tokens`` tokens and ``judge_verdict_regex`` reads the
  score from them (a number, or yes / no as 1 / 0).

Batching: requests that arrive within ``max_wait_ms`` of each other are scored together, up to
``max_batch_size`` sequences per forward pass, each batch padded to its own longest sequence.
"""

from __future__ import annotations

import os
import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from relayrl.config import ServiceSettings

DEFAULT_JUDGE_TEMPLATE = (
    "<|im_start|>user\nRate the response to the prompt from 0 to 10.\n"
    "Prompt: {prompt}\nResponse: {response}\nAnswer with the number only.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
# The first number, or a yes / no, in the judge's output.
DEFAULT_VERDICT_REGEX = r"(?i)(?<![\w.])(yes|no|-?\d+(?:\.\d+)?)\b"


class RewardSettings(ServiceSettings):
    """The reward service serves ``POST /score`` on ``http_port``; it has no gRPC server."""

    service_name: ClassVar[str] = "reward"

    model_path: str = Field("", description="Hugging Face model directory to serve (verl's reward_model.model.path).")
    kind: Literal["classifier", "judge"] = Field(
        "classifier",
        description="'classifier': a sequence-classification reward model; 'judge': a causal LM whose"
        " generated verdict is parsed into the score.",
    )
    label_index: int = Field(
        0, ge=0, description="classifier: the label whose logit is the score (0 for a one-label reward model)."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Torch dtype of the weights.")
    device: str = Field("cpu", description="Torch device of the model, e.g. 'cpu' or 'cuda:0'.")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads; 0 uses every CPU this process may run on.")
    max_batch_size: int = Field(
        32, ge=1, description="Most sequences scored in one forward pass (verl's reward_model.micro_batch_size)."
    )
    max_wait_ms: float = Field(
        5.0,
        ge=0,
        description="How long the first sequence of a batch waits for others to join it, milliseconds;"
        " 0 scores whatever has arrived at once.",
    )
    max_items_per_request: int = Field(
        1024, ge=1, description="Most items one /score request may carry; more is refused with 413."
    )
    max_length: int = Field(
        0,
        ge=0,
        description="Longest sequence in tokens (the judge: its rendered prompt); 0 uses the model's"
        " max_position_embeddings. Longer items are refused with 413 (verl's reward_model.max_length).",
    )
    judge_template: str = Field(
        DEFAULT_JUDGE_TEMPLATE,
        description="judge: the text the judge completes; {prompt} and {response} are replaced by the item's.",
    )
    judge_verdict_regex: str = Field(
        DEFAULT_VERDICT_REGEX,
        description="judge: the first match's first group (else the whole match) is the verdict: 'yes' → 1,"
        " 'no' → 0, a number → itself.",
    )
    judge_max_new_tokens: int = Field(8, ge=1, description="judge: tokens generated (greedily) for one verdict.")
    judge_unparsed_score: float = Field(
        0.0,
        description="judge: the score of an output with no verdict in it; counted in"
        " relayrl_reward_unparsed_verdicts_total and returned with parsed=false.",
    )

    @field_validator("judge_verdict_regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    def resolved_torch_threads(self) -> int:
        """``torch_threads``, with 0 resolved to the CPUs in this process's affinity set."""
        return self.torch_threads or len(os.sched_getaffinity(0))
