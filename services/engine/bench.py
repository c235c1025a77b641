"""``relayrl bench engine``: the built-in engine on nano-vllm's workload, against Hugging Face's own
generation loops on the same model and requests, in one run.

The workload is nano-vllm's ``bench.py``: ``requests`` prompts of random token ids, each prompt's
length and its output length uniform in ``[min_len, max_len]`` (100-1024 by default), a fixed
seed, EOS ignored. The paths run it one after the other:

- ``engine``: every request sent at once to an engine process (``relayrl engine serve``) through
  its HTTP API, streamed (``/generate`` with ``stream: true``, SGLang's server-sent events),
  greedy. Output tokens/s over the wall time of the whole set; time to first token (from sending
  a request to its first chunk with a token) and inter-token latency (each later chunk's gap
  over the tokens it brings, counted once per token, as SGLang's ``bench_serving`` counts it) at
  p50 and p99, as the client sees them; the KV blocks the run held at most; the engine's peak GPU
  memory (None on CPU). The engine streams with SGLang's ``incremental_streaming_output`` (each
  chunk only its new tokens, so a chunk costs the same at the first token and the thousandth) and
  ``stream_interval`` chunks. With several ``attention`` backends, one engine process runs the
  workload per backend (``engines``), and ``engine`` is the fastest; a backend whose engine does not
  start or fails the workload is reported under ``failed`` with its error, the others still run.
- ``hf_generate`` (the floor): ``model.generate`` in static batches of ``hf_batch`` left-padded
  prompts, SDPA attention;
- ``generate_batch`` (the other floor): transformers' continuous batching (its own paged cache,
  sized to hold every request at once, over SDPA: 5.17 switches ``sdpa`` to ``paged|sdpa`` itself,
  5.23 takes ``sdpa``), skipped with the reason where the installed transformers has none.

Both floors take one output length for all (``generate_batch`` has no per-request length): the
workload's mean, so their total output equals the engine's within rounding. Then, on each engine,
the weight update pause of each route, measured by the engine
(``relayrl_engine_generation_paused_seconds``) while requests are running:
``update_weights_from_disk`` from a safetensors file in ``/dev/shm`` (paramsync's host buffers),
and ``update_weights_from_tensor`` with one flattened bucket per handle (CUDA IPC on a GPU; shared
memory on CPU).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from relayrl.devices import bench_gpu_name
from services.engine.launch import ENGINE_MODULE

SHM = Path("/dev/shm")

# The engine settings both engine benches (engine, engine-host) take from their command line.
StreamInterval = Annotated[
    int, typer.Option(min=1, help="The engine's stream_interval: a streamed chunk every N tokens (SGLang: 1).")
]
OverlapSchedule = Annotated[
    bool,
    typer.Option(
        help="Queue each step's next decode pass before reading its tokens back (the engine's default);"
        " --no-overlap-schedule sets the engine's disable_overlap_schedule."
    ),
]


def streaming_settings(stream_interval: int, overlap_schedule: bool) -> dict[str, str]:
    """The engine's environment for :data:`StreamInterval` and :data:`OverlapSchedule`."""
    return {
        "RELAYRL_ENGINE_STREAM_INTERVAL": str(stream_interval),
        "RELAYRL_ENGINE_DISABLE_OVERLAP_SCHEDULE": str(not overlap_schedule).lower(),
    }


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @classmethod
    def nano_vllm(cls, requests: int, min_len: int, max_len: int, vocab: int, seed: int = 0) -> Workload:
        """nano-vllm's random workload: lengths uniform in ``[min_len, max_len]``, ids below 10000 (and the vocab)."""
        rng = random.Random(seed)
        top = min(10_000, vocab - 1)
        prompts = [[rng.randint(0, top) for _ in range(rng.randint(min_len, max_len))] for _ in range(requests)]
        return cls(prompts, [rng.randint(min_len, max_len) for _ in range(requests)])

    @property
    def mean_output(self) -> int:
        return round(statistics.fmean(self.output_lens))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


@dataclass(slots=True)
class StreamTiming:
    """What the client saw of one streamed request: its tokens, the time to its first one, and
    one inter-token gap per later token."""

    tokens: int = 0
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)


