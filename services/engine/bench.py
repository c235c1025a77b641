"""``relayrl bench engine``: the built-in engine on nano-vllm's workload, against Hugging Face's own
generation loops on the same model and requests, in one run.

The workload is nano-vllm's ``bench.py``: ``requests`` prompts of random token ids, each prompt's
length and its output length uniform in ``[min_len, max_len]`` (100-1024 by default), a fixed
seed, EOS ignored. Three paths run it one after the other:

- ``engine``: every request sent at once to an engine process (``relayrl engine serve``) through
  its HTTP API (``/generate``), greedy; output tokens/s over the wall time of the whole set, time
  to first token (the engine's ``first_token_latency``: arrival to first sampled token) and
  inter-token latency (each request's ``(e2e - ttft) / (tokens - 1)``) at p50 and p99, the KV
  blocks the run held at most, and the engine's peak GPU memory.
- ``hf_generate`` (the floor): ``model.generate`` in static batches of ``hf_batch`` left-padded
  prompts, SDPA attention;
- ``generate_batch`` (the other floor): transformers' continuous batching (its own paged cache,
  over SDPA; transformers 5.23 takes ``sdpa`` for what ``paged|sdpa`` named).

Both floors take one output length for all (``generate_batch`` has no per-request length): the
workload's mean, so their total output equals the engine's within rounding. Then the weight
update pause of each route, measured by the engine (``relayrl_engine_generation_paused_seconds``)
while requests are running: ``update_weights_from_disk`` from a safetensors file in ``/dev/shm``
(paramsync's host buffers), and ``update_weights_from_tensor`` with one flattened bucket per
handle (CUDA IPC on a GPU; shared memory on CPU).
"""

from __future__ import annotations

import asyncio
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHM = Path("/dev/shm")


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
) -> dict[str, Any]:
    from relayrl.models.tiny import init_tiny, preset_spec

    dtype = "bfloat16" if device == "cuda" else "float32"
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-engine-") as tmp:
        model_dir = init_tiny(Path(tmp) / "model", preset_spec(preset, dtype=dtype))
        vocab = preset_spec(preset).vocab_size
        work = Workload.nano_vllm(requests, min_len, max_len, vocab)
        result: dict[str, Any] = {
            "bench": "engine",
            "device": device,
            "gpu": _gpu_name(device),
            "preset": preset,
            "requests": requests,
            "min_len": min_len,
            "max_len": max_len,
            "output_tokens": sum(work.output_lens),
        }
        with _engine(model_dir, device, settings) as url:
            result["engine"] = asyncio.run(_engine_run(url, work))
            result["weight_update_pause_s"] = asyncio.run(_update_pauses(url, model_dir, device))
        if floors:
            # The floors may run the first floor_requests requests only: their rate, not their total, is compared.
            part = Workload(work.prompts[: floor_requests or None], work.output_lens[: floor_requests or None])
            result["floor_requests"] = len(part.prompts)
            result["hf_generate"] = _hf_generate(model_dir, device, dtype, part, hf_batch)
            result["generate_batch"] = _generate_batch(model_dir, device, dtype, part)
            engine_rate = result["engine"]["output_tokens_per_s"]
            for floor in ("hf_generate", "generate_batch"):
                rate = result[floor].get("output_tokens_per_s")
                result[f"ratio_vs_{floor}"] = round(engine_rate / rate, 2) if rate else None
        return result


def _gpu_name(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else None


@contextmanager
def _engine(model_dir: Path, device: str, settings: dict[str, str]) -> Iterator[str]:
    from relayrl.net import free_port
    from relayrl.subprocesses import stop_process
    from services.engine.launch import launch_engine, wait_engine_healthy

    port = free_port()
    env = {"RELAYRL_ENGINE_DEVICE": device, "RELAYRL_ENGINE_MAX_RUNNING_REQUESTS": "256", **settings}
    if device == "cuda":
        env["RELAYRL_ENGINE_MAX_PREFILL_TOKENS"] = env.get("RELAYRL_ENGINE_MAX_PREFILL_TOKENS", "16384")
    process = launch_engine(model_dir, port, stderr=subprocess.PIPE, settings=env)
    url = f"http://127.0.0.1:{port}"
    try:
        # CUDA graphs are captured at start: give it minutes.
        wait_engine_healthy(process, url, timeout_s=600)
        yield url
    except Exception:
        if process.poll() is not None and process.stderr is not None:
            raise RuntimeError(f"engine exited: {process.stderr.read().decode()[-2000:]}") from None
        raise
    finally:
        stop_process(process)


async def _engine_run(url: str, work: Workload) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=len(work.prompts) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as http:

        async def one(prompt: list[int], output_len: int) -> dict[str, Any]:
            params = {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}
            response = await http.post("/generate", json={"input_ids": prompt, "sampling_params": params})
            response.raise_for_status()
            return response.json()["meta_info"]

        # A warm-up request: the first pass pays one-off costs (kernels, compilation) no request should carry.
        await one(work.prompts[0][:16], 4)
        started = time.perf_counter()
        metas = await asyncio.gather(*(one(p, n) for p, n in zip(work.prompts, work.output_lens, strict=True)))
        wall = time.perf_counter() - started
        info = (await http.get("/get_model_info")).json()
    tokens = sum(meta["completion_tokens"] for meta in metas)
    ttft = [meta["first_token_latency"] for meta in metas]
    itl = [
        (meta["e2e_latency"] - meta["first_token_latency"]) / (meta["completion_tokens"] - 1)
        for meta in metas
        if meta["completion_tokens"] > 1
    ]
    peak = info.get("peak_device_memory_bytes")
    return {
        "output_tokens": tokens,
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
        "peak_gpu_memory_gib": round(peak / 2**30, 2) if peak else None,
    }


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
    import httpx
    import torch
    from safetensors.torch import load_file

    from services.engine.tensor_updates import flattened_bucket, serialize

    tensors = load_file(str(model_dir / "model.safetensors"))
    pauses: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url, timeout=None) as http:
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


def _generate_batch(model_dir: Path, device: str, dtype: str, work: Workload) -> dict[str, Any]:
    """transformers' continuous batching (``generate_batch``: its own paged cache over SDPA), every output
    ``work.mean_output`` tokens."""
    import torch
    from transformers import GenerationConfig

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
        outputs = model.generate_batch(inputs=work.prompts, generation_config=config)
        wall = time.perf_counter() - started
    except Exception as exc:  # a floor that cannot run here is reported, not fatal to the bench
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    tokens = sum(len(out.generated_tokens) for out in outputs.values())
    return _floor_result(tokens, wall, device)
