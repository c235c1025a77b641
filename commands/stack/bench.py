"""``relayrl bench e2e``: the whole stack on one workload, measured against its own limit.

One invocation runs, one after another on the same workload, preset and CPU split:

1. **engine alone**: engines and rollouts generate a backlog of released prompts with no trainer;
2. **trainer alone**: the rollouts are paused and the trainer trains on that backlog, never
   waiting for generation (η is lifted so the backlog stays fresh);
3. **async**: the full pipeline at η = ``--async-staleness``;
4. **sync**: the full pipeline at η = 0.

A run cut short (``--budget-s`` spent, a phase past ``--timeout-s``, SIGINT, a phase that fails)
still prints its JSON, with ``complete: false``, ``stopped`` naming the phase and why, and None for
each figure of a phase that did not finish; it exits 1. A deadline that comes after a pipeline's
last measured step cuts only the trainer's end. A phase that fails or runs out of time prints the
end of each component's log on stderr first, since the temporary folder holding the logs goes with
the command.

``pipeline_efficiency`` is async samples/s over the pipeline's limit, named in the JSON
(``limit``): ``bottleneck``, the slower of the two stages alone, where they compute on separate
resources (their own CPU sets, or GPUs); ``serial``, ``1 / (1/T + 1/E)`` for trainer T and engine
E alone, where they share one GPU and so cannot both run at full speed: the two in series. 1.0
means the pipeline reaches its limit. A pipeline run's figures share one window, from the trainer's
first recorded step to its last measured one: start-up, and the end's checkpoint and exit, are
outside it (the trainer runs one step more than it measures: its last step stages the end's
checkpoint before it records its row). The engine alone is rated between its first and last pushed
group.

With ``--device cuda`` (``stack.device: cuda``, the GPU split of :mod:`commands.stack.gpus`), the
engine batches every sequence in flight and prefills as SGLang does on a GPU (``CUDA_ENGINE``, as
``bench engine`` runs it), a phase starts only with ``MIN_PHASE_S`` of ``--budget-s`` left, and each
mode also reports ``gpu_busy_fraction`` (NVML's utilization sampled over the window,
:mod:`relayrl.gpu_busy`); on every device, the trainer's MFU (its ``perf/mfu/actor``, None where the
GPU's peak is unknown or on CPU) and the engines' generated tokens/s.

A multi-turn workload (``agentic``) also reports, per mode, ``engine_idle_ratio`` (the share of
the window with no request at the engine: episodes waiting on the environment hold none) and the
environment's calls and seconds in the window from its own call log, and ``episodes``: model
turns per episode, measured on the backlog generated alone.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any

import typer

from commands.stack.config import StackConfig, StackSettings
from commands.stack.cpus import plan_cpus
from commands.stack.environment import Calls, read_calls
from commands.stack.launch import LocalStack
from commands.stack.progress import read_samples
from commands.stack.report import read_metrics
from commands.stack.supervisor import Supervisor, supervised
from commands.stack.workloads import DEFAULT_TOOL_LATENCY_MS, DTYPES, Workload, get_workload, native_bf16
from relayrl.devices import DeviceName
from relayrl.gpu_busy import GpuBusyMeter, NvmlGpus

PRESETS = ("tiny", "small", "base")
# η of the stage-alone phase: high enough that the backlog never goes stale while training on it.
UNBOUNDED_STALENESS = 1_000_000
DEFAULT_READY_TIMEOUT_S = StackSettings.model_fields["ready_timeout_s"].default
# An engine on CUDA compiles flex_attention and captures its decode graphs before it is ready.
CUDA_READY_TIMEOUT_S = 600.0
# The engine on a GPU, as bench engine runs it: every sequence in flight (32 prompts of 8 samples) in
# one batch, and SGLang's GPU default for a step's prefill; the engine's own defaults are for CPUs.
CUDA_ENGINE = {"max_running_requests": 256, "max_prefill_tokens": 16384}
# Of --budget-s, what a phase needs left to start: less, and its stack would start only to be stopped
# (on a GPU an engine on base starts in about 30 s and the trainer's first step compiles for about 73 s).
MIN_PHASE_S: dict[str, float] = {"cpu": 15.0, "cuda": 120.0}


class CpuMeter:
    """Busy share of the whole machine between ``start`` and ``stop``, from /proc/stat."""

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def start(self) -> None:
        self._busy, self._total = self._read()

    def stop(self) -> float:
        busy, total = self._read()
        return (busy - self._busy) / max(total - self._total, 1)


@dataclass(frozen=True, slots=True)
class ModeResult:
    samples_per_s: float
    trainer_idle_ratio: float
    rollout_idle_ratio: float
    cpu_busy_ratio: float
    weight_version_s: float
    paused_per_version_s: float
    engine_paused_per_version_s: float
    queue_share_of_step: float
    padding_ratio: float
    max_step_wait_s: float
    reward_at_end: float
    staleness_violations: int
    lost_groups: int
    steps: int
    # The environment's calls that ended in the window (multi-turn workloads; zero otherwise).
    env_calls: Calls
    window_s: float
    # Tokens the engines generated per second of the window, all engines together.
    engine_tokens_per_s: float = 0.0
    # The trainer's perf/mfu/actor over its steps; None where it reports none (CPU, unknown peak).
    trainer_mfu: float | None = None
    # NVML's busy share of the stack's GPUs over the window; None on CPU.
    gpu_busy_fraction: float | None = None
    # The share of versions the trainer also handed over by handle (share_weights_by_handle; None
    # where it is off), and the replicas' loads by handle that fell back to the bytes.
    weights_by_handle: float | None = None
    handle_fallbacks: int = 0


@dataclass(frozen=True, slots=True)
class GpuSplit:
    """The GPUs of a ``--device cuda`` bench, as its JSON names them."""

    names: tuple[str, ...]
    # CUDA_VISIBLE_DEVICES of the trainer and of each engine (GpuPlan.describe).
    split: dict[str, object]
    # Trainer and an engine compute on one GPU: the stages run in series there.
    serial: bool


@dataclass(slots=True)
class Measured:
    """The phases' figures, each set as its phase ends: every one after a whole run, those of the
    phases that finished after a run cut short (its budget spent, a phase past its limit, SIGINT)."""

    engine_samples_per_s: float | None = None
    trainer_samples_per_s: float | None = None
    # Of the backlog the engine generated alone.
    generated_lengths: dict[str, float] = field(default_factory=dict)
    # Multi-turn workloads: episodes in the backlog and their model turns; empty otherwise.
    episodes: dict[str, float] = field(default_factory=dict)
    sync: ModeResult | None = None
    asynchronous: ModeResult | None = None


# Every workload switches weights in place unless --partial-rollout-mode says otherwise. On this
# CPU stack an abort_resume switch under load (every sample in flight aborted and resubmitted)
# paused generation 0.24 s per version instead of 0.03 s and cut the toy's asynchronous
# throughput threefold (README); an agentic turn is two tokens, and resubmitting it would
# re-prefill the whole episode for at most one more.
BENCH_PARTIAL_ROLLOUT_MODE = "in_place"


@dataclass(frozen=True, slots=True)
class BenchRun:
    """What every phase of one invocation shares."""

    work: Path
    model_dir: Path
    dataset: Path
    workload: Workload
    seed: int
    timeout_s: float
    tool_latency_ms: float = 0.0
    # fp32 or bf16: the trainer's FSDP2 param_dtype and the engine's weights.
    dtype: str = "fp32"
    # The rollout's partial_rollout_mode; None: BENCH_PARTIAL_ROLLOUT_MODE.
    partial_rollout_mode: str | None = None
    # Trainer settings over the workload's (`bench staleness` runs max_staleness auto through it).
    trainer_overrides: dict[str, Any] = field(default_factory=dict)
    # stack.device: where the trainer and the engines compute.
    device: DeviceName = "cpu"
    # time.monotonic() past which no phase waits any longer (--budget-s); None: each phase's timeout_s only.
    deadline: float | None = None

    def phase_deadline(self) -> float:
        """When a phase starting now must end: its timeout_s, or the run's deadline if that comes first.
        Past the run's deadline a phase does not start (its stack would start only to stop)."""
        now = time.monotonic()
        if self.deadline is None:
            return now + self.timeout_s
        if now >= self.deadline:
            raise TimeoutError("the budget (--budget-s) was spent before it started")
        if (left := self.deadline - now) < MIN_PHASE_S[self.device]:
            raise TimeoutError(f"{left:.0f} s of the budget (--budget-s) left, too little to start a phase")
        return min(now + self.timeout_s, self.deadline)

    @property
    def rollout_mode(self) -> str:
        return self.partial_rollout_mode or BENCH_PARTIAL_ROLLOUT_MODE

    def ready_timeout_s(self) -> float:
        """How long the stack's start may wait for its services: a first CUDA start compiles, but never
        past the run's deadline (a start that outlasted it would leave no time to stop and print)."""
        ready = CUDA_READY_TIMEOUT_S if self.device == "cuda" else DEFAULT_READY_TIMEOUT_S
        return ready if self.deadline is None else max(1.0, min(ready, self.deadline - time.monotonic()))

    def config(self, name: str, eta: int, steps: int) -> StackConfig:
        """The stack of one phase measuring ``steps`` trainer steps (the trainer runs :data:`TAIL_STEPS` more)."""
        environment = self.workload.environment
        return StackConfig(
            stack=StackSettings(
                run_id=name,
                runs_dir=self.work / "runs",
                model_dir=self.model_dir,
                max_staleness=eta,
                device=self.device,
                ready_timeout_s=self.ready_timeout_s(),
            ),
            trainer={
                **self.workload.trainer_settings(self.dataset, steps + TAIL_STEPS, self.seed),
                "param_dtype": self.dtype,
                # What a version carries is what the engine below loads (its dtype from the same flag).
                "rollout_dtype": self.dtype,
                **self.trainer_overrides,
            },
            rollout={
                "max_inflight_prompts": 32,
                "max_new_tokens": self.workload.max_new_tokens,
                **self.workload.rollout,
                "partial_rollout_mode": self.rollout_mode,
                **(environment(self.env_dir(name), self.tool_latency_ms) if environment else {}),
            },
            engine={
                **(CUDA_ENGINE if self.device == "cuda" else {}),
                **self.workload.engine,
                "dtype": "bfloat16" if self.dtype == "bf16" else "float32",
            },
        )

    def env_dir(self, name: str) -> Path:
        """Where the environment of run ``name`` keeps its configs and call log."""
        return self.work / "env" / name