def read_stream(lines: Sequence[tuple[float, bytes]], sent_at: float, until: float | None = None) -> StreamTiming:
    """Times one streamed ``/generate`` from its event lines, each with the time it arrived (those
    after ``until`` left out).

    Chunks are incremental (``incremental_streaming_output``): each brings its new ``output_ids``.
    A chunk of ``k`` tokens that came ``gap`` seconds after the previous one counts ``k`` gaps of
    ``gap / k`` (SGLang's ``bench_serving``).
    """
    timing = StreamTiming()
    last = sent_at
    for arrived, line in lines:
        if until is not None and arrived > until:
            break
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(f"the engine's stream failed: {chunk['error']}")
        new = len(chunk["output_ids"])
        if new == 0:
            continue
        if timing.tokens == 0:
            timing.ttft_s = arrived - sent_at
        else:
            timing.itl_s.extend([(arrived - last) / new] * new)
        timing.tokens += new
        last = arrived
    return timing


def run_bench(
    preset: str,
    device: str,
    requests: int,
    min_len: int,
    max_len: int,
    hf_batch: int,
    floors: bool,
    settings: dict[str, str],
    floor_requests: int = 0,
    attention: Sequence[str] = ("auto",),
    timeout_s: float | None = None,
    profile_steps: int = 0,
) -> dict[str, Any]:
    """With ``timeout_s``, a workload still running then (or ``MIN_WINDOW_S`` after it began, if
    later) is aborted and its rate taken over the tokens streamed so far (``cut_short``), and no
    later engine or floor starts past it: a budgeted run still reports what it measured. With
    ``profile_steps``, each engine then profiles that many decode steps (:func:`_profile_decode`),
    apart from the measured workload, whose figures the profiler would slow."""
    from relayrl.models.tiny import init_tiny, preset_spec

    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    dtype = "bfloat16" if device == "cuda" else "float32"
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-engine-") as tmp:
        model_dir = init_tiny(Path(tmp) / "model", preset_spec(preset, dtype=dtype))
        vocab = preset_spec(preset).vocab_size
        work = Workload.nano_vllm(requests, min_len, max_len, vocab)
        result: dict[str, Any] = {
            "bench": "engine",
            "device": device,
            "gpu": bench_gpu_name(device),
            "preset": preset,
            "requests": requests,
            "min_len": min_len,
            "max_len": max_len,
            "output_tokens": sum(work.output_lens),
        }
        engines: dict[str, dict[str, Any]] = {}
        for backend in attention:
            if engines and _past(deadline):
                result.setdefault("skipped", {})[backend] = "timeout"
                continue
            backend_settings = {**settings, "RELAYRL_ENGINE_ATTENTION_BACKEND": backend}
            try:
                with engine_process(model_dir, device, backend_settings, Path(tmp) / f"engine-{backend}.log") as url:
                    figures = asyncio.run(stream_workload(url, work, deadline))
                    _progress(f"{figures['attention_backend']}: {figures['output_tokens_per_s']} output tokens/s")
                    figures["weight_update_pause_s"] = asyncio.run(_update_pauses(url, model_dir, device))
                    _progress(f"{figures['attention_backend']}: update pauses {figures['weight_update_pause_s']}")
                    if profile_steps and not _past(deadline):
                        directory = Path(tmp) / f"profile-{backend}"
                        try:
                            figures["profile"] = asyncio.run(_profile_decode(url, work, profile_steps, directory))
                        except Exception as exc:  # the profile explains the figures; it never costs them
                            figures["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
                        _progress(f"{figures['attention_backend']}: profile {figures['profile'].get('by_kind')}")
            except Exception as exc:  # one backend that cannot start or serve costs the others nothing
                result.setdefault("failed", {})[backend] = f"{type(exc).__name__}: {exc}"[-FAILURE_CHARS:]
                _progress(f"{backend}: failed: {result['failed'][backend]}")
                continue
            engines[figures["attention_backend"]] = figures
        if not engines:
            raise RuntimeError(f"no engine ran the workload: {result.get('failed') or result.get('skipped')}")
        best = max(engines.values(), key=lambda figures: figures["output_tokens_per_s"])
        result["engine"] = best
        result["engines"] = engines
        result["weight_update_pause_s"] = best["weight_update_pause_s"]
        if floors and _past(deadline):
            result.setdefault("skipped", {})["floors"] = "timeout"
        elif floors:
            # The floors may run the first floor_requests requests only: their rate, not their total, is compared.
            part = Workload(work.prompts[: floor_requests or None], work.output_lens[: floor_requests or None])
            result["floor_requests"] = len(part.prompts)
            result["hf_generate"] = _hf_generate(model_dir, device, dtype, part, hf_batch)
            _progress(f"hf_generate: {result['hf_generate']}")
            result["generate_batch"] = _generate_batch(model_dir, device, dtype, part)
            _progress(f"generate_batch: {result['generate_batch']}")
            for floor in ("hf_generate", "generate_batch"):
                rate = result[floor].get("output_tokens_per_s")
                for figures in engines.values():
                    figures[f"ratio_vs_{floor}"] = round(figures["output_tokens_per_s"] / rate, 2) if rate else None
                result[f"ratio_vs_{floor}"] = best[f"ratio_vs_{floor}"]
        return result


# Of a failed backend's error (an engine's exit carries the end of its log), what the JSON keeps.
FAILURE_CHARS = 1500
# A workload cut by --timeout-s still runs this long, whatever is left: a rate needs a window.
MIN_WINDOW_S = 10.0


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


@contextmanager
def engine_process(
    model_dir: Path, device: str, settings: dict[str, str], log: Path, module: str = ENGINE_MODULE
) -> Iterator[str]:
    """An engine process on ``model_dir`` (``module``'s ``serve`` command) for one bench run; its URL."""
    from relayrl.net import free_port
    from relayrl.subprocesses import stop_process
    from services.engine.launch import launch_engine, wait_engine_healthy

    port = free_port()
    env = {
        "RELAYRL_ENGINE_DEVICE": device,
        "RELAYRL_ENGINE_MAX_RUNNING_REQUESTS": "256",
        "RELAYRL_ENGINE_INCREMENTAL_STREAMING_OUTPUT": "true",
        **settings,
    }
    if device == "cuda":
        env["RELAYRL_ENGINE_MAX_PREFILL_TOKENS"] = env.get("RELAYRL_ENGINE_MAX_PREFILL_TOKENS", "16384")
    # The engine's log goes to a file, not a pipe: a pipe nobody reads while the workload runs would
    # block the engine once its buffer fills (a compiler's warnings are enough).
    with log.open("wb") as stderr:
        process = launch_engine(model_dir, port, stderr=stderr, settings=env, module=module)
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    try:
        # CUDA graphs are captured at start: give it minutes.
        wait_engine_healthy(process, url, timeout_s=600)
        backend = settings.get("RELAYRL_ENGINE_ATTENTION_BACKEND", "auto")
        _progress(f"engine ({backend}) up in {time.perf_counter() - started:.1f} s")
        yield url
    except Exception:
        if process.poll() is not None:
            raise RuntimeError(f"engine exited: {_tail(log, 2000)}") from None
        _progress(f"the engine's log (last lines):\n{_tail(log)}")
        raise
    except KeyboardInterrupt:  # a budget or a hang: the engine's own account of where it was
        _progress(f"interrupted; the engine's log (last lines):\n{_tail(log)}")
        raise
    finally:
        stop_process(process)


def _tail(log: Path, size: int = 4000) -> str:
    data = log.read_bytes() if log.exists() else b""
    return data[-size:].decode(errors="replace")


def _progress(line: str) -> None:
    """One line on stderr per phase: a run cut short still says how far it got; stdout keeps the JSON."""
    print(f"bench engine: {line}", file=sys.stderr, flush=True)


async def stream_workload(
    url: str, work: Workload, deadline: float | None = None, min_window_s: float = MIN_WINDOW_S
) -> dict[str, Any]:
    import aiohttp

    # aiohttp reads hundreds of concurrent streams with less of the bench's own time per chunk than httpx.
    connector = aiohttp.TCPConnector(limit=len(work.prompts) + 8)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:

        async def one(prompt: list[int], output_len: int) -> tuple[list[tuple[float, bytes]], float]:
            params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
            body = {"input_ids": prompt, "sampling_params": params, "stream": True}
            lines: list[tuple[float, bytes]] = []
            sent_at = time.perf_counter()
            async with http.post("/generate", json=body) as response:
                response.raise_for_status()
                async for line in response.content:
                    lines.append((time.perf_counter(), line.rstrip(b"\r\n")))
            return lines, sent_at

        # A warm-up request: the first pass pays one-off costs (kernels, compilation) no request should carry.
        await one(work.prompts[0][:16], 4)
        async with http.get("/get_model_info") as response:
            before = await response.json()
        started = time.perf_counter()
        runs = [asyncio.ensure_future(one(p, n)) for p, n in zip(work.prompts, work.output_lens, strict=True)]
        left = None if deadline is None else max(deadline - time.monotonic(), min_window_s)
        _, running = await asyncio.wait(runs, timeout=left)
        wall = time.perf_counter() - started
        if running:
            # Past the deadline: what streamed so far is the rate; the rest end as aborted.
            async with http.post("/abort_request", json={"abort_all": True}) as response:
                response.raise_for_status()
        streams = await asyncio.gather(*runs)
        until = started + wall if running else None
        timings = [read_stream(lines, sent_at, until) for lines, sent_at in streams]
        async with http.get("/get_model_info") as response:
            info = await response.json()
    tokens = sum(timing.tokens for timing in timings)
    ttft = [timing.ttft_s for timing in timings if timing.tokens]
    itl = [gap for timing in timings for gap in timing.itl_s]
    peak = info.get("peak_device_memory_bytes")
    return {
        "output_tokens": tokens,
        "cut_short": bool(running),
        "finished_requests": len(runs) - len(running),
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 1),
        "ttft_p50_s": round(percentile(ttft, 0.5), 4),
        "ttft_p99_s": round(percentile(ttft, 0.99), 4),
        "itl_p50_s": round(percentile(itl, 0.5), 5),
        "itl_p99_s": round(percentile(itl, 0.99), 5),
        "kv_blocks_used": info["kv_peak_used_blocks"],
        "kv_blocks_total": info["kv_total_blocks"],
        "kv_block_size": info["kv_block_size"],
        "attention_backend": info["attention_backend"],
        "cuda_graph": bool(info["cuda_graph_batch_sizes"]),
        "device_wait_share": _device_wait_share(before, info),
        "overlap_schedule": info["overlap_schedule"],
        "sampling_backend": info["sampling_backend"],
        "peak_gpu_memory_gib": round(peak / 2**30, 2) if peak else None,
        # What the engine compiled (at start: the workload must compile nothing) and how long it took.
        "compiled_graphs": info["compiled_graphs"],
        "compile_s": info["compile_seconds"],
    }


