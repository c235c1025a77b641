"""``relayrl bench sampling``: the engine's sampling backends side by side on one step's logits.

Each backend draws a token for every row of a ``[batch, vocab]`` logits tensor in the model's dtype
(Qwen2.5's 151,936-token vocabulary, bfloat16 on cuda by default), every row at temperature 1
without top-k or top-p (an RL rollout's settings), as a decode step of that many rows would. A
backend's figure is the median over rounds of the time per call of ``calls`` calls queued back to
back and waited for once: what a step pays, its launches and the device's passes overlapped as
they are in serving. A backend that cannot run here (triton on a CPU) is reported as skipped with
the reason.
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated, Any

import typer

from relayrl.devices import bench_gpu_name, check_bench_device

BACKENDS = ("pytorch", "triton")


def _seconds_per_call(sample: Any, logits: Any, configs: list[Any], generator: Any, calls: int, rounds: int) -> float:
    import torch

    def sync() -> None:
        if logits.device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):  # a kernel built at first use is built here
        sample(logits, configs, generator)
    sync()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            sample(logits, configs, generator)
        sync()
        times.append((time.perf_counter() - started) / calls)
    return statistics.median(times)


def run_sampling_bench(device: str, batches: list[int], vocab: int, dtype: str, calls: int, rounds: int) -> dict:
    import torch

    from relayrl.config import SettingsError
    from services.engine.sampling import SamplingConfig, sampler_named

    target = torch.device(device)
    torch_dtype = getattr(torch, dtype)
    samplers: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in BACKENDS:
        try:
            samplers[name] = sampler_named(name, target)
        except SettingsError as exc:
            skipped[name] = exc.one_line()
    generator = torch.Generator(device=target).manual_seed(0)
    figures: dict[str, dict[str, float]] = {}
    for batch in batches:
        logits = torch.randn((batch, vocab), generator=generator, device=target).mul_(3).to(torch_dtype)
        configs = [SamplingConfig()] * batch
        row: dict[str, float] = {}
        for name, sampler in samplers.items():
            row[f"{name}_ms"] = round(
                _seconds_per_call(sampler.sample, logits, configs, generator, calls, rounds) * 1e3, 4
            )
        if len(samplers) == len(BACKENDS):
            row["speedup"] = round(row["pytorch_ms"] / row["triton_ms"], 2)
        figures[str(batch)] = row
    return {
        "bench": "sampling",
        "device": device,
        "gpu": bench_gpu_name(device),
        "vocab": vocab,
        "dtype": dtype,
        "calls": calls,
        "rounds": rounds,
        "batches": figures,
        "skipped": skipped,
    }


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    batch: Annotated[str, typer.Option(help="Rows per step, comma-separated.")] = "1,64,256",
    vocab: Annotated[int, typer.Option(min=2, help="Vocabulary size (Qwen2.5: 151,936).")] = 151936,
    dtype: Annotated[str, typer.Option(help="The logits' dtype; auto: bfloat16 on cuda, float32 on cpu.")] = "auto",
    calls: Annotated[int, typer.Option(min=1, help="Calls per round, queued back to back.")] = 20,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds; each figure is their median.")] = 5,
) -> None:
    """The engine's sampling backends (pytorch, triton) on one step's logits, side by side: milliseconds per call."""
    import json

    check_bench_device(device)
    try:
        batches = [int(b) for b in batch.split(",") if b.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise typer.BadParameter(f"{batch!r}: give comma-separated row counts >= 1", param_hint="--batch")
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    if dtype not in ("float32", "bfloat16", "float16"):
        raise typer.BadParameter(f"{dtype!r}: choose auto, float32, bfloat16 or float16", param_hint="--dtype")
    typer.echo(json.dumps(run_sampling_bench(device, batches, vocab, dtype, calls, rounds)))
