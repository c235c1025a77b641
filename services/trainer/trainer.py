"""The trainer process: build everything, then the main loop.

Rank 0 talks to the queue and paramsync and broadcasts each step's plan (the batch, whether to
checkpoint, whether to stop) to every rank; all ranks then train, gather and checkpoint together.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from relayrl.stalls import StallWatch
from services.paramsync.table import lag_deadline_s
from services.trainer import checkpoint as ckpt
from services.trainer import determinism, lora, rollbacks
from services.trainer import distributed as D
from services.trainer.batching import TrainSample, samples_from_groups
from services.trainer.config import TrainerSettings
from services.trainer.control import Control
from services.trainer.data import PromptDataset, PromptRow, read_rows, tokenize_rows
from services.trainer.feed import Batch, Feed
from services.trainer.gather import BucketGather, Items, published_items, state_items, weight_specs
from services.trainer.links import IoThread, Publisher, TrajectoryQueue, WeightSink
from services.trainer.loggers import build_loggers
from services.trainer.model import (
    AdamW,
    LrSchedule,
    ModelOptions,
    build_optimizer,
    load_actor,
    load_critic,
    prepare_model,
    retake_hyperparameters,
    shard_model,
)
from services.trainer.perf import StepPerf, reset_peak_memory
from services.trainer.staging import host_staging
from services.trainer.staleness_control import StalenessController, StalenessRule, StepMeasure
from services.trainer.state import TrainerState
from services.trainer.status import TrainerStatus
from services.trainer.step import Models, train_step, warm_up
from services.trainer.telemetry import Telemetry
from services.trainer.trajectory_log import LOG_DIR, TrajectoryLog
from services.trainer.weight_handles import HandleSlots

log = logging.getLogger(__name__)


@dataclass
class StepPlan:
    """What rank 0 decided for the next step; identical on every rank after the broadcast."""

    samples: list[TrainSample] = field(default_factory=list)
    checkpoint_after: bool = False
    stop: bool = False
    wait_s: float = 0.0
    queue_s: float = 0.0  # of wait_s, the time spent in queue calls
    version: int = 0  # the policy version the step trained at
    ages: list[int] = field(default_factory=list)  # v − min_policy_version of each group
    etas: list[int | None] = field(default_factory=list)  # the η each group was admitted under (None: not carried)
    group_ids: list[str] = field(default_factory=list)
    feed_metrics: dict[str, float] = field(default_factory=dict)


def adamw(s: TrainerSettings, lr: float) -> AdamW:
    """The AdamW of a model trained at ``lr`` (the actor's lr or the critic's critic_lr)."""
    return AdamW(lr, s.weight_decay, s.adam_eps, s.adam_betas)


def build_models(s: TrainerSettings, ctx: D.DistContext, fsdp: bool = True) -> Models:
    torch.manual_seed(s.seed)
    options = ModelOptions.of(s)

    def wrap(m: torch.nn.Module) -> torch.nn.Module:
        m = prepare_model(m, options)
        return shard_model(m, s.bf16_compute) if fsdp else m

    actor = load_actor(s.model_dir, ctx.device, options.attn_implementation)
    if s.lora:
        actor = lora.add_adapter(actor, lora.LoraSpec(s.lora_rank, s.lora_alpha, s.target_modules))
    actor = wrap(actor)
    schedule = LrSchedule(s.warmup_steps, s.lr_scheduler_type, s.total_steps, s.min_lr_ratio)
    opt, sched = build_optimizer(actor, adamw(s, s.lr), schedule)
    models = Models(actor, opt, sched)
    if s.needs_critic:
        models.critic = wrap(load_critic(s.model_dir, ctx.device, s.seed, options.attn_implementation))
        models.critic_opt, models.critic_sched = build_optimizer(models.critic, adamw(s, s.critic_lr), schedule)
    if s.needs_reference and s.lora:
        models.ref = lora.AdapterDisabled(actor)
    elif s.needs_reference:
        ref = load_actor(s.model_dir, ctx.device, options.attn_implementation).eval()
        ref.requires_grad_(False)
        models.ref = wrap(ref)
    return models


def gather_weights(actor: torch.nn.Module, items: Items | None = None) -> Items | None:
    """The full tensors of ``items`` (default: the whole state dict) on rank 0 (collective), as
    private CPU copies; None on other ranks.

    One full copy on rank 0: for writing a model directory, not for publishing (see publish).
    """
    items = state_items(actor) if items is None else items
    names = [name for name, _ in items]
    tensors = [t for bucket in BucketGather(64 * 1024 * 1024).buckets(items) for t in bucket]
    return list(zip(names, tensors, strict=True)) if D.get_rank() == 0 else None


def stream_weights(
    actor: torch.nn.Module,
    gather: BucketGather,
    publisher: Publisher | None,
    version: int,
    step: int,
    slots: HandleSlots | None = None,
) -> dict[str, float]:
    """Publishes ``version``: every rank gathers bucket by bucket, rank 0 (the one with
    ``publisher``) hands each bucket to the upload on its I/O thread as it comes. With ``slots``
    (rank 0, ``share_weights_by_handle``) rank 0 also copies each bucket into a slot of its own
    memory and the upload carries handles to it, where no engine may still read that slot.

    ``timing/gather_s`` is what training paid (the gather, plus any wait for an upload more than a
    bucket behind; ``timing/publish_s`` is its former name). ``timing/upload_s`` is the latest
    finished upload, from its start to paramsync's commit: usually the previous version's, as this
    one's is still under way.
    """
    started = time.perf_counter()
    items = published_items(actor)
    specs = weight_specs(items, gather.dtype)
    claimed = slots.claim(version, specs, publisher.replica_table()) if slots is not None and publisher else None
    writer, handles = claimed if claimed is not None else (None, None)
    handoff = publisher.begin_streamed(version, specs, step, handles) if publisher is not None else None
    for bucket in gather.buckets(items, writer.write if writer is not None else None):
        if handoff is not None:
            handoff.put(bucket)
        del bucket
    if handoff is not None:
        handoff.end()
    assert writer is None or writer.complete, "the gathered tensors did not fill the version's slot"
    gather_s = time.perf_counter() - started
    # timing_s/update_weights (verl's name): what training paid for the version, as timing/gather_s.
    metrics = {"timing/gather_s": gather_s, "timing/publish_s": gather_s, "timing_s/update_weights": gather_s}
    if slots is not None:
        metrics["trainer/weights_shared_by_handle"] = float(writer is not None)
    if publisher is not None:
        metrics["perf/publish_peak_gathered_bytes"] = gather.peak_live_bytes
        upload_s = publisher.last_upload_s()
        if upload_s is not None:
            metrics["timing/upload_s"] = upload_s
    return metrics


def publish_gather(s: TrainerSettings, device: torch.device) -> BucketGather:
    """The gather a publish runs: ``update_weights_bucket_megabytes`` buckets, cast to the rollout's
    dtype on ``device`` and staged to host memory as the device does it."""
    return BucketGather(
        s.update_weights_bucket_megabytes * 1024 * 1024,
        share_host_memory=device.type == "cpu",
        staging=host_staging(device),
        dtype=getattr(torch, s.resolved_rollout_dtype),
    )


def save_hf_model(actor: torch.nn.Module, base_dir: Path, out_dir: Path) -> None:
    """The actor as a Hugging Face directory shaped like ``base_dir`` (collective; rank 0 writes it,
    as ``relayrl export`` does)."""
    from relayrl.models.loading import load_causal_lm, save_hf_dir

    if lora.is_peft(actor):
        # The base is frozen and on disk: only the adapter need be gathered, then merged into it.
        adapter = gather_weights(actor, published_items(actor))
        if adapter is None:
            return
        model = lora.merged_model(base_dir, dict(adapter), lora.adapter_config(actor))
    else:
        weights = gather_weights(actor)
        if weights is None:
            return
        model = load_causal_lm(base_dir)
        model.load_state_dict(dict(weights))
    save_hf_dir(model, base_dir, out_dir)


class Trainer:
    def __init__(
        self,
        settings: TrainerSettings,
        ctx: D.DistContext,
        queue: TrajectoryQueue | None,
        sink: WeightSink | None,
        io: IoThread | None,
        control: Control,
    ) -> None:
        self.s = settings
        self.ctx = ctx
        self.control = control
        self.state = TrainerState()
        self.models = build_models(settings, ctx)
        self.perf = StepPerf.of(self.models.actor, ctx.device, ctx.world_size, settings.mfu_peak_tflops)
        from relayrl.models.loading import load_tokenizer

        tokenizer = load_tokenizer(settings.model_dir)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.ckpt_dir = settings.resolved_run_dir() / "checkpoints"
        self.checkpointer = ckpt.Checkpointer(self.ckpt_dir, settings.keep_checkpoints, settings.async_save)
        self.redone: dict[str, float] = {}  # what resumes cost so far (services.trainer.rollbacks)
        self.feed: Feed | None = None
        self.staleness: StalenessController | None = None  # rank 0 under max_staleness auto
        self.trajectory_log: TrajectoryLog | None = None  # rank 0
        self.val_rows: list[PromptRow] = []
        if ctx.is_main:
            assert queue is not None and io is not None
            name = settings.dataset.removeprefix("builtin:")
            rows = tokenize_rows(
                read_rows(settings.dataset, settings.dataset_size, settings.dataset_difficulty, settings.seed, "train"),
                tokenizer,
                name,
                settings.max_prompt_tokens,
            )
            run_dir = settings.resolved_run_dir()
            loggers = build_loggers(
                settings.logger,
                run_dir,
                settings.project_name,
                settings.experiment_name or settings.run_id,
                settings.model_dump(mode="json", exclude={"api_token"}),
            )
            self.telemetry = Telemetry(run_dir, loggers)
            stalls = StallWatch(self.telemetry.stalled, settings.stall_warn_s, log)
            dataset = PromptDataset(rows, settings.seed)
            self.feed = Feed(settings, queue, io, dataset, control, stalls, on_drop=self.telemetry.record_dropped)
            if settings.auto_staleness:
                self.staleness = StalenessController(staleness_rule(settings), settings.staleness_initial)
            if settings.trajectory_log:
                self.trajectory_log = TrajectoryLog(
                    run_dir / LOG_DIR, settings.trajectory_log_fsync == "step", settings.trajectory_log_keep == "all"
                )
            self.val_rows = self._val_rows(tokenizer)
            # A bucket hand-off may wait as long as the upload may take to send the bucket before
            # it: every attempt running to sync_timeout, plus the backoff between them.
            handoff_s = lag_deadline_s(settings.sync_timeout, settings.max_sync_retries, settings.sync_retry_delay)
            self.publisher = Publisher(io, sink, handoff_s)
        self.gather = publish_gather(settings, ctx.device)
        shares = settings.share_weights_by_handle and ctx.is_main
        if shares and lora.is_peft(self.models.actor):
            log.warning("share_weights_by_handle is off with LoRA: adapter versions reach engines as adapters")
            shares = False
        self.slots = HandleSlots(ctx.device) if shares else None

    def _val_rows(self, tokenizer: Any) -> list[PromptRow]:
        s = self.s
        if s.test_freq == 0 or s.val_size == 0:
            return []
        source = s.val_dataset or (s.dataset if s.dataset.startswith("builtin:") else "")
        if not source:
            return []
        raw = read_rows(source, s.val_size, s.dataset_difficulty, s.seed, "val")[: s.val_size]
        return tokenize_rows(raw, tokenizer, "val", s.max_prompt_tokens)

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> TrainerState:
        self.resume()
        if self.state.version > 0:
            self.publish()  # replicas must hold the version we train from (v0 is the model directory)
        self.control.ready.set()
        started = time.perf_counter()
        if warm_up(self.models, self.s, self.pad_id):
            # After ready: the rollout generates the first batch meanwhile.
            log.info("compiled a step's passes in %.1f s, before the first batch", time.perf_counter() - started)
        if self.s.val_before_train and self.state.step == 0:
            self.validate_before_training()
        while self.state.step < self.s.total_steps:
            plan = self.plan_step()
            if plan.stop:
                break
            started = time.perf_counter()
            metrics = self.train(plan)
            self.record_trained(plan)
            if self.state.step % self.s.sync_every == 0:
                self.state.version += 1
                if plan.checkpoint_after:
                    # Before publishing, so a synchronous save makes every version paramsync holds
                    # durable first. An async one may not be durable when a crash comes: resume()
                    # then finds paramsync ahead and continues past it, never re-using a number.
                    self.checkpoint()
                metrics.update(self.publish())
            if self.s.test_freq and self.state.step % self.s.test_freq == 0:
                metrics.update(self.validate())
            self.acknowledge(self.checkpointer.poll())
            self.record(plan, metrics, time.perf_counter() - started)
            self.adjust_staleness(metrics)
        self.finish()
        return self.state

    # --- phases -------------------------------------------------------------------------

    def plan_step(self) -> StepPlan:
        plan = StepPlan()
        if self.ctx.is_main:
            assert self.feed is not None
            batch: Batch | None = self.feed.next_batch(self.state.step, self.state.version)
            if batch is None:
                plan.stop = True
            else:
                plan.group_ids = [g.group_id for g in batch.groups]
                if self.trajectory_log is not None:
                    self.trajectory_log.append(self.state.step + 1, self.state.version, batch.groups)
                plan.samples = samples_from_groups(batch.groups)
                plan.wait_s, plan.queue_s = batch.wait_s, batch.queue_s
                plan.version = self.state.version
                plan.feed_metrics = batch.metrics
                plan.ages = [self.feed.age(g, self.state.version) for g in batch.groups]
                plan.etas = [g.max_staleness for g in batch.groups]
                after = self.state.step + 1
                at_boundary = after % self.s.sync_every == 0
                wanted = after % self.s.save_freq == 0 or self.control.checkpoint_requested.is_set()
                plan.checkpoint_after = at_boundary and (wanted or after == self.s.total_steps)
        return D.broadcast_object(plan)

    def train(self, plan: StepPlan) -> dict[str, float]:
        reset_peak_memory(self.ctx.device)
        started = time.perf_counter()
        metrics = train_step(self.models, plan.samples, self.s, self.pad_id)
        train_s = time.perf_counter() - started
        # forward_backward_s includes the log-prob recomputation, optimizer_s the clip and step.
        metrics["timing/forward_backward_s"] = train_s - metrics.get("timing/optimizer_s", 0.0)
        tokens = sum(x.length for x in plan.samples)
        metrics.update(self.perf.metrics(tokens, train_s, metrics.get("timing_s/update_actor", 0.0)))
        self.state.step += 1
        self.state.processed_samples += len(plan.samples)
        self.state.skipped_empty_batches += int(metrics.get("trainer/skipped_empty_batch", 0.0))
        return metrics

    def publish(self) -> dict[str, float]:
        """Gathers the weights bucket by bucket (collective) while rank 0's I/O thread uploads them."""
        publisher = self.publisher if self.ctx.is_main else None
        metrics = stream_weights(
            self.models.actor, self.gather, publisher, self.state.version, self.state.step, self.slots
        )
        if publisher is not None:
            self.state.param_sync_count += 1
        return metrics

    def validate(self) -> dict[str, float]:
        if not self.ctx.is_main or not self.val_rows:
            return {}
        assert self.feed is not None
        started = time.perf_counter()
        metrics = self.feed.validate(self.val_rows, self.state.step, self.state.version)
        metrics["timing/validate_s"] = time.perf_counter() - started
        return metrics

    def validate_before_training(self) -> None:
        """The starting policy's held-out scores, as the metrics of step 0."""
        metrics = self.validate()
        if metrics:
            self.telemetry.record(0, {"trainer/global_steps": 0, **metrics})

    def checkpoint(self) -> None:
        saved = self.state.to_json()
        if self.feed is not None:
            saved.update(self.feed.checkpoint_state())
        if self.trajectory_log is not None:
            self.trajectory_log.sync()  # no durable checkpoint without the log that leads to it
        extra = self.write_hf_model if self.s.save_hf_model else None
        # With async_save this returns once the shards are staged; acknowledge() follows durability.
        self.acknowledge(self.checkpointer.save(self.state.step, self.models, saved, extra=extra))
        if self.feed is not None:
            self.control.checkpoint_requested.clear()
        if self.trajectory_log is not None:
            kept = sorted(self.ckpt_dir.glob("step_*"))
            self.trajectory_log.checkpointed(int(kept[0].name.removeprefix("step_")) if kept else None)
        if self.ctx.is_main:
            log.info("checkpoint at step %d (version %d) taken", self.state.step, self.state.version)

    def acknowledge(self, durable_step: int | None) -> None:
        """Once the checkpoint of ``durable_step`` is durable, the groups trained up to it are acknowledged."""
        if durable_step is None:
            return
        if self.feed is not None:
            self.feed.acknowledge_through(durable_step)
        if self.ctx.is_main:
            log.info("checkpoint at step %d is durable", durable_step)

    def write_hf_model(self, checkpoint: Path) -> None:
        """``hf/`` in the checkpoint being written: the actor as ``relayrl export`` writes it (collective)."""
        save_hf_model(self.models.actor, self.s.model_dir, checkpoint / "hf")

    def resume(self) -> None:
        """Restores the latest checkpoint, and settles which version its weights are.

        They are the checkpoint's version K, re-published as is (paramsync accepts an identical
        re-publish). Only when versions were published after the checkpoint (save_freq > sync_every,
        or an async_save checkpoint not yet durable when the crash came) does paramsync hold a newer
        L > K made from weights the crash lost; the restored weights then become version L + 1 so
        versions stay monotonic, and the queue is told of the rollback (after_resume).
        """
        raw = ckpt.load(self.ckpt_dir, self.models)
        if raw is not None:
            self._retake_hyperparameters()
            self.state = TrainerState.from_json(raw)
            if self.feed is not None:
                self.feed.restore(raw)
        if self.staleness is not None and self.feed is not None:
            self.staleness.eta = self.feed.max_staleness
        if self.trajectory_log is not None:
            self.trajectory_log.resume_at(self.state.step)
            self.trajectory_log.write_config(replay_config(self.s, self.ctx))
        checkpoint_version = self.state.version
        latest = self.publisher.latest_version() if self.ctx.is_main else 0
        latest = D.broadcast_object(latest)
        if latest > self.state.version:
            log.warning(
                "paramsync holds version %d beyond checkpoint version %d; continuing as %d",
                latest,
                self.state.version,
                latest + 1,
            )
            self.state.version = latest + 1
        if self.ctx.is_main:
            log.info("starting at step %d, version %d", self.state.step, self.state.version)
        self.after_resume(checkpoint_version)

    def _retake_hyperparameters(self) -> None:
        m, s = self.models, self.s
        optimizers = [("actor", m.actor_opt, m.actor_sched, s.lr)]
        if m.critic_opt is not None and m.critic_sched is not None:
            optimizers.append(("critic", m.critic_opt, m.critic_sched, s.critic_lr))
        for name, opt, sched, lr in optimizers:
            changes = retake_hyperparameters(opt, sched, adamw(s, lr))
            if changes and self.ctx.is_main:
                log.warning("%s optimizer: this run's settings, not the checkpoint's: %s", name, ", ".join(changes))

    def after_resume(self, checkpoint_version: int) -> None:
        """Rank 0: tells the queue the versions the resume rolled back over (the rest of the run judges
        staleness along the lineage, relayrl.staleness.Rollback) and reckons the steps it redoes."""
        if not self.ctx.is_main or self.feed is None:
            return
        self.feed.resumed(self.state.step, checkpoint_version, self.state.version)
        redone = rollbacks.redone_steps(rollbacks.read_rows(self.telemetry.path), resumed_from=self.state.step)
        self.redone = rollbacks.totals(redone)
        if redone and redone[-1].at_step == self.state.step + 1:
            log.warning(
                "%d steps trained after the checkpoint of step %d are redone (%.1f s of training lost)",
                redone[-1].steps,
                self.state.step,
                redone[-1].seconds,
            )

    def record(self, plan: StepPlan, metrics: dict[str, float], step_s: float) -> None:
        if not self.ctx.is_main:
            return
        assert self.feed is not None
        total_s = step_s + plan.wait_s
        tokens = sum(x.length for x in plan.samples)
        metrics.update(
            {
                "trainer/global_steps": self.state.step,
                "trainer/processed_samples": self.state.processed_samples,
                "trainer/current_param_version": self.state.version,
                "trainer/param_sync_count": self.state.param_sync_count,
                "trainer/idle_ratio": plan.wait_s / total_s if total_s > 0 else 0.0,
                "trainer/skipped_empty_batches": self.state.skipped_empty_batches,
                "trainer/dropped_stale_groups": self.feed.state.dropped_stale,
                "trainer/duplicate_groups": self.feed.state.duplicate_groups,
                "trainer/param_sync_failures": sum(1 for r in self.publisher.records if not r.ok),
                "timing/wait_s": plan.wait_s,
                "timing/queue_s": plan.queue_s,
                "timing/step_s": total_s,
                "perf/tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
                "staleness/avg_sample_age": sum(plan.ages) / max(len(plan.ages), 1),
                "staleness/max_sample_age": max(plan.ages, default=0),
                "staleness/eta": self.feed.max_staleness,
                **plan.feed_metrics,
                **self.redone,
            }
        )
        self.telemetry.record(self.state.step, metrics)

    def adjust_staleness(self, metrics: dict[str, float]) -> None:
        """max_staleness auto: feeds the step's measurements to the controller; a new η governs admission at once."""
        if self.staleness is None:
            return
        assert self.feed is not None
        measure = StepMeasure(
            idle_ratio=metrics["trainer/idle_ratio"],
            admission_starved=metrics.get("staleness/admission_starved"),
            abs_log_ratio=metrics.get("training/rollout_logprob_abs_diff_mean", 0.0),
            clipfrac=metrics.get("actor/pg_clipfrac", 0.0),
        )
        before = self.staleness.eta
        decision = self.staleness.observe(measure)
        if decision is None:
            return
        if decision.eta != before:
            step, reason = self.state.step, decision.reason
            log.info("max_staleness auto: η %d → %d after step %d (%s)", before, decision.eta, step, reason)
        else:
            log.debug("max_staleness auto: η stays %d after step %d (%s)", before, self.state.step, decision.reason)
        self.feed.max_staleness = decision.eta

    def record_trained(self, plan: StepPlan) -> None:
        """Which groups this step trained on, at which version: `relayrl chaos` checks from it that
        none was lost, trained twice or beyond the staleness bound across restarts.

        Written before the step's checkpoint, which acknowledges the groups: written after it, a
        crash in between (during the publish, say) would leave trained, acknowledged groups that no
        line names, since a resume from that checkpoint never writes the step again.
        """
        if self.ctx.is_main:
            self.telemetry.record_groups(self.state.step, plan.version, plan.group_ids, plan.ages, plan.etas)

    def finish(self) -> None:
        self.acknowledge(self.checkpointer.wait())
        at_boundary = self.state.step > 0 and self.state.step % self.s.sync_every == 0
        if at_boundary and ckpt.latest(self.ckpt_dir) != self.ckpt_dir / f"step_{self.state.step:08d}":
            self.checkpoint()
            self.acknowledge(self.checkpointer.wait())
        if self.ctx.is_main:
            self.publisher.drain()

    def close(self) -> None:
        """Flushes and closes the experiment trackers (finishes the wandb run), however ``run`` ended."""
        if self.ctx.is_main:
            self.telemetry.close()
        if self.trajectory_log is not None:
            self.trajectory_log.close()

    def status(self) -> TrainerStatus:
        feed = self.feed
        return TrainerStatus(
            step=self.state.step,
            version=self.state.version,
            total_steps=self.s.total_steps,
            consuming=self.control.consuming.is_set(),
            checkpoint_requested=self.control.checkpoint_requested.is_set(),
            buffered_groups=feed.buffered_count() if feed else 0,
            unacked_groups=feed.unacked_count() if feed else 0,
            released_prompts=feed.state.released if feed else 0,
            param_sync_count=self.state.param_sync_count,
            world_size=self.ctx.world_size,
        )