async def _profile_decode(url: str, work: Workload, steps: int, directory: Path) -> dict[str, Any]:
    """``steps`` decode steps of a full batch under the engine's ``/start_profile``: the workload's
    first requests (up to the engine's 256 running), each streamed until its first token, so every
    prefill is over when the profile starts; then the summary the engine writes (its trace stays
    in ``directory``), and the batch aborted."""
    import aiohttp

    rows = min(len(work.prompts), 256)
    prefilled = asyncio.Semaphore(0)
    connector = aiohttp.TCPConnector(limit=rows + 8)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:

        async def one(prompt: list[int]) -> None:
            params = {"temperature": 0.0, "max_new_tokens": 4 * steps + 64, "ignore_eos": True}
            first = True
            try:
                body = {"input_ids": prompt, "sampling_params": params, "stream": True}
                async with http.post("/generate", json=body) as r:
                    r.raise_for_status()
                    async for _ in r.content:
                        if first:
                            prefilled.release()
                            first = False
            finally:
                if first:  # failed before its first token: the wait below must not hang on it
                    prefilled.release()

        batch = [asyncio.ensure_future(one(prompt)) for prompt in work.prompts[:rows]]
        for _ in range(rows):
            await prefilled.acquire()
        async with http.post("/start_profile", json={"output_dir": str(directory), "num_steps": steps}) as r:
            r.raise_for_status()
        while not (summary := next(directory.glob("*.summary.json"), None)):
            if all(task.done() for task in batch):
                raise RuntimeError("the batch ended before the profile wrote its summary")
            await asyncio.sleep(0.05)
        async with http.post("/abort_request", json={"abort_all": True}) as r:
            r.raise_for_status()
        await asyncio.gather(*batch)
    return {"rows": rows, "steps": steps, **json.loads(summary.read_text())}


