"""``relayrl replay``: the trainer of a finished or crashed run, re-run from what the run kept.

What the run kept: its trainer settings and parallelism (``trajectories/config.json``), its starting
weights (the model directory and seed, or a checkpoint ``step_M``) and the trajectory log, every
batch the trainer consumed in order (:mod:`services.trainer.trajectory_log`). Replay feeds those
batches to the same ``train_step`` with no engine and no queue, with the original's settings,
``deterministic`` included. Each checkpoint the run still holds is compared with the replayed
weights at its step, by the SHA-256 of the actor's weights and by their largest relative difference.

Which comparison applies (:func:`comparison_for`): bit for bit on CPU, where the arithmetic is the
same; on CUDA bit for bit too when the original ran with deterministic algorithms on the same GPU
model and torch; otherwise within a tolerance of ``max_rel_diff`` (:data:`CUDA_TOLERANCE` unless
given), since kernels that add in a varying order leave the weights a little apart.

Nothing in the run directory is written: the replay's metrics, report and dumps go to its own
output directory, which may not lie inside the run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

EXTRA_METRICS = ("entropy", "ratios")
# The default bound on max_rel_diff where a CUDA replay cannot be bit for bit (docs/replay.md). A
# varying summation order changes gradients by rounding only; AdamW turns that into a small share
# of each step's update, a whole update only where a near-zero gradient flips sign. At RL's learning
# rates (1e-6 to 1e-5) that is estimated at 1e-5 to 1e-4 of a tensor's norm over a hundred steps,
# while a replay of other data or settings is apart by the updates' own size. An estimate, not yet
# measured on a GPU.
CUDA_TOLERANCE = 1e-3
TOLERANCE_MEASURE = "max_rel_diff"


class ReplayError(Exception):
    """Bad input: the message is one line naming what is missing or inconsistent."""


@dataclass(frozen=True)
class ReplayPlan:
    run_dir: Path
    config: dict[str, Any]
    start_step: int  # 0: from the model directory; otherwise from checkpoint step_<start_step>
    records: list[Any]  # StepRecord of steps start_step + 1 .. until, in order
    checkpoints: dict[int, Path] = field(default_factory=dict)  # the run's checkpoints within the replayed steps

    @property
    def until_step(self) -> int:
        return self.records[-1].step


def _checkpoints(run_dir: Path) -> dict[int, Path]:
    root = run_dir / "checkpoints"
    found = {}
    for path in sorted(root.glob("step_*")) if root.is_dir() else []:
        if (path / "trainer_state.json").is_file():
            found[int(path.name.removeprefix("step_"))] = path
    return found


def plan_replay(run_dir: Path, from_step: int | None = None, until_step: int | None = None) -> ReplayPlan:
    """Checks what the run kept and settles the steps to replay; ReplayError names what is missing."""
    from services.trainer.trajectory_log import CONFIG_FILE, LOG_DIR, read_config, read_records

    if not run_dir.is_dir():
        raise ReplayError(f"{run_dir}: no such run directory")
    log_dir = run_dir / LOG_DIR
    if not (log_dir / CONFIG_FILE).is_file():
        raise ReplayError(
            f"{run_dir}: no trajectory log ({log_dir}/{CONFIG_FILE} is missing: made with trajectory_log off?)"
        )
    config = read_config(log_dir)
    records = read_records(log_dir)
    if not records:
        raise ReplayError(f"{log_dir}: the trajectory log holds no whole step")
    steps = [r.step for r in records]
    for before, after in itertools.pairwise(steps):
        if after != before + 1:
            raise ReplayError(f"{log_dir}: steps {before + 1}..{after - 1} are missing from the trajectory log")
    first, last = steps[0], steps[-1]
    if config.get("world_size", 1) != 1:
        ranks = config["world_size"]
        raise ReplayError(f"{run_dir}: trained by {ranks} ranks; replay runs one rank, so it would not be exact")
    if config["settings"].get("device") == "cuda":
        from relayrl.devices import cuda_unavailable_reason

        if (reason := cuda_unavailable_reason()) is not None:
            raise ReplayError(f"{run_dir}: trained on cuda, and here {reason}")
    checkpoints = _checkpoints(run_dir)
    _check_log_matches(log_dir, records, checkpoints)
    start = _start_step(run_dir, config, first, last, checkpoints, from_step)
    until = last if until_step is None else until_step
    if not start < until <= last:
        raise ReplayError(f"{log_dir}: --until-step {until} is outside the steps {start + 1}..{last} the log replays")
    chosen = [r for r in records if start < r.step <= until]
    within = {step: path for step, path in checkpoints.items() if start < step <= until}
    return ReplayPlan(run_dir, config, start, chosen, within)


def _start_step(
    run_dir: Path, config: dict[str, Any], first: int, last: int, checkpoints: dict[int, Path], from_step: int | None
) -> int:
    if from_step is None:
        if first == 1:
            from_step = 0
        else:
            usable = [step for step in checkpoints if first - 1 <= step < last]
            if not usable:
                raise ReplayError(
                    f"{run_dir}: the trajectory log starts at step {first} and no checkpoint at step {first - 1} or"
                    " later remains to start from"
                )
            from_step = min(usable)
    if from_step == 0:
        if first != 1:
            raise ReplayError(f"{run_dir}: the trajectory log starts at step {first}, not 1: pass --from-step M")
        model_dir = Path(config["settings"]["model_dir"])
        if not (model_dir / "config.json").is_file():
            raise ReplayError(f"{run_dir}: the model directory {model_dir} (version 0) is gone: pass --from-step M")
        return 0
    if from_step not in checkpoints:
        kept = ", ".join(str(s) for s in checkpoints) or "none"
        raise ReplayError(f"{run_dir}: no checkpoint step_{from_step:08d} (checkpoints kept: {kept})")
    if not first - 1 <= from_step < last:
        raise ReplayError(f"{run_dir}: the trajectory log covers steps {first}..{last}, not those after {from_step}")
    return from_step


def _check_log_matches(log_dir: Path, records: list[Any], checkpoints: dict[int, Path]) -> None:
    """Each checkpoint within the log must have trained exactly the log's groups, in its order."""
    first, last = records[0].step, records[-1].step
    ids_through: list[str] = []
    by_step: dict[int, int] = {}
    for record in records:
        ids_through.extend(record.group_ids)
        by_step[record.step] = len(ids_through)
    for step, path in checkpoints.items():
        if step < first - 1:
            continue
        if step > last:
            raise ReplayError(f"{log_dir}: ends at step {last}, but checkpoint {path.name} is later (steps missing)")
        state = json.loads((path / "trainer_state.json").read_text())
        trained = state.get("trained_group_ids", [])
        logged = ids_through[: by_step.get(step, 0)]
        tail = min(len(trained), len(logged))
        if state.get("step") != step or trained[len(trained) - tail :] != logged[len(logged) - tail :]:
            raise ReplayError(f"{log_dir}: does not match checkpoint {path.name}: it trained other groups by that step")