def staleness_rule(s: TrainerSettings) -> StalenessRule:
    return StalenessRule(
        limit=s.max_staleness_limit,
        adjust_every=s.staleness_adjust_every,
        idle_threshold=s.staleness_idle_threshold,
        starved_share=s.staleness_starved_share,
        max_abs_log_ratio=s.staleness_max_abs_log_ratio,
        max_clipfrac=s.staleness_max_clipfrac,
    )


def replay_config(s: TrainerSettings, ctx: D.DistContext) -> dict[str, Any]:
    """What ``relayrl replay`` needs to re-run this trainer exactly: its settings (the model directory
    made absolute, ``deterministic`` among them) and what its arithmetic depended on: the
    parallelism, torch, and on CUDA the GPU model (a replay elsewhere compares within a tolerance)."""
    # Former names are left out: their values live on under the names that replaced them.
    settings = s.model_dump(mode="json", exclude={"api_token", *s.former_names})
    settings["model_dir"] = str(s.model_dir.resolve())
    return {
        "settings": settings,
        "world_size": ctx.world_size,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu",
        # What this process computed with, as torch reports it (the setting asks; this is the answer).
        "deterministic_algorithms": determinism.enabled(),
    }


def install_stop_handlers(control: Control) -> None:
    """SIGTERM/SIGINT finish the current step, checkpoint when possible, and exit cleanly."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: control.stop_requested.set())