def _device_wait_share(before: dict[str, Any], after: dict[str, Any]) -> float | None:
    """Of the engine's busy seconds over the workload, the share it waited for the device to return a
    step's tokens: the host's slack, near 0 where its work bounds the engine, above where the device
    does (on CPU the pass runs on the host, so the share stays near 0)."""
    busy = after["busy_seconds"] - before["busy_seconds"]
    return round((after["device_wait_seconds"] - before["device_wait_seconds"]) / busy, 3) if busy > 0 else None


async def _paused_total(http: Any) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "relayrl_engine_generation_paused_seconds_sum":
                return sample.value
    raise RuntimeError("the engine's /metrics has no relayrl_engine_generation_paused_seconds")


async def _update_pauses(url: str, model_dir: Path, device: str) -> dict[str, float]:
    """Each route's pause of generation for one whole-model update, with requests running."""
    import torch
    from safetensors.torch import load_file

    from relayrl import http_client
    from services.engine.tensor_updates import flattened_bucket, serialize

    tensors = load_file(str(model_dir / "model.safetensors"))
    pauses: dict[str, float] = {}
    async with http_client.async_client(base_url=url, timeout=None) as http:
        params = {"temperature": 0.0, "max_new_tokens": 64, "ignore_eos": True}
        load = asyncio.gather(
            *(http.post("/generate", json={"input_ids": [1, 2, 3, 4], "sampling_params": params}) for _ in range(8))
        )
        await asyncio.sleep(0.2)
        host_dir = Path(tempfile.mkdtemp(prefix="relayrl-bench-weights-", dir=SHM if SHM.is_dir() else None))
        try:
            shutil.copy(model_dir / "model.safetensors", host_dir / "model.safetensors")
            before = await _paused_total(http)
            response = await http.post("/update_weights_from_disk", json={"model_path": str(host_dir)})
            response.raise_for_status()
            pauses["from_disk"] = round(await _paused_total(http) - before, 6)
        finally:
            shutil.rmtree(host_dir, ignore_errors=True)
        if device == "cuda":
            on_device = {name: t.to("cuda") for name, t in tensors.items()}
        else:
            torch.multiprocessing.set_sharing_strategy("file_system")
            on_device = tensors
        bucket = flattened_bucket(on_device)
        before = await _paused_total(http)
        body = {"serialized_named_tensors": [serialize(bucket)], "load_format": "flattened_bucket"}
        response = await http.post("/update_weights_from_tensor", json=body)
        response.raise_for_status()
        pauses["from_tensor"] = round(await _paused_total(http) - before, 6)
        await load
    return pauses