def _queue_stats(address: str, prompts: bool = False) -> Any:
    from services.queue.client import QueueClient

    async def fetch() -> Any:
        async with QueueClient(address) as client:
            return await (client.prompt_stats() if prompts else client.stats())

    return asyncio.run(fetch())


def _lost_groups(queue_address: str) -> int:
    s = _queue_stats(queue_address)
    return s.total_produced - s.total_consumed - sum(s.dropped_by_reason.values()) - s.queue_size - s.pending


# The rollout side's figures of a measurement window: their samples on a rollout's /metrics.
ROLLOUT_FIGURES = {
    "busy": "relayrl_rollout_generation_busy_seconds_total",
    "update_sum": "relayrl_rollout_weight_update_duration_seconds_sum",
    "update_count": "relayrl_rollout_weight_update_duration_seconds_count",
    "paused_sum": "relayrl_rollout_generation_paused_seconds_sum",
    "paused_count": "relayrl_rollout_generation_paused_seconds_count",
    "handle_fallbacks": "relayrl_rollout_handle_fallbacks_total",
}


# The engines' own: how long their schedulers took no step for weight updates (a pause to its
# continue, or an update run between two steps). The rollout's ``paused`` also holds the calls'
# round trips and the wait for the engine's running step, while the engine still generates.
ENGINE_FIGURES = {
    "engine_paused_sum": "relayrl_engine_generation_paused_seconds_sum",
    "generated_tokens": "relayrl_engine_generated_tokens_total",
}


