"""``relayrl replay``: the trainer of a finished or crashed run, re-run from what the run kept.

What the run kept: its trainer settings and parallelism (``trajectories/config.json``), its starting
weights (the model directory and seed, or a checkpoint ``step_M``) and the trajectory log, every
batch the trainer consumed in order (:mod:`services.trainer.trajectory_log`). Replay feeds those
batches to the same ``train_step`` with no engine and no queue. On CPU the arithmetic is the
same, so the weights after each step equal the original's bit for bit: each checkpoint the run
still holds is compared by the SHA-256 of its actor weights.

Nothing in the run directory is written: the replay's metrics, report and dumps go to its own
output directory, which may not lie inside the run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXTRA_METRICS = ("entropy", "ratios")


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


def checkpoint_actor_digest(path: Path, like: dict[str, Any]) -> str:
    """The digest of the actor weights checkpoint ``path`` holds (read into tensors shaped as ``like``)."""
    import torch
    import torch.distributed.checkpoint as dcp

    template = {"actor": {name: torch.empty_like(t) for name, t in like.items()}}
    dcp.load(template, checkpoint_id=str(path))
    return weights_digest(template["actor"].items())


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


def run_replay(plan: ReplayPlan, out_dir: Path, extra: tuple[str, ...] = (), dump_steps: tuple[int, ...] = ()) -> dict:
    """Replays ``plan`` into ``out_dir`` (metrics.jsonl, report.json, dumps); returns the report."""
    import torch

    from relayrl.models.loading import load_tokenizer
    from services.trainer import checkpoint as ckpt
    from services.trainer import distributed as D
    from services.trainer.batching import samples_from_groups
    from services.trainer.config import TrainerSettings
    from services.trainer.step import train_step
    from services.trainer.trainer import build_models

    settings = TrainerSettings.model_validate(plan.config["settings"])
    torch.set_num_threads(int(plan.config.get("torch_threads", torch.get_num_threads())))
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = D.init_distributed(settings.device)
    try:
        models = build_models(settings, ctx)
        if plan.start_step:
            root = plan.run_dir / "checkpoints"
            ckpt.load(root, models, root / f"step_{plan.start_step:08d}")
        tokenizer = load_tokenizer(settings.model_dir)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
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
                    original = checkpoint_actor_digest(plan.checkpoints[record.step], state)
                    replayed = weights_digest(state.items())
                    compared.append({"step": record.step, "original": original, "replayed": replayed})
    finally:
        D.shutdown()
    steps = len(plan.records)
    original_s = _original_step_s(plan.run_dir, {r.step for r in plan.records})
    report = {
        "run": str(plan.run_dir),
        "from_step": plan.start_step,
        "until_step": plan.until_step,
        "steps": steps,
        "checkpoints": [{**c, "equal": c["original"] == c["replayed"]} for c in compared],
        "all_equal": all(c["original"] == c["replayed"] for c in compared),
        "replay_steps_per_s": steps / train_s if train_s > 0 else 0.0,
        "original_steps_per_s": 1 / original_s if original_s else None,
        "out_dir": str(out_dir),
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
