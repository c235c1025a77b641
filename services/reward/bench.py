"""``relayrl bench reward``: what dynamic batching buys, measured against batch size 1.

Two reward processes serve the same model, one with ``max_batch_size=1`` and one batching, each
on one torch thread; the same load (``concurrency`` requests in flight, ``requests`` in all, each
of ``items_per_request`` sequences of ``tokens/2``..``tokens`` tokens) goes to each in
alternating rounds, and the figures are the medians. The ratio of scored samples/s is the
speed-up. The default load is the rollout's: one request per prompt group of 8 samples.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from relayrl import http_client
from relayrl.net import free_port
from relayrl.subprocesses import stop_process
from services.reward.client import RewardClient
from services.reward.launch import launch_reward, wait_reward_ready

READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class BenchSpec:
    requests: int = 64
    items_per_request: int = 8
    concurrency: int = 8
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    tokens: int = 24
    rounds: int = 3
    model: str = ""


def _sequences(count: int, tokens: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(max(tokens // 2, 1), tokens))] for _ in range(count)]


async def _load(url: str, requests: list[list[list[int]]], concurrency: int) -> float:
    """Scored samples per second with ``concurrency`` requests in flight."""
    todo = iter(requests)

    async def worker(client: RewardClient) -> None:
        for sequences in todo:
            await client.score([{"input_ids": ids} for ids in sequences])

    async with RewardClient(url, timeout_s=120.0) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        return sum(len(r) for r in requests) / (time.perf_counter() - started)


def _mean_batch(url: str) -> float:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(http_client.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            values[sample.name] = sample.value
    passes = values.get("relayrl_reward_forward_passes_total", 0.0)
    return values.get("relayrl_reward_items_scored_total", 0.0) / passes if passes else 0.0


def run_bench(spec: BenchSpec) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-reward-") as tmp:
        model = Path(spec.model) if spec.model else _tiny_rm(Path(tmp) / "tiny-rm")
        servers = {
            "batch1": {"RELAYRL_REWARD_MAX_BATCH_SIZE": "1", "RELAYRL_REWARD_MAX_WAIT_MS": "0"},
            "batched": {
                "RELAYRL_REWARD_MAX_BATCH_SIZE": str(spec.max_batch_size),
                "RELAYRL_REWARD_MAX_WAIT_MS": str(spec.max_wait_ms),
            },
        }
        processes, urls = {}, {}
        try:
            for name, env in servers.items():
                port = free_port()
                env |= {"RELAYRL_REWARD_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1"}
                processes[name] = launch_reward(model, port, env)
                urls[name] = f"http://127.0.0.1:{port}"
            for name, process in processes.items():
                wait_reward_ready(process, urls[name], READY_TIMEOUT_S)
            sequences = _sequences(spec.requests * spec.items_per_request, spec.tokens, _vocab_size(model))
            requests = [sequences[i :: spec.requests] for i in range(spec.requests)]
            rates: dict[str, list[float]] = {name: [] for name in servers}
            for _ in range(spec.rounds):
                for name in servers:
                    rates[name].append(asyncio.run(_load(urls[name], requests, spec.concurrency)))
            mean_batch = _mean_batch(urls["batched"])
        finally:
            for process in processes.values():
                stop_process(process)
    batch1, batched = statistics.median(rates["batch1"]), statistics.median(rates["batched"])
    return {
        "bench": "reward",
        "requests": spec.requests,
        "items_per_request": spec.items_per_request,
        "concurrency": spec.concurrency,
        "tokens": spec.tokens,
        "max_batch_size": spec.max_batch_size,
        "max_wait_ms": spec.max_wait_ms,
        "rounds": spec.rounds,
        "batch1_samples_per_s": round(batch1, 1),
        "batched_samples_per_s": round(batched, 1),
        "batched_mean_batch_size": round(mean_batch, 2),
        "speedup": round(batched / batch1, 2),
    }


def _tiny_rm(directory: Path) -> Path:
    from relayrl.models.tiny import init_tiny, preset_spec

    return init_tiny(directory, preset_spec("tiny-rm"))


def _vocab_size(model: Path) -> int:
    import json

    return int(json.loads((model / "config.json").read_text())["vocab_size"])