class Counters:
    """Counters summed over services of one kind, read at the start and end of a measurement window."""

    def __init__(self, urls: list[str], figures: dict[str, str]) -> None:
        self.urls, self.figures = urls, figures

    def read(self) -> dict[str, float]:
        # A service that does not answer fails the bench: counted as zero it would read as idle.
        out = dict.fromkeys(self.figures, 0.0)
        for url in self.urls:
            samples = read_samples(url)
            if missing := [name for name in self.figures.values() if name not in samples]:
                raise RuntimeError(f"{url}/metrics has no {', '.join(missing)}")
            for key, sample in self.figures.items():
                out[key] += samples[sample]
        return out


class Window:
    """A pipeline run's measurement window, from the trainer's first recorded step to ``last_step``:
    the machine's and the GPUs' busy shares and the services' counters, read when it opens and when it
    closes."""

    def __init__(self, gpu: GpuBusyMeter | None, counters: list[Counters], last_step: int) -> None:
        self.cpu, self.gpu, self.counters, self.last_step = CpuMeter(), gpu, counters, last_step
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.cpu_busy = 0.0
        self.gpu_busy: float | None = None
        self.opened_at = self.unix = self.elapsed = 0.0
        self.closed = False

    def open(self) -> None:
        self.cpu.start()
        if self.gpu is not None:
            self.gpu.start()
        self.start = self._read()
        self.opened_at, self.unix = time.monotonic(), time.time()

    def close(self) -> None:
        """Reads the ends once; a second call keeps the first's."""
        if self.closed:
            return
        self.closed = True
        self.cpu_busy = self.cpu.stop()
        self.gpu_busy = self.gpu.stop() if self.gpu is not None else None
        self.end = self._read()
        self.elapsed = time.monotonic() - self.opened_at

    def _read(self) -> dict[str, float]:
        return {key: value for counters in self.counters for key, value in counters.read().items()}

    def delta(self, key: str) -> float:
        return self.end[key] - self.start[key]


PROGRESS_EVERY_S = 15.0
# Trainer steps past the measured ones. A run's last step checkpoints (whatever save_freq says)
# before it records its row, and on a GPU staging that checkpoint (fp32 master weights and Adam's
# state, 6 GB on base, to host memory) takes about as long as a step: no part of a pipeline's rate.
TAIL_STEPS = 1