@dataclass(frozen=True, slots=True)
class Comparison:
    """How replayed weights are held against the original's: ``bitwise`` (equal hashes) or
    ``tolerance`` (``max_rel_diff`` at most ``tolerance``), and why."""

    mode: Literal["bitwise", "tolerance"]
    reason: str
    tolerance: float | None = None

    def holds(self, equal: bool, max_rel_diff: float) -> bool:
        if self.mode == "bitwise":
            return equal
        assert self.tolerance is not None
        return max_rel_diff <= self.tolerance

    def report(self) -> dict[str, Any]:
        tolerance = None if self.tolerance is None else {"measure": TOLERANCE_MEASURE, "value": self.tolerance}
        return {"comparison": self.mode, "comparison_reason": self.reason, "tolerance": tolerance}


def comparison_for(config: dict[str, Any], device_name: str, torch_version: str, tolerance: float | None) -> Comparison:
    """The comparison a replay on ``device_name`` with ``torch_version`` owes the run of ``config``."""
    settings = config["settings"]
    if settings.get("device", "cpu") == "cpu":
        return Comparison("bitwise", "cpu: the same arithmetic in the same order")
    limit = CUDA_TOLERANCE if tolerance is None else tolerance
    if not config.get("deterministic_algorithms", settings.get("deterministic", False)):
        return Comparison("tolerance", "the original ran on cuda without deterministic algorithms", limit)
    original_gpu = config.get("device_name", "")
    if original_gpu != device_name:
        return Comparison(
            "tolerance", f"trained on {original_gpu or 'an unrecorded GPU'}, replayed on {device_name}", limit
        )
    original_torch = config.get("torch_version", "")
    if original_torch != torch_version:
        return Comparison("tolerance", f"trained with torch {original_torch}, replayed with {torch_version}", limit)
    return Comparison("bitwise", "cuda with deterministic algorithms, on the same GPU model and torch")


