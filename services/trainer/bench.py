"""``relayrl bench trainer``: training throughput with FSDP2 over N processes against the same
work in one process without FSDP, measured in the same run on the same synthetic batches.

Each step: rank 0 builds a batch and broadcasts it (``wait_s``: what the trainer spends
getting data in hand, here without a queue), ``train_step`` (``forward_backward_s``, with the
proximal log-prob pass only under ``--recompute-old-log-prob always``, ``optimizer_s``), then
the streamed gather of a publish, bucket by bucket and cast to the rollout's dtype (bf16 on cuda)
as the trainer does it (``gather_s``, also as verl's ``timing_s/update_weights``: what training
pays for a publish; the upload runs beside training and is measured by the weights benchmark, not
here). ``tokens_per_s`` counts real
(unpadded) prompt+response tokens over forward_backward + optimizer time; ``padding_ratio`` is the
padded share of micro-batch tokens. On CPU the single-process baseline runs with as many torch
threads as the FSDP job had ranks × threads.

Workloads: ``uniform`` draws each response's length between half of ``--response-len`` and all of
it; ``realistic`` draws it from the long-tailed mix ``relayrl bench e2e --workload realistic`` uses
(:mod:`relayrl.workloads`: log-normal, 99th percentile 8× the median) scaled so that its cap is
``--response-len``.

The perf figures carry verl's names (:mod:`services.trainer.perf`): ``perf/throughput`` (tokens/s
per device), ``perf/mfu/actor`` (CUDA: 6 · params FLOPs per token over the actor update's time,
against the device's dense bf16 peak), ``perf/max_memory_allocated_gb``; ``mfu`` and
``single_process_mfu`` count the whole train step (plus 2 · params per token when the proximal
log-prob forward runs). ``memory_allocated_gb_by_step`` is what stays allocated after each step.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from relayrl.profiling import compile_summary
from relayrl.workloads import realistic_length
from services.trainer import distributed as D
from services.trainer.batching import TrainSample
from services.trainer.config import TrainerSettings
from services.trainer.perf import mfu
from services.trainer.step import train_step

if TYPE_CHECKING:
    from services.trainer.trainer import Models

WORKLOADS = ("uniform", "realistic")


@dataclass(frozen=True)
class BenchConfig:
    device: str = "cpu"
    preset: str = "tiny"
    world_size: int = 2
    steps: int = 4
    batch_groups: int = 4
    n_samples: int = 4
    prompt_len: int = 32
    response_len: int = 64
    micro_batch_tokens: int = 4096
    recompute_old_log_prob: str = "auto"
    seed: int = 0
    workload: str = "uniform"
    use_remove_padding: bool = True
    enable_gradient_checkpointing: bool = False
    use_torch_compile: bool = False
    attn_implementation: str = "auto"
    single_process: bool = True  # also measure the plain model in one process
    # One more step after the measured ones under torch.profiler (rank 0's summary in the JSON).
    profile: bool = False
    # Unix time after which no further step is measured (each run still measures one after its
    # warm-up) and the plain-model run is not started; None: no limit.
    deadline_unix: float | None = None

    def past_deadline(self) -> bool:
        return self.deadline_unix is not None and time.time() > self.deadline_unix


def response_length(cfg: BenchConfig, rng: random.Random) -> int:
    """One response's length under ``cfg.workload``."""
    if cfg.workload == "realistic":
        return realistic_length(rng, cfg.response_len)
    return rng.randint(cfg.response_len // 2, cfg.response_len)


def write_model(cfg: BenchConfig, directory: Path) -> Path:
    """A randomly initialised model of the preset, saved in Hugging Face format (``base`` in bf16)."""
    from relayrl.models.tiny import init_tiny, preset_spec

    dtype = "bfloat16" if cfg.preset == "base" else "float32"
    return init_tiny(directory, preset_spec(cfg.preset, seed=cfg.seed, dtype=dtype))


def make_batch(cfg: BenchConfig, step: int, vocab: int) -> list[TrainSample]:
    rng = random.Random(cfg.seed * 1000 + step)
    samples = []
    for i in range(cfg.batch_groups * cfg.n_samples):
        n = response_length(cfg, rng)
        prompt = [rng.randrange(10, vocab) for _ in range(cfg.prompt_len)]
        rewards = [0.0] * (n - 1) + [rng.random()]
        samples.append(
            TrainSample(
                i // cfg.n_samples,
                prompt,
                [rng.randrange(10, vocab) for _ in range(n)],
                [-rng.uniform(0.5, 3.0) for _ in range(n)],
                rewards,
                rewards[-1],
                0,
            )
        )
    return samples


def _measure(cfg: BenchConfig, model_dir: Path, fsdp: bool) -> dict[str, Any]:
    """Runs warm-up + ``cfg.steps`` steps in this process (one rank of a job, or alone)."""
    from services.trainer.perf import StepPerf, max_memory_allocated_gb, reset_peak_memory
    from services.trainer.trainer import build_models, publish_gather, stream_weights

    ctx = D.init_distributed(cfg.device) if fsdp else D.local_context(cfg.device)
    settings = TrainerSettings(
        model_dir=model_dir,
        device=cfg.device,
        ppo_max_token_len_per_gpu=cfg.micro_batch_tokens,
        recompute_old_log_prob=cfg.recompute_old_log_prob,
        use_remove_padding=cfg.use_remove_padding,
        enable_gradient_checkpointing=cfg.enable_gradient_checkpointing,
        use_torch_compile=cfg.use_torch_compile,
        attn_implementation=cfg.attn_implementation,
    )
    models = build_models(settings, ctx, fsdp=fsdp)
    perf = StepPerf.of(models.actor, ctx.device, ctx.world_size, settings.mfu_peak_tflops)
    gather = publish_gather(settings, ctx.device)
    vocab = min(models.actor.config.vocab_size, 50000)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.device == "cuda" and not fsdp)
    totals = {
        "wait_s": 0.0,
        "forward_backward_s": 0.0,
        "optimizer_s": 0.0,
        "gather_s": 0.0,
        "tokens": 0.0,
        "padding_ratio": 0.0,
        "update_actor_s": 0.0,
    }
    peak_memory, memory_by_step, measured = 0.0, [], 0
    for step in range(cfg.steps + 1):
        reset_peak_memory(ctx.device)
        started = time.perf_counter()
        # Rank 0 decides for every rank, with the batch: the ranks must stop at the same step.
        stop = measured > 0 and cfg.past_deadline()
        stop, batch = D.broadcast_object(
            (stop, None if stop else make_batch(cfg, step, vocab)) if ctx.is_main else None
        )
        if stop:
            break
        waited = time.perf_counter() - started
        _sync(cfg)
        started = time.perf_counter()
        with autocast:
            metrics = train_step(models, batch, settings, pad_id=0)
        _sync(cfg)
        trained = time.perf_counter() - started
        gathered = stream_weights(models.actor, gather, None, version=step + 1, step=step)["timing/gather_s"]
        peak_memory = max(peak_memory, max_memory_allocated_gb(ctx.device) or 0.0)
        if ctx.device.type == "cuda":
            memory_by_step.append(torch.cuda.memory_allocated(ctx.device) / 1024**3)
        if ctx.is_main:
            _progress(fsdp, step, cfg.steps, sum(x.length for x in batch), trained, gathered, memory_by_step)
        if step == 0:
            if ctx.is_main:
                print(f"bench trainer: compiled so far: {compile_summary()}", file=sys.stderr, flush=True)
            continue  # warm-up: allocator, kernels, first all-gathers (and compilation)
        measured += 1
        totals["wait_s"] += waited
        totals["optimizer_s"] += metrics["timing/optimizer_s"]
        totals["forward_backward_s"] += trained - metrics["timing/optimizer_s"]
        totals["gather_s"] += gathered
        totals["tokens"] += sum(x.length for x in batch)
        totals["padding_ratio"] += metrics["perf/padding_ratio"]
        totals["update_actor_s"] += metrics["timing_s/update_actor"]
    profiled = _profile_step(cfg, ctx, models, settings, vocab, autocast) if cfg.profile and fsdp else None
    result: dict[str, Any] = {k: v / measured for k, v in totals.items()}
    result["profile"] = profiled
    result["compile"] = compile_summary()
    result["steps"] = measured
    result["params"] = float(perf.params)
    result["peak"] = perf.peak
    result["max_memory_allocated_gb"] = peak_memory
    result["memory_allocated_gb_by_step"] = memory_by_step
    return result