def _wait_trainer(
    stack: LocalStack,
    supervisor: Supervisor,
    deadline: float,
    what: str,
    window: Window | None = None,
) -> None:
    """Waits for the trainer to finish, opening ``window`` once its first step is recorded and closing
    it once its last step is: what follows (the last checkpoint becoming durable, the process ending)
    is no part of the steps its samples/s counts."""
    metrics_path = stack.run_dir / "metrics.jsonl"
    size, seen_first = 0, False
    shown = time.monotonic()
    while stack.trainer_exit_code() is None:
        supervisor.check_alive(exited_ok=["trainer"])
        if metrics_path.exists() and (grown := metrics_path.stat().st_size) > size:
            size = grown
            if not seen_first and window is not None:
                window.open()
            seen_first = True
            if window is not None and not window.closed and _last_step(stack) >= window.last_step:
                window.close()
        if seen_first and time.monotonic() - shown > PROGRESS_EVERY_S:
            shown = time.monotonic()
            rows = _trainer_rows(stack)
            _phase(f"{what}: step {rows[-1]['trainer/global_steps']}, reward {rows[-1]['critic/score/mean']:.3f}")
        if time.monotonic() > deadline:
            if window is not None and window.closed:
                # Every measured step is in: what the deadline cuts (the tail step, the last
                # checkpoint, the exit) is no part of the figures.
                _phase(f"{what}: the deadline came after the last measured step; the trainer's end is cut")
                return
            raise TimeoutError(f"{what}: the trainer did not finish in time (the end of its logs is printed above)")
        time.sleep(0.2)
    if stack.trainer_exit_code() != 0:
        code = stack.trainer_exit_code()
        raise RuntimeError(f"{what}: trainer exited with {code} (the end of its logs is printed above)")
    if window is not None and seen_first:
        window.close()  # where the last step's row and the exit came within one poll


def _last_step(stack: LocalStack) -> int:
    rows = _trainer_rows(stack)
    return int(rows[-1]["trainer/global_steps"]) if rows else 0


def _trainer_rows(stack: LocalStack) -> list[dict[str, Any]]:
    return [r for r in read_metrics(stack.run_dir / "metrics.jsonl") if "trainer/global_steps" in r]


def _samples_per_s(rows: list[dict[str, Any]]) -> float:
    first, last = rows[0], rows[-1]
    return (last["trainer/processed_samples"] - first["trainer/processed_samples"]) / (last["time"] - first["time"])


def run_mode(run: BenchRun, eta: int, steps: int, name: str | None = None) -> ModeResult:
    """The full pipeline at η = ``eta`` for ``steps`` steps, as run ``name`` (default eta<η>)."""
    name = name or f"eta{eta}"
    deadline = run.phase_deadline()
    with supervised(None) as supervisor:
        stack = LocalStack(run.config(name, eta, steps), supervisor)
        gpu = GpuBusyMeter(NvmlGpus(stack.gpus.gpus)) if stack.gpus is not None else None
        stack.start(run.model_dir)
        rollouts = Counters(stack.endpoints.rollouts_http, ROLLOUT_FIGURES)
        window = Window(gpu, [rollouts, Counters(stack.endpoints.engines, ENGINE_FIGURES)], last_step=steps)
        _wait_trainer(stack, supervisor, deadline, f"η = {eta}", window)
        lost = _lost_groups(stack.endpoints.queue_grpc)
        every_row = _trainer_rows(stack)
        rows = every_row[:steps]
    elapsed = window.elapsed
    env_calls = read_calls(run.env_dir(name) / "calls.log", window.unix, window.unix + elapsed)
    updates = max(window.delta("update_count"), 1.0)
    publish_s = statistics.fmean(r.get("timing/publish_s", 0.0) for r in rows)
    return ModeResult(
        samples_per_s=_samples_per_s(rows),
        trainer_idle_ratio=statistics.fmean(r["trainer/idle_ratio"] for r in rows[1:]),
        rollout_idle_ratio=max(0.0, 1.0 - window.delta("busy") / (elapsed * len(rollouts.urls))),
        cpu_busy_ratio=window.cpu_busy,
        weight_version_s=publish_s + window.delta("update_sum") / updates,
        paused_per_version_s=window.delta("paused_sum") / updates,
        engine_paused_per_version_s=window.delta("engine_paused_sum") / updates,
        queue_share_of_step=statistics.fmean(r.get("timing/queue_s", 0.0) / r["timing/step_s"] for r in rows[1:]),
        padding_ratio=statistics.fmean(r.get("perf/padding_ratio", 0.0) for r in rows),
        max_step_wait_s=max(r["timing/wait_s"] for r in rows[1:]),
        reward_at_end=statistics.fmean(r["critic/score/mean"] for r in rows[-5:]),
        staleness_violations=sum(1 for r in every_row if r["staleness/max_sample_age"] > eta),
        lost_groups=lost,
        steps=len(rows),
        env_calls=env_calls,
        window_s=elapsed,
        engine_tokens_per_s=window.delta("generated_tokens") / elapsed,
        trainer_mfu=_mean_of(rows[1:], "perf/mfu/actor"),
        gpu_busy_fraction=window.gpu_busy,
        weights_by_handle=_mean_of(rows, "trainer/weights_shared_by_handle"),
        handle_fallbacks=int(window.delta("handle_fallbacks")),
    )