def weight_difference(original: dict[str, Any], replayed: dict[str, Any]) -> tuple[float, float]:
    """(largest |replayed − original| of any element, largest ‖replayed − original‖₂ / ‖original‖₂ of
    any tensor), in float64. A tensor that should be zero and is not, or any NaN or infinity, counts
    as infinitely apart: NaN would otherwise slip through every comparison with a tolerance."""
    import torch

    max_abs = max_rel = 0.0
    for name, want in original.items():
        want64 = want.detach().to("cpu", torch.float64)
        diff = replayed[name].detach().to("cpu", torch.float64) - want64
        if not diff.numel():
            continue
        norm, scale = float(diff.norm()), float(want64.norm())
        if not math.isfinite(norm):
            return math.inf, math.inf
        max_abs = max(max_abs, float(diff.abs().max()))
        max_rel = max(max_rel, norm / scale if scale else (math.inf if norm else 0.0))
    return max_abs, max_rel


def weights_digest(state: Iterable[tuple[str, Any]]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(state, key=lambda item: item[0]):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _full_actor_state(actor: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(actor, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def checkpoint_actor_state(path: Path, like: dict[str, Any]) -> dict[str, Any]:
    """The actor weights checkpoint ``path`` holds, read into tensors shaped as ``like``."""
    import torch
    import torch.distributed.checkpoint as dcp

    template = {"actor": {name: torch.empty_like(t) for name, t in like.items()}}
    dcp.load(template, checkpoint_id=str(path))
    return template["actor"]


def compare_checkpoint(step: int, path: Path, replayed: dict[str, Any], comparison: Comparison) -> dict[str, Any]:
    """One checkpoint's line of the report: both hashes, the differences, and whether the comparison holds."""
    original = checkpoint_actor_state(path, replayed)
    digests = weights_digest(original.items()), weights_digest(replayed.items())
    max_abs, max_rel = weight_difference(original, replayed)
    equal = digests[0] == digests[1]
    return {
        "step": step,
        "original": digests[0],
        "replayed": digests[1],
        "equal": equal,
        "max_abs_diff": max_abs,
        "max_rel_diff": max_rel,
        "within": comparison.holds(equal, max_rel),
    }


def dump_step(models: Any, samples: list[Any], groups: list[Any], s: Any, pad_id: int, step: int, out: Path) -> dict:
    """Per-token log-probs of the policy about to take ``step`` (the proximal policy), their log ratio to the
    behaviour policy and the entropy, one JSON line per sample; returns the step's summary figures."""
    import torch

    from services.trainer.batching import collate
    from services.trainer.model import policy_forward

    ids = [(g.group_id, i) for g in groups for i in range(len(g.samples))]
    entropies: list[float] = []
    abs_ratios: list[float] = []
    # A dump must not change what follows: no RNG drawn, no gradient kept.
    with torch.random.fork_rng(devices=[]), torch.no_grad(), out.open("w") as f:
        for index, sample in enumerate(samples):
            mb = collate(samples, [index], pad_id)
            got = policy_forward(models.actor, mb, s.temperature, True)
            n = len(sample.response_ids)
            logp = got.logp_BT[0, :n].float()
            entropy = got.entropy_BT[0, :n].float()
            log_ratio = logp - mb.behav_logp_BT[0, :n]
            mask = sample.model_mask
            entropies += [float(e) for e, m in zip(entropy, mask, strict=True) if m]
            abs_ratios += [abs(float(r)) for r, m in zip(log_ratio, mask, strict=True) if m]
            group_id, k = ids[index]
            line = {
                "step": step,
                "group_id": group_id,
                "sample": k,
                "reward": sample.reward,
                "response_token_ids": sample.response_ids,
                "loss_mask": mask,
                "behavior_logprob": sample.behav_logp,
                "logprob": logp.tolist(),
                "log_ratio": log_ratio.tolist(),
                "entropy": entropy.tolist(),
            }
            f.write(json.dumps(line) + "\n")
    return {
        "replay/token_entropy_mean": statistics.fmean(entropies) if entropies else 0.0,
        "replay/abs_log_ratio_mean": statistics.fmean(abs_ratios) if abs_ratios else 0.0,
        "replay/abs_log_ratio_max": max(abs_ratios, default=0.0),
    }


def _original_step_s(run_dir: Path, steps: set[int]) -> float | None:
    """The original trainer's mean seconds of training per replayed step (its wait for data left out)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    rows: dict[int, float] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("step") in steps and "timing/step_s" in row:
            rows[row["step"]] = row["timing/step_s"] - row.get("timing/wait_s", 0.0)
    return statistics.fmean(rows.values()) if rows else None


def run_replay(
    plan: ReplayPlan,
    out_dir: Path,
    extra: tuple[str, ...] = (),
    dump_steps: tuple[int, ...] = (),
    tolerance: float | None = None,
) -> dict:
    """Replays ``plan`` into ``out_dir`` (metrics.jsonl, report.json, dumps); returns the report.
    ``tolerance`` bounds ``max_rel_diff`` where the comparison cannot be bit for bit (default
    :data:`CUDA_TOLERANCE`)."""
    import torch

    from relayrl.models.loading import load_tokenizer
    from services.trainer import checkpoint as ckpt
    from services.trainer import determinism
    from services.trainer import distributed as D
    from services.trainer.batching import samples_from_groups
    from services.trainer.config import TrainerSettings
    from services.trainer.step import train_step, warm_up
    from services.trainer.trainer import build_models

    settings = TrainerSettings.model_validate(plan.config["settings"])
    torch.set_num_threads(int(plan.config.get("torch_threads", torch.get_num_threads())))
    out_dir.mkdir(parents=True, exist_ok=True)
    # The original's deterministic setting too, enabled before CUDA starts.
    ctx = D.init_distributed(settings.device, settings.deterministic)
    try:
        device_name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
        comparison = comparison_for(plan.config, device_name, torch.__version__, tolerance)
        models = build_models(settings, ctx)
        if plan.start_step:
            root = plan.run_dir / "checkpoints"
            ckpt.load(root, models, root / f"step_{plan.start_step:08d}")
        tokenizer = load_tokenizer(settings.model_dir)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # As the trainer does at start: compiled graphs take their kernels from their first shapes,
        # so the replay compiles on the same made-up step as the run it repeats.
        warm_up(models, settings, pad_id)
        compared = []
        train_s = 0.0
        with (out_dir / "metrics.jsonl").open("w") as metrics_file:
            for record in plan.records:
                groups = record.groups()
                samples = samples_from_groups(groups)
                metrics: dict[str, float] = {}
                if extra and record.step in dump_steps:
                    path = out_dir / f"step_{record.step:08d}.tokens.jsonl"
                    metrics |= dump_step(models, samples, groups, settings, pad_id, record.step, path)
                started = time.perf_counter()
                metrics |= train_step(models, samples, settings, pad_id)
                train_s += time.perf_counter() - started
                row = {"step": record.step, "version": record.version, **metrics}
                metrics_file.write(json.dumps(row, sort_keys=True) + "\n")
                if record.step in plan.checkpoints:
                    state = _full_actor_state(models.actor)
                    compared.append(compare_checkpoint(record.step, plan.checkpoints[record.step], state, comparison))
        deterministic = determinism.enabled()
    finally:
        D.shutdown()
    steps = len(plan.records)
    original_s = _original_step_s(plan.run_dir, {r.step for r in plan.records})
    report = {
        "run": str(plan.run_dir),
        "from_step": plan.start_step,
        "until_step": plan.until_step,
        "steps": steps,
        "device": device_name,
        "deterministic": deterministic,
        **comparison.report(),
        "checkpoints": compared,
        "all_equal": all(c["equal"] for c in compared),
        "reproduced": all(c["within"] for c in compared),
        "replay_steps_per_s": steps / train_s if train_s > 0 else 0.0,
        "original_steps_per_s": 1 / original_s if original_s else None,
        "out_dir": str(out_dir),
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
