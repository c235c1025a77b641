"""``relayrl bench openai``: tokens/s of agent episodes through the OpenAI endpoint vs. the native path.

The same episodes run both ways against one built-in engine process (a ``preset`` model, on
``device``): ``episodes`` conversations of ``turns`` model turns each (a question, then a user
message after every answer), ``concurrency`` episodes at a time. Each turn's token budget is drawn
from ``seed``, uniform in ``[max(1, max_tokens // 4), max_tokens]``, the same for both paths: a
random model rarely samples EOS, so with one budget for all every turn of a wave ends in the same
step, and the figure measures that lockstep rather than the endpoint.

- ``native``: what the rollout's agent loop does, in the rollout's process: the turns sent
  straight to the engine's ``/generate`` as token ids, each observation rendered through the chat
  template;
- ``openai``: agent code in a process of its own, as agent code runs, calling the ``openai``
  client's ``chat.completions.create`` against a real rollout service (its HTTP server, the
  conversation recording, a real queue service over a private redis-server), each episode
  finished with a reward, which pushes it to the queue. In the rollout's process the client's
  own work (it builds and parses every request and answer) would sit in the event loop the
  endpoint serves from, and its cost would be counted as the endpoint's.

Each path's clients are built once, before the timed rounds, as an agent keeps its own.

The two alternate for ``rounds`` rounds and each figure is the median, so load from other
processes hits both alike. ``ratio = openai_tokens_per_s / native_tokens_per_s``; the issue's
target is a cost of at most 10 %, a ratio of 0.9 or more.

Each path's ``*_prefill_passes`` and ``*_decode_passes`` are the engine's forward passes over its
timed rounds (its ``/get_model_info`` counters). They show where the path's engine time went: the
same tokens taken in more passes, as when a wave of turns comes back to the engine one by one
instead of together and each turn is prefilled in a pass of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import httpx
    import openai

    from services.engine.client import EngineClient

QUESTION = "count from 1 to 9"
FOLLOW_UP = "go on"
# The longest one round of the agent process may take.
AGENT_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class OpenAIBenchResult:
    preset: str
    openai_tokens_per_s: float
    native_tokens_per_s: float
    ratio: float
    episodes: int
    turns: int
    max_tokens: int
    min_tokens: int
    seed: int
    # Where the engine says it computes (its /get_model_info), e.g. cuda:0.
    engine_device: str
    concurrency: int
    rounds: int
    openai_tokens: int
    native_tokens: int
    native_prefill_passes: int
    native_decode_passes: int
    openai_prefill_passes: int
    openai_decode_passes: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Passes:
    """The engine's forward passes so far (or over a span), prefill and decode."""

    prefill: int = 0
    decode: int = 0

    def __add__(self, other: _Passes) -> _Passes:
        return _Passes(self.prefill + other.prefill, self.decode + other.decode)

    def __sub__(self, other: _Passes) -> _Passes:
        return _Passes(self.prefill - other.prefill, self.decode - other.decode)