def _mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the rows that report it; None where none does."""
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def pipeline_limit(engine_samples_per_s: float, trainer_samples_per_s: float, serial: bool) -> tuple[str, float]:
    """The pipeline's limit, named: the two stages in series where they share one GPU, else the slower one."""
    if serial:
        return "serial", 1.0 / (1.0 / engine_samples_per_s + 1.0 / trainer_samples_per_s)
    return "bottleneck", min(engine_samples_per_s, trainer_samples_per_s)


def _prompt_specs(dataset: Path, model_dir: Path, workload: Workload, count: int, seed: int) -> list[Any]:
    """The workload's first ``count`` prompts as the trainer would release them (at version 0)."""
    from relayrl.models.loading import load_tokenizer
    from services.trainer.data import read_rows, response_budget, to_spec, tokenize_rows

    rows = tokenize_rows(read_rows(str(dataset), 0, 1, seed, "train")[:count], load_tokenizer(model_dir), "bench", 512)
    now = time.time()
    return [
        to_spec(row, workload.n_samples, 0, 0, now, max_new_tokens=response_budget(row, workload.max_new_tokens))
        for row in rows
    ]


def _backlog(redis_url: str, run_id: str) -> list[Any]:
    """Every trajectory of the groups waiting in the stream."""
    import redis

    from relayrl.v1 import trajectory_pb2
    from services.queue.keys import Keys

    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.xrange(Keys(run_id).trajectories)
    finally:
        client.close()
    return [
        sample
        for _, fields in entries
        for sample in trajectory_pb2.TrajectoryGroup.FromString(fields[b"payload"]).trajectories
    ]


def _generated_lengths(samples: list[Any]) -> dict[str, float]:
    """Median, p90, p99 and max of the response lengths."""
    import numpy as np

    lengths = [len(sample.response_token_ids) for sample in samples]
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {"samples": len(lengths), "median": p50, "p90": p90, "p99": p99, "max": float(max(lengths))}


def _pause_rollouts(stack: LocalStack) -> None:
    from pydantic import SecretStr

    from commands.ctl.components import RolloutControl

    for url in stack.endpoints.rollouts_http:
        RolloutControl(url, SecretStr(stack.api_token), timeout_s=30).pause("abort")


def measure_alone(run: BenchRun, steps: int, measured: Measured) -> None:
    """Each stage at full speed on its own: generation of a backlog, then training on it."""
    workload = run.workload
    needed = (steps + TAIL_STEPS) * workload.batch_size
    deadline = run.phase_deadline()
    with supervised(None) as supervisor:
        stack = LocalStack(run.config("alone", UNBOUNDED_STALENESS, steps), supervisor)
        stack.start(run.model_dir, training=False)
        queue = stack.endpoints.queue_grpc
        # Twice the backlog training needs, so the engine runs full until the window closes.
        specs = _prompt_specs(run.dataset, run.model_dir, workload, 2 * needed, run.seed)

        async def release() -> None:
            from services.queue.client import QueueClient

            async with QueueClient(queue) as client:
                await client.release(specs)

        asyncio.run(release())
        first: tuple[float, int] | None = None
        while (produced := _queue_stats(queue).total_produced) < needed:
            supervisor.check_alive()
            if first is None and produced:
                first = (time.monotonic(), produced)
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine alone: {produced} of {needed} groups generated in time")
            time.sleep(0.1)
        assert first is not None
        seconds = max(time.monotonic() - first[0], 1e-9)
        measured.engine_samples_per_s = (produced - first[1]) * workload.n_samples / seconds
        _pause_rollouts(stack)
        backlog = _backlog(stack.endpoints.redis_url, stack.run_id)
        measured.generated_lengths = _generated_lengths(backlog)
        measured.episodes = _episodes(backlog) if workload.environment else {}
        stack.start_training(run.model_dir)
        _wait_trainer(stack, supervisor, deadline, "trainer alone")
        measured.trainer_samples_per_s = _samples_per_s(_trainer_rows(stack)[:steps])


def _episodes(samples: list[Any]) -> dict[str, float]:
    """Model turns per episode of the backlog (each answered by one environment call but a last cut-off one)."""
    turns = [len(sample.turn_ends) for sample in samples]
    return {"episodes": len(turns), "turns_per_episode": statistics.fmean(turns), "min_turns": float(min(turns))}


