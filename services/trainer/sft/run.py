"""One rank of an SFT run: encode the data, shard the model with FSDP2, step, write the model.

Every rank encodes every row and computes the same seeded batch order, so no data travels
between ranks; each takes its shard of each step's batch (``step.py``). Rank 0 logs each step
to the console and ``<out_dir>/metrics.jsonl`` and, at the end, writes ``out_dir`` as a Hugging
Face directory that the engine, the trainer and ``relayrl export`` load.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from services.trainer import distributed as D
from services.trainer.model import AdamW, LrSchedule, build_optimizer, load_actor, shard_model
from services.trainer.sft.config import SftSettings
from services.trainer.sft.data import RowFormat, SftExample, encode_rows, epoch_batches, load_rows
from services.trainer.sft.step import StepResult, train_step
from services.trainer.trainer import save_hf_model

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SftSummary:
    steps: int
    first_loss: float
    last_loss: float
    out_dir: str


@dataclass(frozen=True, slots=True)
class Schedule:
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int


def plan_schedule(s: SftSettings, num_examples: int, world_size: int) -> Schedule:
    if s.train_batch_size % world_size:
        raise ValueError(f"train_batch_size ({s.train_batch_size}) must be a multiple of the ranks ({world_size})")
    steps_per_epoch = num_examples // s.train_batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{num_examples} usable rows are fewer than train_batch_size ({s.train_batch_size})")
    total = s.total_training_steps or steps_per_epoch * s.total_epochs
    return Schedule(steps_per_epoch, total, int(total * s.lr_warmup_steps_ratio))


def sft_optimizer(model: torch.nn.Module, s: SftSettings, schedule: Schedule):
    """AdamW and its learning-rate schedule as the settings ask, over the run's steps."""
    adamw = AdamW(s.lr, s.weight_decay, s.adam_eps, s.betas)
    lr = LrSchedule(schedule.warmup_steps, s.lr_scheduler_type, schedule.total_steps, s.min_lr_ratio)
    return build_optimizer(model, adamw, lr)


def batches(examples: list[SftExample], s: SftSettings, schedule: Schedule) -> Iterator[tuple[int, list[SftExample]]]:
    """(epoch, batch) for every step; past ``total_epochs`` when ``total_training_steps`` asks for more."""
    for step in range(schedule.total_steps):
        epoch = step // schedule.steps_per_epoch
        order = epoch_batches(len(examples), s.train_batch_size, s.seed, epoch)
        yield epoch, [examples[i] for i in order[step % schedule.steps_per_epoch]]


@dataclass(frozen=True, slots=True)
class StepLog:
    """Rank 0's record of each step: a line on the console and a row in ``metrics.jsonl``."""

    path: Path
    total_steps: int

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def record(self, step: int, epoch: int, result: StepResult, elapsed_s: float) -> None:
        row = {
            "step": step,
            "epoch": epoch,
            "train/loss": result.loss,
            "train/lr": result.lr,
            "train/grad_norm": result.grad_norm,
            "train/trained_tokens": result.trained_tokens,
            "perf/tokens_per_s": result.tokens / elapsed_s,
            "timing/step_s": elapsed_s,
        }
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        log.info(
            "step %d/%d  loss %.4f  lr %.2e  grad_norm %.3f  tokens/s %.0f%s",
            step,
            self.total_steps,
            result.loss,
            result.lr,
            result.grad_norm,
            row["perf/tokens_per_s"],
            "" if result.stepped else "  (non-finite gradient: update skipped)",
        )


def run_sft(s: SftSettings) -> SftSummary:
    from relayrl.models.loading import load_tokenizer

    # The data first: a bad file or model directory fails before any process group forms.
    tokenizer = load_tokenizer(s.model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    fmt = RowFormat(s.prompt_key, s.response_key, s.messages_key, s.max_length, s.truncation)
    examples = encode_rows(load_rows(s.data, s.data_size, s.data_difficulty, s.seed), tokenizer, fmt)
    ctx = D.init_distributed(s.device)
    try:
        torch.manual_seed(s.seed)
        schedule = plan_schedule(s, len(examples), ctx.world_size)
        model = shard_model(load_actor(s.model_dir, ctx.device), bf16=ctx.device.type == "cuda")
        opt, sched = sft_optimizer(model, s, schedule)
        step_log = StepLog(s.out_dir / "metrics.jsonl", schedule.total_steps) if ctx.is_main else None
        if step_log is not None:
            step_log.start()
            log.info("%d examples, %d steps, %d rank(s)", len(examples), schedule.total_steps, ctx.world_size)
        losses = []
        for step, (epoch, batch) in enumerate(batches(examples, s, schedule), start=1):
            started = time.perf_counter()
            result = train_step(model, opt, sched, batch, s.micro_batch_size_per_gpu, s.clip_grad, pad_id)
            losses.append(result.loss)
            if step_log is not None:
                step_log.record(step, epoch, result, time.perf_counter() - started)
        save_hf_model(model, s.model_dir, s.out_dir)
        D.barrier()
        return SftSummary(len(losses), losses[0], losses[-1], str(s.out_dir))
    finally:
        D.shutdown()