def _profile_step(
    cfg: BenchConfig, ctx: D.DistContext, models: Models, settings: TrainerSettings, vocab: int, autocast: Any
) -> dict[str, Any]:
    """One step past the measured ones under torch.profiler: where its time went, by kind of kernel
    (:mod:`relayrl.profiling`; rank 0's is the one reported). Not counted in the figures: the
    profiler slows the host. Past the deadline, decided by rank 0 for every rank as for the measured
    steps, ``{"skipped": "timeout"}``."""
    from relayrl.profiling import profile

    stop = cfg.past_deadline()
    stop, batch = D.broadcast_object(
        (stop, None if stop else make_batch(cfg, cfg.steps + 1, vocab)) if ctx.is_main else None
    )
    if stop:
        return {"skipped": "timeout"}
    _sync(cfg)

    def step() -> None:
        with autocast:
            train_step(models, batch, settings, pad_id=0)

    try:
        _, summary = profile(step, ctx.device)
    except RuntimeError as exc:  # the profiler itself; the profile explains the figures, never costs them
        summary = {"error": f"{type(exc).__name__}: {exc}"}
    if ctx.is_main:
        print(f"bench trainer: profiled step: {summary.get('by_kind', summary)}", file=sys.stderr, flush=True)
    return summary


def _progress(fsdp: bool, step: int, steps: int, tokens: int, trained: float, gathered: float, memory: list) -> None:
    """One line per step on stderr: a run cut short (a budget, a hang) still says how far it got
    and where its time went; stdout keeps the one JSON line."""
    what = "fsdp" if fsdp else "single"
    label = "warm-up" if step == 0 else f"step {step}/{steps}"
    allocated = f", allocated {memory[-1]:.2f} GiB" if memory else ""
    print(
        f"bench trainer: {what} {label}: {tokens} tokens, train {trained:.2f} s, gather {gathered:.2f} s{allocated}",
        file=sys.stderr,
        flush=True,
    )