def _init_model(work: Path, preset: str) -> Path:
    import subprocess

    model_dir = work / f"model-{preset}"
    subprocess.run(
        [sys.executable, "-m", "commands.cli", "model", "init-tiny", str(model_dir), "--preset", preset],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return model_dir


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _by_mode(measured: Measured, figure: Callable[[ModeResult], float | None], digits: int = 3) -> dict[str, Any]:
    """A figure of each pipeline mode; None for a mode the run did not finish."""
    modes = {"sync": measured.sync, "async": measured.asynchronous}
    return {name: None if mode is None else _rounded(figure(mode), digits) for name, mode in modes.items()}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else round(numerator / denominator, 3)


# The figures each mode reports, by their name in ModeResult and in the JSON, and their digits.
MODE_FIGURES = {
    "trainer_idle_ratio": 3,
    "rollout_idle_ratio": 3,
    "cpu_busy_ratio": 3,
    "weight_version_s": 3,
    "paused_per_version_s": 3,
    "engine_paused_per_version_s": 3,
    "queue_share_of_step": 3,
    "padding_ratio": 3,
    "max_step_wait_s": 2,
    "reward_at_end": 3,
    "engine_tokens_per_s": 1,
    "trainer_mfu": 4,
    "gpu_busy_fraction": 3,
    "weights_by_handle": 3,
    "handle_fallbacks": 0,
    # How long the window each mode's figures are measured over lasted, first recorded step to last.
    "window_s": 1,
}


def result_json(
    workload: Workload,
    preset: str,
    steps: int,
    eta: int,
    measured: Measured,
    cpu_split: dict[str, object],
    tool_latency_ms: float = 0.0,
    dtype: str = "fp32",
    partial_rollout_mode: str = BENCH_PARTIAL_ROLLOUT_MODE,
    gpus: GpuSplit | None = None,
    stopped: str | None = None,
) -> dict[str, Any]:
    """The bench's JSON; a figure whose phases did not all finish (``stopped`` says why) is None."""
    engine, trainer = measured.engine_samples_per_s, measured.trainer_samples_per_s
    sync, asynchronous = measured.sync, measured.asynchronous
    sync_sps = None if sync is None else sync.samples_per_s
    async_sps = None if asynchronous is None else asynchronous.samples_per_s
    limit, limit_samples_per_s = None, None
    if engine is not None and trainer is not None:
        limit, limit_samples_per_s = pipeline_limit(engine, trainer, gpus is not None and gpus.serial)
    modes = [mode for mode in (sync, asynchronous) if mode is not None]
    result = {
        "benchmark": "e2e",
        "complete": stopped is None,
        "stopped": stopped,
        "workload": workload.name,
        "preset": preset,
        "device": "cpu" if gpus is None else "cuda",
        "gpus": None if gpus is None else {"names": list(gpus.names), **gpus.split},
        "dtype": dtype,
        "partial_rollout_mode": partial_rollout_mode,
        "steps": steps,
        "async_max_staleness": eta,
        "cpu_split": cpu_split,
        "engine_alone_samples_per_s": _rounded(engine, 2),
        "trainer_alone_samples_per_s": _rounded(trainer, 2),
        "sync_samples_per_s": _rounded(sync_sps, 2),
        "async_samples_per_s": _rounded(async_sps, 2),
        "limit": limit,
        "limit_samples_per_s": _rounded(limit_samples_per_s, 2),
        "pipeline_efficiency": _ratio(async_sps, limit_samples_per_s),
        "speedup": _ratio(async_sps, sync_sps),
        **{name: _by_mode(measured, attrgetter(name), digits) for name, digits in MODE_FIGURES.items()},
        "generated_lengths": {k: round(v, 1) for k, v in measured.generated_lengths.items()},
        "staleness_violations": sum(mode.staleness_violations for mode in modes),
        "lost_groups": sum(mode.lost_groups for mode in modes),
    }
    if workload.environment is not None:
        result |= _agentic_json(measured, tool_latency_ms)
    return result


def _agentic_json(measured: Measured, tool_latency_ms: float) -> dict[str, Any]:
    return {
        "tool_latency_ms": tool_latency_ms,
        # One engine serves the one replica: no request in flight from it means an idle engine.
        "engine_idle_ratio": _by_mode(measured, attrgetter("rollout_idle_ratio")),
        "env_calls": _by_mode(measured, lambda m: m.env_calls.count, 0),
        "env_s": _by_mode(measured, lambda m: m.env_calls.seconds, 1),
        "env_s_per_call": _by_mode(measured, lambda m: m.env_calls.seconds / max(m.env_calls.count, 1)),
        # Environment calls waiting at once, on average over the window.
        "env_concurrency": _by_mode(measured, lambda m: m.env_calls.seconds / m.window_s, 1),
        "episodes": {k: round(v, 3) for k, v in measured.episodes.items()},
    }


def render_table(result: dict[str, Any]) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bench e2e: {result['workload']} workload, {result['preset']} preset")
    table.add_column("figure")
    table.add_column("sync (η = 0)", justify="right")
    table.add_column(f"async (η = {result['async_max_staleness']})", justify="right")
    table.add_row("samples/s", str(result["sync_samples_per_s"]), str(result["async_samples_per_s"]))
    for key in (
        "engine_tokens_per_s",
        "trainer_mfu",
        "gpu_busy_fraction",
        "weights_by_handle",
        "trainer_idle_ratio",
        "rollout_idle_ratio",
        "cpu_busy_ratio",
        "weight_version_s",
        "paused_per_version_s",
        "engine_paused_per_version_s",
        "queue_share_of_step",
        "padding_ratio",
        "max_step_wait_s",
        "reward_at_end",
        "window_s",
    ):
        table.add_row(key, str(result[key]["sync"]), str(result[key]["async"]))
    for key in ("engine_idle_ratio", "env_calls", "env_s", "env_s_per_call", "env_concurrency"):
        if key in result:
            table.add_row(key, str(result[key]["sync"]), str(result[key]["async"]))
    out = StringIO()
    console = Console(file=out, width=100)
    console.print(table)
    for key in (
        "engine_alone_samples_per_s",
        "trainer_alone_samples_per_s",
        "limit",
        "limit_samples_per_s",
        "pipeline_efficiency",
        "speedup",
        "staleness_violations",
        "lost_groups",
        "generated_lengths",
        "cpu_split",
        "gpus",
        "tool_latency_ms",
        "episodes",
    ):
        if key in result:
            console.print(f"{key}: {result[key]}")
    if result["stopped"]:
        console.print(f"cut short, figures of the phases that did not finish are None: {result['stopped']}")
    return out.getvalue()


def _gpu_split(device: str) -> GpuSplit | None:
    """The GPUs a ``--device cuda`` bench computes on, checked before anything starts (None on cpu); a
    device this machine lacks, or NVML missing, stops the command with one line."""
    if device == "cpu":
        return None
    if device != "cuda":
        raise typer.BadParameter(f"unknown device {device!r}; choose cpu or cuda", param_hint="--device")
    from commands.stack.gpus import device_problem, gpu_plan
    from relayrl.extras import MissingExtra

    config = StackConfig(stack=StackSettings(device="cuda"))
    if problem := device_problem(config):
        raise typer.BadParameter(problem.removeprefix("stack.device: "), param_hint="--device")
    plan = gpu_plan(config)
    assert plan is not None
    try:
        names = NvmlGpus(plan.gpus).names
    except (MissingExtra, RuntimeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--device") from None
    return GpuSplit(names, plan.describe(), plan.engines_beside_trainer)


def _phase(message: str) -> None:
    typer.echo(f"[bench e2e {time.strftime('%H:%M:%S')}] {message}", err=True)


def log_tails(work: Path, lines: int = 20) -> None:
    """The end of each component's log of the last phase's stack, on stderr, for a phase that failed or
    was cut short: the work folder holding them goes with the command."""
    runs = sorted((work / "runs").glob("*/logs"), key=lambda logs: logs.stat().st_mtime)
    for log in sorted(runs[-1].glob("*.log")) if runs else []:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        _phase(f"the last {len(tail)} lines of {log.relative_to(work / 'runs')}:")
        typer.echo("\n".join(tail), err=True)


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line only.")] = False,
    workload: Annotated[
        str,
        typer.Option(help="toy, realistic (long-tailed, to 512 tokens) or agentic (multi-turn, slow environment)."),
    ] = "toy",
    preset: Annotated[str, typer.Option(help="Model preset: tiny, small or base.")] = "tiny",
    steps: Annotated[
        int | None,
        typer.Option(min=3, help="Trainer steps of the sync and async runs (toy 100, realistic 10, agentic 20)."),
    ] = None,
    alone_steps: Annotated[
        int | None, typer.Option(min=3, help="Trainer steps of the stage-alone run (toy 10, realistic 4, agentic 6).")
    ] = None,
    async_staleness: Annotated[int, typer.Option(min=1, help="η of the asynchronous run.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the dataset and the trainer.")] = 0,
    timeout_s: Annotated[float, typer.Option(help="Longest run per phase, seconds.")] = 1800,
    budget_s: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Longest wait for all phases together, seconds: a phase still running then is stopped, and the"
            " JSON holds the figures of those that finished (complete: false), as after a timeout or SIGINT.",
        ),
    ] = None,
    json_out: Annotated[Path | None, typer.Option(help="Also write the JSON object to this file.")] = None,
    tool_latency_ms: Annotated[
        float | None,
        typer.Option(
            min=0, help=f"agentic only: the environment's latency per call, ms (default {DEFAULT_TOOL_LATENCY_MS:g})."
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="Compute dtype of the trainer (FSDP2 param_dtype) and the engine's weights: fp32 or bf16 (fast "
            "on CPUs with AVX512-BF16 or AMX); default fp32 on cpu, bf16 on cuda."
        ),
    ] = None,
    device: Annotated[
        str,
        typer.Option(
            help="Where the trainer and the engine compute (stack.device): cpu, or cuda (every stage on the"
            " GPU(s), split as `relayrl up` does; adds gpu_busy_fraction from NVML: pip install 'relayrl[gpu]')."
        ),
    ] = "cpu",
    partial_rollout_mode: Annotated[
        str | None,
        typer.Option(
            help="What a weight update does to generations in flight: in_place (every workload's default), "
            "abort_resume or restart (the rollout's partial_rollout_mode)."
        ),
    ] = None,
) -> None:
    """Engine alone, trainer alone, async and sync (η = 0) pipelines on one workload: efficiency, idle, losses."""
    try:
        chosen = get_workload(workload)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--workload") from None
    if preset not in PRESETS:
        raise typer.BadParameter(
            f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}", param_hint="--preset"
        )
    if tool_latency_ms is not None and chosen.environment is None:
        raise typer.BadParameter(
            f"the {chosen.name} workload is single-turn: it has no environment to slow down",
            param_hint="--tool-latency-ms",
        )
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    if dtype not in DTYPES:
        raise typer.BadParameter(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}", param_hint="--dtype")
    gpus = _gpu_split(device)
    from services.rollout.config import PARTIAL_ROLLOUT_MODES

    if partial_rollout_mode not in (None, *PARTIAL_ROLLOUT_MODES):
        raise typer.BadParameter(
            f"unknown mode {partial_rollout_mode!r}; choose one of {', '.join(PARTIAL_ROLLOUT_MODES)}",
            param_hint="--partial-rollout-mode",
        )
    latency_ms = DEFAULT_TOOL_LATENCY_MS if tool_latency_ms is None else tool_latency_ms
    steps = steps or chosen.bench_steps
    alone_steps = alone_steps or chosen.bench_alone_steps
    cpu_split = plan_cpus(StackSettings().cpus, replicas=1, trainer_procs=1).describe()
    deadline = None if budget_s is None else time.monotonic() + budget_s
    measured, phase, stopped = Measured(), "", None
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-e2e-") as tmp:
        work = Path(tmp)
        _phase(f"{chosen.name} workload, {preset} preset, {dtype}, CPUs {cpu_split}")
        if gpus is not None:
            _phase(f"GPUs {', '.join(gpus.names)}: {gpus.split}; limit {'serial' if gpus.serial else 'bottleneck'}")
        if dtype == "bf16" and device == "cpu" and not native_bf16():
            _phase("this CPU has no native bf16 (AVX512-BF16 or AMX): torch emulates it, slower than fp32")
        model_dir = _init_model(work, preset)
        dataset = chosen.write_dataset(work / f"{chosen.name}.jsonl", 4096, seed)
        tool_latency = latency_ms if chosen.environment else 0.0
        run = BenchRun(
            work, model_dir, dataset, chosen, seed, timeout_s, tool_latency, dtype, partial_rollout_mode,
            device="cpu" if gpus is None else "cuda", deadline=deadline,
        )  # fmt: skip
        # The asynchronous pipeline before the synchronous one: with the phases alone it gives the targets'
        # figures (pipeline_efficiency, gpu_busy_fraction), so a run cut short still has them.
        try:
            phase = f"engine alone, then trainer alone ({alone_steps} steps)"
            _phase(phase)
            measure_alone(run, alone_steps, measured)
            engine, trainer = measured.engine_samples_per_s, measured.trainer_samples_per_s
            _phase(f"engine {engine:.2f}, trainer {trainer:.2f} samples/s")
            phase = f"async pipeline (η = {async_staleness}, {steps} steps)"
            _phase(phase)
            measured.asynchronous = run_mode(run, async_staleness, steps)
            phase = f"sync pipeline (η = 0, {steps} steps)"
            _phase(f"async {measured.asynchronous.samples_per_s:.2f} samples/s; {phase}")
            measured.sync = run_mode(run, 0, steps)
        except TimeoutError as exc:
            stopped = f"{phase}: {exc}"
            log_tails(work)
        except KeyboardInterrupt:
            stopped = f"{phase}: interrupted"
        except Exception as exc:  # a phase that fails keeps the figures of those that finished
            stopped = f"{phase}: {type(exc).__name__}: {exc}"
            log_tails(work)
        if stopped is not None:
            _phase(f"cut short: {stopped}")
    result = result_json(
        chosen,
        preset,
        steps,
        async_staleness,
        measured,
        cpu_split,
        run.tool_latency_ms,
        run.dtype,
        run.rollout_mode,
        gpus,
        stopped,
    )
    if json_out is not None:
        json_out.write_text(json.dumps(result) + "\n")
    typer.echo(json.dumps(result) if json_output else render_table(result))
    if stopped is not None:
        raise typer.Exit(1)
