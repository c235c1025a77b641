"""``relayrl bench rollout``: generation throughput through the rollout service vs. straight to the engine.

Both paths run in one process against the same built-in engine process (tiny model, on ``device``:
``--device cuda`` measures the issue's target of the rollout over the CUDA engine), with
the same prompts, sample count, token budget and concurrency: ``direct`` (the requests sent
straight to the engine's ``/generate``) and ``service`` (prompts released to a real queue
service backed by a private redis-server, leased, generated, scored and pushed by a replica,
pulled back). The two alternate for ``rounds`` rounds and each figure is the median over the
rounds, so load from other processes on a shared machine hits both alike.
``overhead_ratio = direct_tokens_per_s / tokens_per_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from relayrl.net import free_port
from relayrl.subprocesses import stop_process


@dataclass(frozen=True, slots=True)
class BenchResult:
    tokens_per_s: float
    direct_tokens_per_s: float
    overhead_ratio: float
    prompts: int
    n_samples: int
    max_new_tokens: int
    concurrency: int
    rounds: int
    service_tokens: int
    direct_tokens: int
    # Where the engine says it computes (its /get_model_info), e.g. cuda:0.
    engine_device: str

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


@contextlib.contextmanager
def tiny_engine_and_redis(prefix: str, preset: str = "tiny", device: str = "cpu") -> Iterator[tuple[str, Path, str]]:
    """What one bench run against the built-in engine needs: a model of ``preset`` served by an
    engine process on ``device`` (bf16 on cuda, as the engine serves it), and a private
    redis-server; yields (engine URL, model directory, redis URL)."""
    from relayrl.models.tiny import init_tiny, preset_spec
    from relayrl.redis_process import RedisProcess

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        dtype = "bfloat16" if device == "cuda" else "float32"
        model_dir = init_tiny(Path(tmp) / "model", preset_spec(preset, dtype=dtype))
        redis = RedisProcess(data_dir=Path(tmp) / "redis").start()
        port = free_port()
        engine = start_engine(model_dir, port, device)
        try:
            yield f"http://127.0.0.1:{port}", model_dir, redis.url
        finally:
            stop_process(engine, 15)
            redis.stop()


def start_engine(model_dir: Path, port: int, device: str = "cpu") -> subprocess.Popen[bytes]:
    from services.engine.launch import launch_engine, wait_engine_healthy

    proc = launch_engine(model_dir, port, settings={"RELAYRL_ENGINE_DEVICE": device})
    try:
        # On cuda the engine captures its decode graphs before it answers.
        wait_engine_healthy(proc, f"http://127.0.0.1:{port}", timeout_s=120 if device == "cpu" else 600)
    except TimeoutError:
        proc.kill()
        raise
    return proc


async def _direct(engine_url: str, prompts: list[list[int]], n: int, max_new_tokens: int, concurrency: int) -> int:
    from services.engine.client import EngineClient, SamplingParams

    # The requests the rollout service sends: one /generate with n per prompt, `concurrency`
    # prompts in flight.
    gate = asyncio.Semaphore(concurrency)
    params = SamplingParams(max_new_tokens=max_new_tokens, n=n)

    async def one(client: EngineClient, prompt: list[int]) -> int:
        async with gate:
            outputs = await client.generate(prompt, params)
            return sum(len(out.output_ids) for out in outputs)

    async with EngineClient(engine_url) as client:
        counts = await asyncio.gather(*(one(client, p) for p in prompts))
    return sum(counts)


async def _through_service(
    engine_url: str, redis_url: str, prompts: list[list[int]], n: int, max_new_tokens: int, inflight: int
) -> tuple[int, float]:
    """Tokens generated and seconds from releasing the prompts to pulling the last group."""
    from relayrl.schema import PromptSpec
    from services.engine.client import EngineClient
    from services.queue.client import QueueClient
    from services.queue.config import QueueSettings
    from services.queue.server import start_queue_server
    from services.rollout.config import RolloutSettings
    from services.rollout.replica import Replica
    from services.rollout.rewards import RewardRunner, resolve_reward

    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    queue = await start_queue_server(QueueSettings(redis_url=redis_url, run_id=run_id, poll_interval_s=0.005))
    settings = RolloutSettings(
        engine_url=engine_url,
        queue_address=queue.grpc_address,
        max_new_tokens=max_new_tokens,
        max_inflight_prompts=inflight,
        lease_block_timeout_s=0.05,
        engine_check_interval_s=0.2,
    )
    rewards = RewardRunner(resolve_reward("builtin"), settings.reward_timeout_s)
    engine = EngineClient(engine_url)
    async with QueueClient(queue.grpc_address) as client:
        replica = Replica(settings, engine, client, rewards)
        probe = asyncio.create_task(replica.engine_watch.run())
        while not replica.state.ready():
            await asyncio.sleep(0.05)
        specs = [
            PromptSpec(prompt_id=f"bench/{i}", prompt_token_ids=p, n_samples=n, data_source="relayrl/copy")
            for i, p in enumerate(prompts)
        ]
        # Timed like the direct path: from the first request to the last answer, servers already up.
        started = time.perf_counter()
        await client.release(specs)
        loop = asyncio.create_task(replica.loop.run())
        tokens, received = 0, 0
        while received < len(specs):
            delivered = await client.pull("bench", 0, 1_000_000, len(specs) - received, block_timeout_s=0.2)
            received += len(delivered)
            tokens += sum(len(s.response_token_ids) for d in delivered for s in d.group.samples)
        seconds = time.perf_counter() - started
        for task in (loop, probe):
            task.cancel()
        await asyncio.gather(loop, probe, return_exceptions=True)
    await engine.aclose()
    rewards.close()
    await queue.stop()
    return tokens, seconds


async def _measure(
    engine_url: str, redis_url: str, prompts: int, n: int, max_new_tokens: int, inflight: int, rounds: int
) -> BenchResult:
    from services.engine.client import EngineClient

    token_lists = [[5 + (i % 50), 6, 7, 8, 9] for i in range(prompts)]
    await _direct(engine_url, token_lists[:inflight], n, 4, inflight)  # warm-up
    direct_rates, service_rates, direct_tokens, service_tokens = [], [], 0, 0
    for _ in range(rounds):
        started = time.perf_counter()
        tokens = await _direct(engine_url, token_lists, n, max_new_tokens, inflight)
        direct_rates.append(tokens / (time.perf_counter() - started))
        direct_tokens += tokens
        tokens, seconds = await _through_service(engine_url, redis_url, token_lists, n, max_new_tokens, inflight)
        service_rates.append(tokens / seconds)
        service_tokens += tokens
    direct_rate, service_rate = statistics.median(direct_rates), statistics.median(service_rates)
    async with EngineClient(engine_url) as engine:
        info = await engine.model_info()
    return BenchResult(
        tokens_per_s=round(service_rate, 1),
        direct_tokens_per_s=round(direct_rate, 1),
        overhead_ratio=round(direct_rate / service_rate, 3),
        prompts=prompts,
        n_samples=n,
        max_new_tokens=max_new_tokens,
        concurrency=inflight * n,
        rounds=rounds,
        service_tokens=service_tokens,
        direct_tokens=direct_tokens,
        engine_device=str(info["device"]),
    )


def run_bench(
    prompts: int, n: int, max_new_tokens: int, inflight: int, rounds: int, device: str = "cpu"
) -> BenchResult:
    with tiny_engine_and_redis("relayrl-bench-rollout-", device=device) as (url, _, redis_url):
        return asyncio.run(_measure(url, redis_url, prompts, n, max_new_tokens, inflight, rounds))
