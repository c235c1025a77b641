"""SFT settings, read from ``RELAYRL_SFT_<FIELD>``; ``relayrl sft``'s options override them.

Names are verl's SFT trainer's (``data.*``, ``optim.*``, ``trainer.*`` of its
``sft_trainer.yaml``) without the section prefix. No torch import here, so ``--help`` is instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from relayrl.config import ServiceSettings
from services.trainer.config import AdamBetas, LrSchedulerType

Truncation = Literal["error", "left", "right"]


class SftSettings(ServiceSettings):
    """One fine-tuning run; every rank of a torchrun job reads the same values."""

    service_name: ClassVar[str] = "sft"

    # --- model, data, output ------------------------------------------------------------
    model_dir: Path = Field(description="Hugging Face causal LM directory to fine-tune.")
    data: str = Field(
        min_length=1,
        description="Training rows: a verl SFT .parquet/.jsonl file, or builtin:<task> (demonstrations of a"
        " built-in task, from relayrl.tasks.make_sft_rows).",
    )
    out_dir: Path = Field(
        description="Where the fine-tuned Hugging Face directory (weights, config, tokenizer) and metrics.jsonl go.",
    )
    data_size: int = Field(256, ge=1, description="Rows generated for builtin:<task>.")
    data_difficulty: int = Field(2, ge=1, description="Difficulty of builtin:<task>.")
    prompt_key: str = Field("prompt", description="verl data.prompt_key: column of the prompt (a string).")
    response_key: str = Field("response", description="verl data.response_key: column of the response (a string).")
    messages_key: str = Field(
        "messages",
        description="verl data.multiturn.messages_key: column of a chat (list of {role, content}); a row that has it"
        " is multi-turn and only its assistant turns carry loss.",
    )
    max_length: int = Field(1024, ge=2, description="verl data.max_length: longest sequence (prompt + response).")
    truncation: Truncation = Field(
        "error",
        description="verl data.truncation, and its default: error (a longer row stops the run, naming it), left"
        " (keep the last max_length tokens) or right (keep the first max_length tokens).",
    )

    # --- schedule --------------------------------------------------------------------------
    train_batch_size: int = Field(
        32,
        ge=1,
        description="verl data.train_batch_size: sequences per optimizer step, over all ranks (a multiple of"
        " them; verl's 256 is sized for GPU nodes).",
    )
    micro_batch_size_per_gpu: int = Field(
        4, ge=1, description="verl data.micro_batch_size_per_gpu: sequences per forward/backward on one rank."
    )
    total_epochs: int = Field(
        1, ge=1, description="verl trainer.total_epochs: passes over the data (the last partial batch is dropped)."
    )
    total_training_steps: int | None = Field(
        None, ge=1, description="verl trainer.total_training_steps: when set, the run's steps instead of the epochs'."
    )
    seed: int = Field(1, description="verl trainer.seed: data order (a new permutation every epoch) and torch.")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu (gloo, fp32) or cuda (NCCL, bf16 compute).")

    # --- optimisation (verl optim.*) ------------------------------------------------------
    lr: float = Field(1e-5, gt=0, description="verl optim.lr: peak AdamW learning rate.")
    weight_decay: float = Field(0.01, ge=0, description="verl optim.weight_decay.")
    betas: AdamBetas = Field(
        (0.9, 0.999),
        description="verl optim.betas: AdamW's running means of the gradient and of its square average over about"
        " 1/(1 - beta) recent steps (verl's SFT recipe sets 0.9,0.95). In the environment: [0.9,0.95] or 0.9,0.95.",
    )
    adam_eps: float = Field(1e-8, gt=0, description="AdamW's eps, as the trainer's adam_eps.")
    lr_warmup_steps_ratio: float = Field(
        0.1,
        ge=0,
        le=1,
        description="verl optim.lr_warmup_steps_ratio: share of the steps spent warming the rate up linearly.",
    )
    lr_scheduler_type: LrSchedulerType = Field(
        "constant",
        description="verl optim.lr_scheduler_type: after the warm-up the rate stays at lr (constant) or decays along"
        " a half cosine to min_lr_ratio × lr after the last step (cosine, verl's SFT recipe).",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="verl optim.min_lr_ratio: the cosine schedule's last rate, as a share of lr."
    )
    clip_grad: float = Field(1.0, gt=0, description="verl optim.clip_grad: max global gradient norm.")

    @field_validator("micro_batch_size_per_gpu")
    @classmethod
    def _micro_fits_batch(cls, value: int, info: ValidationInfo) -> int:
        batch = info.data.get("train_batch_size")
        if batch is not None and value > batch:
            raise ValueError(f"exceeds train_batch_size ({batch})")
        return value
