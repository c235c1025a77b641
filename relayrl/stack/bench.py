"""``relayrl bench e2e``: the same deployment run synchronously (η = 0) and asynchronously
(η = 2) in one invocation, on a workload whose response lengths have a long tail.

Most prompts ask to copy one bit; a few ask for 8 or 32 bits, each with a response budget just
above its answer, so a synchronous step always waits for its longest generation. Throughput is
measured between the first and the last training step (start-up excluded).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from relayrl.stack.config import StackConfig, StackSettings
from relayrl.stack.launch import LocalStack
from relayrl.stack.progress import scrape
from relayrl.stack.report import read_metrics
from relayrl.stack.supervisor import supervised

# (bits to copy, share of prompts): a long tail of long answers.
LENGTH_MIX = ((1, 0.85), (8, 0.10), (32, 0.05))


@dataclass(frozen=True, slots=True)
class ModeResult:
    samples_per_s: float
    trainer_idle_ratio: float
    rollout_idle_ratio: float
    reward_at_end: float
    staleness_violations: int
    lost_groups: int
    steps: int


def long_tail_dataset(path: Path, rows: int, seed: int) -> Path:
    rng = random.Random(seed)
    lengths, weights = zip(*LENGTH_MIX, strict=True)
    with path.open("w") as f:
        for index in range(rows):
            bits = "".join(rng.choice("01") for _ in range(rng.choices(lengths, weights)[0]))
            row = {
                "data_source": "relayrl/copy_bits",
                "prompt": [{"role": "user", "content": f"copy {bits}"}],
                "ability": "copy",
                "reward_model": {"style": "rule", "ground_truth": bits},
                "extra_info": {"index": index, "max_new_tokens": len(bits) + 2},
            }
            f.write(json.dumps(row) + "\n")
    return path


def _config(work: Path, model_dir: Path, dataset: Path, eta: int, steps: int) -> StackConfig:
    return StackConfig(
        stack=StackSettings(run_id=f"eta{eta}", runs_dir=work / "runs", model_dir=model_dir, max_staleness=eta),
        trainer={
            "dataset": str(dataset),
            "n_samples": 4,
            "batch_size": 8,
            "max_new_tokens": 40,
            "total_steps": steps,
            "checkpoint_every": steps,
            "lr": 0.003,
            "seed": 0,
        },
        rollout={"max_inflight_prompts": 32, "max_new_tokens": 40},
    )


def _busy_seconds(rollout_url: str) -> float:
    busy = scrape(rollout_url, "relayrl_rollout_generation_busy_seconds")
    if busy is None:
        raise RuntimeError(f"{rollout_url}/metrics has no relayrl_rollout_generation_busy_seconds_total")
    return busy


def _lost_groups(queue_address: str) -> int:
    from services.queue.client import QueueClient

    async def fetch() -> int:
        client = QueueClient(queue_address)
        try:
            s = await client.stats()
        finally:
            await client.close()
        return s.total_produced - s.total_consumed - sum(s.dropped_by_reason.values()) - s.queue_size - s.pending

    return asyncio.run(fetch())


def run_mode(work: Path, model_dir: Path, dataset: Path, eta: int, steps: int, timeout_s: float) -> ModeResult:
    config = _config(work, model_dir, dataset, eta, steps)
    with supervised(None) as supervisor:
        stack = LocalStack(config, supervisor)
        stack.start(model_dir)
        metrics_path = stack.run_dir / "metrics.jsonl"
        rollout = stack.endpoints.rollouts_http[0]
        busy_start = window_start = None
        deadline = time.monotonic() + timeout_s
        while stack.trainer_exit_code() is None:
            supervisor.check_alive(exited_ok=["trainer"])
            if busy_start is None and metrics_path.exists() and metrics_path.stat().st_size:
                busy_start, window_start = _busy_seconds(rollout), time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"η = {eta}: the trainer did not finish {steps} steps in {timeout_s:.0f}s")
            time.sleep(0.2)
        if stack.trainer_exit_code() != 0:
            raise RuntimeError(f"η = {eta}: trainer exited with {stack.trainer_exit_code()}; see {stack.run_dir}/logs")
        busy = _busy_seconds(rollout) - (busy_start or 0.0)
        window = time.monotonic() - (window_start or time.monotonic())
        lost = _lost_groups(stack.endpoints.queue_grpc)
    rows = [r for r in read_metrics(metrics_path) if "trainer/global_steps" in r]
    first, last = rows[0], rows[-1]
    elapsed = last["time"] - first["time"]
    return ModeResult(
        samples_per_s=(last["trainer/processed_samples"] - first["trainer/processed_samples"]) / elapsed,
        trainer_idle_ratio=statistics.fmean(r["trainer/idle_ratio"] for r in rows[1:]),
        rollout_idle_ratio=max(0.0, 1.0 - busy / window) if window > 0 else 0.0,
        reward_at_end=statistics.fmean(r["critic/score/mean"] for r in rows[-5:]),
        staleness_violations=sum(1 for r in rows if r["staleness/max_sample_age"] > eta),
        lost_groups=lost,
        steps=len(rows),
    )


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line only.")] = False,
    steps: Annotated[int, typer.Option(help="Trainer steps per mode.")] = 100,
    async_staleness: Annotated[int, typer.Option(help="η of the asynchronous run.")] = 2,
    timeout_s: Annotated[float, typer.Option(help="Longest run per mode, seconds.")] = 600,
) -> None:
    """Sync (η = 0) versus async (η = 2) on a long-tail workload: samples/s, idle ratios, reward, losses."""
    from relayrl.models.tiny import init_tiny

    with tempfile.TemporaryDirectory(prefix="relayrl-bench-e2e-") as tmp:
        work = Path(tmp)
        model_dir = init_tiny(work / "model")
        dataset = long_tail_dataset(work / "long_tail.jsonl", rows=2048, seed=0)
        sync = run_mode(work, model_dir, dataset, 0, steps, timeout_s)
        asynchronous = run_mode(work, model_dir, dataset, async_staleness, steps, timeout_s)
    result: dict[str, Any] = {
        "benchmark": "e2e",
        "steps": steps,
        "async_max_staleness": async_staleness,
        "sync_samples_per_s": round(sync.samples_per_s, 2),
        "async_samples_per_s": round(asynchronous.samples_per_s, 2),
        "speedup": round(asynchronous.samples_per_s / sync.samples_per_s, 3),
        "trainer_idle_ratio": {
            "sync": round(sync.trainer_idle_ratio, 3),
            "async": round(asynchronous.trainer_idle_ratio, 3),
        },
        "rollout_idle_ratio": {
            "sync": round(sync.rollout_idle_ratio, 3),
            "async": round(asynchronous.rollout_idle_ratio, 3),
        },
        "reward_at_end": {"sync": round(sync.reward_at_end, 3), "async": round(asynchronous.reward_at_end, 3)},
        "staleness_violations": sync.staleness_violations + asynchronous.staleness_violations,
        "lost_groups": sync.lost_groups + asynchronous.lost_groups,
    }
    typer.echo(json.dumps(result) if json_output else json.dumps(result, indent=1))