def _load(model_dir: Path, device: str, dtype: str, attn: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=getattr(torch, dtype), attn_implementation=attn, local_files_only=True
    )
    return model.to(device).eval()


def _floor_result(tokens: int, wall: float, device: str) -> dict[str, Any]:
    import torch

    peak = torch.cuda.max_memory_reserved() if device == "cuda" else None
    return {
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 1),
        "peak_gpu_memory_gib": round(peak / 2**30, 2) if peak else None,
    }


def _hf_generate(model_dir: Path, device: str, dtype: str, work: Workload, batch: int) -> dict[str, Any]:
    """``generate`` in static batches of left-padded prompts, every output ``work.mean_output`` tokens."""
    import torch

    model = _load(model_dir, device, dtype, "sdpa")
    pad = int(model.config.pad_token_id or 0)
    new = work.mean_output
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(work.prompts), batch):
            prompts = work.prompts[first : first + batch]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=pad,
            )
    wall = time.perf_counter() - started
    result = _floor_result(new * len(work.prompts), wall, device)
    del model
    return result


def block_tokens(config: Any) -> int:
    """Tokens in one block of generate_batch's cache: 5.23 calls them page_size, 5.17 block_size."""
    return getattr(config, "page_size", None) or config.block_size


def _cache_for(work: Workload) -> Any:
    """generate_batch's paged cache with room for every request of ``work`` at once. Left to itself it
    takes 90 % of the device's free memory, on CPU the host's: 14.7 GB of a 24 GB machine here for a
    tiny model's six requests (21.5 GB with transformers 5.17), enough to kill a test run beside it."""
    from transformers import ContinuousBatchingConfig

    tokens = block_tokens(ContinuousBatchingConfig())
    blocks = sum(-(-(len(prompt) + work.mean_output) // tokens) for prompt in work.prompts)
    # Both given, or transformers solves for the other from free memory. 8192 tokens a step is its
    # own choice where memory allows.
    return ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=8192)


def _generate_batch(model_dir: Path, device: str, dtype: str, work: Workload) -> dict[str, Any]:
    """transformers' continuous batching (``generate_batch``: its own paged cache over SDPA), every output
    ``work.mean_output`` tokens."""
    import torch
    import transformers
    from transformers import GenerationConfig, GenerationMixin

    if not hasattr(GenerationMixin, "generate_batch"):
        return {"skipped": f"transformers {transformers.__version__} has no generate_batch"}
    try:
        model = _load(model_dir, device, dtype, "sdpa")
        config = GenerationConfig(
            max_new_tokens=work.mean_output,
            min_new_tokens=work.mean_output,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=int(model.config.pad_token_id or 0),
        )
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        outputs = model.generate_batch(
            inputs=work.prompts, generation_config=config, continuous_batching_config=_cache_for(work)
        )
        wall = time.perf_counter() - started
    except Exception as exc:  # a floor that cannot run here is reported, not fatal to the bench
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    tokens = sum(len(out.generated_tokens) for out in outputs.values())
    return _floor_result(tokens, wall, device)