def turn_budgets(episodes: int, turns: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Each episode's per-turn token budgets, uniform in ``[max(1, max_tokens // 4), max_tokens]`` from ``seed``."""
    rng = random.Random(seed)
    return [[rng.randint(min_budget(max_tokens), max_tokens) for _ in range(turns)] for _ in range(episodes)]


def min_budget(max_tokens: int) -> int:
    return max(1, max_tokens // 4)


async def _passes(engine: EngineClient) -> _Passes:
    info = await engine.model_info()
    return _Passes(int(info["num_prefill_forward_passes"]), int(info["num_decode_forward_passes"]))


async def _native(client: EngineClient, tokenizer: Any, budgets: list[list[int]], concurrency: int) -> int:
    from services.engine.client import SamplingParams
    from services.rollout.generation import SampleResult, continue_sample
    from services.rollout.openai_chat import ChatRenderer
    from services.rollout.openai_models import Message

    renderer = ChatRenderer(tokenizer)
    gate = asyncio.Semaphore(concurrency)
    follow_up = [Message(role="user", content=FOLLOW_UP)]

    async def episode(client: EngineClient, index: int, budget: list[int]) -> int:
        async with gate:
            ids = renderer.prompt_ids([Message(role="user", content=f"{QUESTION} ({index})")], None)
            generated = 0
            for turn, max_tokens in enumerate(budget):
                params = SamplingParams(max_new_tokens=max_tokens)
                result = await continue_sample(
                    client, ids, params, "abort_resume", 0, f"native-{index}-{turn}", SampleResult()
                )
                generated += len(result.output_ids)
                ids = ids + result.output_ids
                if turn + 1 < len(budget):
                    ids = ids + renderer.observation_ids(follow_up, result.output_ids)
            return generated

    return sum(await asyncio.gather(*(episode(client, i, budget) for i, budget in enumerate(budgets))))


async def _openai(
    clients: tuple[openai.AsyncOpenAI, httpx.AsyncClient], budgets: list[list[int]], concurrency: int
) -> int:
    from services.rollout.openai_api import CONVERSATION_HEADER

    gate = asyncio.Semaphore(concurrency)
    run = uuid.uuid4().hex[:8]

    async def episode(client: openai.AsyncOpenAI, http: httpx.AsyncClient, index: int, budget: list[int]) -> int:
        async with gate:
            conversation = f"bench-{run}-{index}"
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"{QUESTION} ({index})"}]
            generated = 0
            for turn, max_tokens in enumerate(budget):
                completion = await client.chat.completions.create(
                    model="policy",
                    messages=messages,
                    max_tokens=max_tokens,
                    extra_headers={CONVERSATION_HEADER: conversation},
                )
                generated += completion.usage.completion_tokens
                messages.append(completion.choices[0].message.model_dump(exclude_none=True))
                if turn + 1 < len(budget):
                    messages.append({"role": "user", "content": FOLLOW_UP})
            finished = await http.post(f"/v1/conversations/{conversation}/finish", json={"reward": 0.0})
            finished.raise_for_status()
            return generated

    client, http = clients
    return sum(await asyncio.gather(*(episode(client, http, i, budget) for i, budget in enumerate(budgets))))


def _agent_process(link: Connection, base_url: str, concurrency: int) -> None:
    """The openai path's agent code, in its own process: runs the episodes of each list of per-turn
    budgets it receives and answers the tokens generated (or ``("error", message)``); None ends it."""
    import httpx
    import openai

    from relayrl import http_client

    async def serve() -> None:
        async with (
            openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client,
            http_client.async_client(base_url=base_url, limits=httpx.Limits(max_connections=concurrency * 2)) as http,
        ):
            while (job := link.recv()) is not None:
                try:
                    link.send(await _openai((client, http), job, concurrency))
                except Exception as exc:  # reported to the bench, which fails with it
                    link.send(("error", f"{type(exc).__name__}: {exc}"))

    asyncio.run(serve())