def _sync(cfg: BenchConfig) -> None:
    if cfg.device == "cuda":
        torch.cuda.synchronize()


def _mfu(cfg: BenchConfig, tokens_per_s: float, params: float, peak: float | None, world_size: int) -> float | None:
    """MFU of the whole train step: 6 · params FLOPs per token, plus 2 when the proximal forward runs
    (one mini-batch here, so only when forced: see skips_old_log_prob)."""
    flops_per_param = 8 if cfg.recompute_old_log_prob == "always" else 6
    return None if peak is None else tokens_per_s * flops_per_param * params / (peak * world_size)


def run_bench(cfg: BenchConfig, timeout_s: float | None = None) -> dict[str, Any]:
    """FSDP over the ranks, then the plain model in this process; with ``timeout_s``, steps and the
    plain-model run that would start after it are left out (the JSON says how many were measured),
    so a budgeted run still reports the FSDP figures."""
    if timeout_s is not None:
        cfg = replace(cfg, deadline_unix=time.time() + timeout_s)
    world = cfg.world_size or (torch.cuda.device_count() if cfg.device == "cuda" else 2)
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-trainer-") as tmp:
        model_dir = write_model(cfg, Path(tmp) / "model")
        out = Path(tmp) / "fsdp.json"
        cmd = [
            sys.executable,
            "-m",
            "relayrl.torchrun",
            "--standalone",
            f"--nproc-per-node={world}",
            "-m",
            "services.trainer.bench",
            json.dumps(asdict(cfg)),
            str(model_dir),
            str(out),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        # The ranks' output goes to stderr as it comes (not captured): their progress, and a
        # traceback, stay readable when the run fails or is interrupted.
        done = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=sys.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"FSDP benchmark ranks failed (exit code {done.returncode}); their output is above")
        fsdp = json.loads(out.read_text())
        if cfg.device == "cpu":
            # The baseline gets the cores the N ranks had (one thread each), so the comparison is
            # of FSDP against plain intra-op parallelism on the same hardware.
            torch.set_num_threads(world * int(env["OMP_NUM_THREADS"]))
        single = _measure(cfg, model_dir, fsdp=False) if cfg.single_process and not cfg.past_deadline() else None

    def rate(r: dict[str, Any]) -> float:
        return r["tokens"] / (r["forward_backward_s"] + r["optimizer_s"])

    train_s = fsdp["forward_backward_s"] + fsdp["optimizer_s"]
    result: dict[str, Any] = {
        "benchmark": "trainer",
        "device": cfg.device,
        "device_name": torch.cuda.get_device_name() if cfg.device == "cuda" else "cpu",
        "preset": cfg.preset,
        "workload": cfg.workload,
        "recompute_old_log_prob": cfg.recompute_old_log_prob,
        "use_remove_padding": cfg.use_remove_padding,
        "enable_gradient_checkpointing": cfg.enable_gradient_checkpointing,
        "use_torch_compile": cfg.use_torch_compile,
        "attn_implementation": cfg.attn_implementation,
        "micro_batch_tokens": cfg.micro_batch_tokens,
        "params": int(fsdp["params"]),
        "world_size": world,
        "tokens_per_step": fsdp["tokens"],
        "tokens_per_s": round(rate(fsdp), 2),
        "perf/throughput": round(rate(fsdp) / world, 2),
        "perf/mfu/actor": mfu(fsdp["tokens"], fsdp["params"], fsdp["update_actor_s"], fsdp["peak"], world),
        "perf/max_memory_allocated_gb": round(fsdp["max_memory_allocated_gb"], 3) if cfg.device == "cuda" else None,
        "timing_s/update_weights": round(fsdp["gather_s"], 5),
        "wait_s": round(fsdp["wait_s"], 5),
        "forward_backward_s": round(fsdp["forward_backward_s"], 5),
        "optimizer_s": round(fsdp["optimizer_s"], 5),
        "train_s": round(train_s, 5),
        "gather_s": round(fsdp["gather_s"], 5),
        "padding_ratio": round(fsdp["padding_ratio"], 4),
        "memory_allocated_gb_by_step": [round(m, 4) for m in fsdp["memory_allocated_gb_by_step"]],
        "steps": fsdp["steps"],
    }
    # What torch.compile cost the FSDP rank (flex_attention, the log-prob statistics): its warm-up's share.
    result["compile"] = fsdp["compile"]
    if cfg.profile:
        result["profile"] = fsdp["profile"]
    if cfg.single_process and single is None:
        result["single_process_skipped"] = "timeout"
    if cfg.device == "cuda":
        result["mfu"] = _mfu(cfg, rate(fsdp), fsdp["params"], fsdp["peak"], world)
    if single is not None:
        result["single_process_steps"] = single["steps"]
        result["single_process_tokens_per_s"] = round(rate(single), 2)
        result["single_process_forward_backward_s"] = round(single["forward_backward_s"], 5)
        result["single_process_optimizer_s"] = round(single["optimizer_s"], 5)
        # FSDP's cost, side by side: 1.0 is as fast as the plain model, per GPU (on CPU the plain
        # model had the ranks' cores, so per job).
        per = world if cfg.device == "cuda" else 1
        result["fsdp_over_single"] = round(rate(fsdp) / per / rate(single), 4)
        if cfg.device == "cuda":
            result["single_process_mfu"] = _mfu(cfg, rate(single), fsdp["params"], fsdp["peak"], 1)
    return result


def _worker(cfg_json: str, model_dir: str, out: str) -> None:
    cfg = BenchConfig(**json.loads(cfg_json))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = _measure(cfg, Path(model_dir), fsdp=True)
    if D.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    D.shutdown()


if __name__ == "__main__":
    _worker(*sys.argv[1:4])
    D.exit_rank()