class _Agent:
    """The bench's end of the agent process."""

    def __init__(self, base_url: str, concurrency: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._link, child = context.Pipe()
        self._process = context.Process(target=_agent_process, args=(child, base_url, concurrency), daemon=True)
        self._process.start()
        child.close()

    async def run(self, budgets: list[list[int]]) -> int:
        def exchange() -> Any:
            self._link.send(budgets)
            deadline = time.monotonic() + AGENT_TIMEOUT_S
            while not self._link.poll(1.0):
                if not self._process.is_alive():
                    raise RuntimeError(f"the agent process exited with code {self._process.exitcode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the agent process ran {len(budgets)} episodes for over {AGENT_TIMEOUT_S:.0f}s")
            return self._link.recv()

        answer = await asyncio.to_thread(exchange)
        if isinstance(answer, tuple):
            raise RuntimeError(f"the agent process failed: {answer[1]}")
        return int(answer)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._link.send(None)
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


async def _measure(
    preset: str,
    engine_url: str,
    model_dir: Path,
    redis_url: str,
    budgets: list[list[int]],
    max_tokens: int,
    concurrency: int,
    rounds: int,
    seed: int,
) -> OpenAIBenchResult:
    from relayrl.models.loading import load_tokenizer
    from services.engine.client import EngineClient
    from services.queue.config import QueueSettings
    from services.queue.server import start_queue_server
    from services.rollout.config import RolloutSettings
    from services.rollout.server import start_rollout

    tokenizer = load_tokenizer(model_dir)
    native_rates: list[float] = []
    openai_rates: list[float] = []
    native_tokens = openai_tokens = 0
    native_passes, openai_passes = _Passes(), _Passes()
    queue = await start_queue_server(QueueSettings(redis_url=redis_url, run_id=f"bench-{uuid.uuid4().hex[:8]}"))
    rollout = await start_rollout(
        RolloutSettings(engine_url=engine_url, queue_address=queue.grpc_address, engine_check_interval_s=0.1)
    )
    try:
        while not rollout.replica.state.ready():
            await rollout.replica.state.became_leasable(0.1)
        base_url = f"http://127.0.0.1:{rollout.servers.http.port}"
        agent = _Agent(base_url, concurrency)
        try:
            async with EngineClient(engine_url) as engine:
                engine_device = str((await engine.model_info())["device"])
                warm_up = [[4]] * concurrency
                await _native(engine, tokenizer, warm_up, concurrency)
                await agent.run(warm_up)
                for _ in range(rounds):
                    before = await _passes(engine)
                    started = time.perf_counter()
                    tokens = await _native(engine, tokenizer, budgets, concurrency)
                    native_rates.append(tokens / (time.perf_counter() - started))
                    native_tokens += tokens
                    between = await _passes(engine)
                    native_passes += between - before
                    started = time.perf_counter()
                    tokens = await agent.run(budgets)
                    openai_rates.append(tokens / (time.perf_counter() - started))
                    openai_tokens += tokens
                    openai_passes += await _passes(engine) - between
        finally:
            agent.close()
    finally:
        await rollout.stop()
        await queue.stop()
    native_rate, openai_rate = statistics.median(native_rates), statistics.median(openai_rates)
    return OpenAIBenchResult(
        preset=preset,
        openai_tokens_per_s=round(openai_rate, 1),
        native_tokens_per_s=round(native_rate, 1),
        ratio=round(openai_rate / native_rate, 3),
        episodes=len(budgets),
        turns=len(budgets[0]) if budgets else 0,
        max_tokens=max_tokens,
        min_tokens=min_budget(max_tokens),
        seed=seed,
        engine_device=engine_device,
        concurrency=concurrency,
        rounds=rounds,
        openai_tokens=openai_tokens,
        native_tokens=native_tokens,
        native_prefill_passes=native_passes.prefill,
        native_decode_passes=native_passes.decode,
        openai_prefill_passes=openai_passes.prefill,
        openai_decode_passes=openai_passes.decode,
    )


def run_bench(
    episodes: int,
    turns: int,
    max_tokens: int,
    concurrency: int,
    rounds: int,
    preset: str = "tiny",
    device: str = "cpu",
    seed: int = 0,
) -> OpenAIBenchResult:
    from services.rollout.bench import tiny_engine_and_redis

    budgets = turn_budgets(episodes, turns, max_tokens, seed)
    with tiny_engine_and_redis("relayrl-bench-openai-", preset, device) as (url, model_dir, redis_url):
        return asyncio.run(_measure(preset, url, model_dir, redis_url, budgets, max_tokens, concurrency, rounds, seed))


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    episodes: Annotated[int, typer.Option(help="Episodes (conversations) run through each path per round.")] = 16,
    turns: Annotated[int, typer.Option(help="Model turns per episode.")] = 3,
    max_tokens: Annotated[
        int, typer.Option(help="Largest token budget of a model turn; each turn's is drawn from [max/4, max].")
    ] = 32,
    concurrency: Annotated[int, typer.Option(help="Episodes in flight at once.")] = 8,
    rounds: Annotated[int, typer.Option(help="Alternating native/openai rounds; medians are reported.")] = 3,
    preset: Annotated[
        str,
        typer.Option(help="Model preset the engine serves: tiny (per-request costs dominate), small; base on cuda."),
    ] = "tiny",
    device: Annotated[str, typer.Option(help="Where the engine runs: cpu or cuda (RELAYRL_ENGINE_DEVICE).")] = "cpu",
    seed: Annotated[int, typer.Option(help="Seed of the turns' token budgets.")] = 0,
) -> None:
    """Tokens/s of the same agent episodes through /v1/chat/completions vs. the native engine path, same run."""
    import json

    from relayrl.devices import check_bench_device

    check_bench_device(device)
    presets = ("tiny", "small", "base") if device == "cuda" else ("tiny", "small")
    if preset not in presets:
        raise typer.BadParameter(f"{preset!r}: choose {' or '.join(presets)} on {device}", param_hint="--preset")
    result = run_bench(episodes, turns, max_tokens, concurrency, rounds, preset, device, seed)
    typer.echo(json.dumps(result.to_dict()))
