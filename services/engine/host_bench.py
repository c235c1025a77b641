"""``relayrl bench engine-host``: how many tokens a second the engine's host side can feed a GPU,
measured on any machine.

A GPU engine is only as fast as the host work around each pass: admitting requests, building the
pass's inputs, sampling, and streaming every token back over HTTP, all in one Python process. On a
GPU that work either hides behind the pass or adds to it. This bench runs the real engine process
(HTTP server, scheduler, KV block tables, sampling, streaming) on nano-vllm's workload through its
HTTP API, as ``bench engine`` does, with one change: the model's pass runs on a simulated GPU
(:class:`SimulatedGPU`). A pass is queued and returns at once, with logits that make every row's
next token its last one plus one; the queued passes take their time one after another (a decode
step its wait, a prefill its tokens' time), and the host waits only where the engine reads a step's
tokens back, for the passes queued before that read-back, as on a GPU. A wait of 0 gives the
host's own ceiling; a wait of a GPU step's length (by the arithmetic of weights and KV cache read
per step, a few milliseconds for a ``base`` decode step over 256 rows on an H100-class GPU) gives
what the engine reaches when the host work hides behind the passes, or fails to. These are host
figures, not GPU figures: ``bench engine --device cuda`` measures the GPU.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from services.engine.bench import (
    OverlapSchedule,
    StreamInterval,
    Workload,
    engine_process,
    stream_workload,
    streaming_settings,
)

if TYPE_CHECKING:  # the CLI imports this module to list its command: torch waits until the bench runs
    import torch

    from services.engine.attention import PassInputs

# The child engine's simulated pass: a decode step's wait, and a prefill's per token fed.
DECODE_MS_ENV = "RELAYRL_BENCH_SIMULATED_DECODE_MS"
PREFILL_US_ENV = "RELAYRL_BENCH_SIMULATED_PREFILL_US_PER_TOKEN"

# A GPU engine's prefill budget (SGLang's default on a GPU, and bench engine's on cuda).
GPU_MAX_PREFILL_TOKENS = 16384

FIGURES = (
    "output_tokens",
    "wall_s",
    "output_tokens_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p99_s",
    # The host's slack: the share of its busy time it waited for the simulated GPU (0: the host bounds it).
    "device_wait_share",
    "overlap_schedule",
)


class SimulatedGPU:
    """A stand-in for the GPU's stream: passes queue and run one after another while the host goes
    on (a decode step ``decode_s``; a prefill its tokens times ``prefill_s_per_token``, at least
    ``decode_s``), and a read-back waits for the passes queued before it."""

    def __init__(self, decode_s: float, prefill_s_per_token: float) -> None:
        self.decode_s, self.prefill_s_per_token = decode_s, prefill_s_per_token
        # When the passes queued so far end (``time.perf_counter``).
        self.free_at = 0.0

    def forward_logits(self, runner: Any, input_ids: torch.Tensor, positions: torch.Tensor, inputs: PassInputs) -> Any:
        """:meth:`ModelRunner.forward_logits`: queues the pass and returns logits whose argmax is each
        row's last token plus one."""
        import torch

        rows, width = input_ids.shape
        seconds = self.decode_s if width == 1 else max(self.decode_s, self.prefill_s_per_token * rows * width)
        self.free_at = max(time.perf_counter(), self.free_at) + seconds
        vocab = int(runner.model.config.vocab_size)
        logits = torch.zeros((rows, vocab), device=input_ids.device)
        return logits.scatter_(1, (input_ids[:, -1:] + 1) % vocab, 1.0)

    def read_back(self, tensor: torch.Tensor) -> Callable[[], list[Any]]:
        """:func:`services.engine.device.read_back`: ready when the passes queued so far end."""
        values, ready = tensor.tolist(), self.free_at

        def wait() -> list[Any]:
            # Only a pass still running waits (a sleep, even of 0, would hand the GIL to the other thread).
            if (remaining := ready - time.perf_counter()) > 0:
                time.sleep(remaining)
            return values

        return wait


def run_host_bench(
    requests: int,
    min_len: int,
    max_len: int,
    decode_ms: Sequence[float],
    prefill_us_per_token: float,
    stream_interval: int,
    overlap_schedule: bool = True,
) -> dict[str, Any]:
    """The workload once per simulated decode pass in ``decode_ms``, each in an engine process of its own."""
    from relayrl.models.tiny import init_tiny, preset_spec

    spec = preset_spec("tiny")
    work = Workload.nano_vllm(requests, min_len, max_len, spec.vocab_size)
    result: dict[str, Any] = {
        "bench": "engine-host",
        "requests": requests,
        "min_len": min_len,
        "max_len": max_len,
        "stream_interval": stream_interval,
        "prefill_us_per_token": prefill_us_per_token,
        "max_prefill_tokens": GPU_MAX_PREFILL_TOKENS,
        "passes": {},
    }
    with tempfile.TemporaryDirectory(prefix="relayrl-bench-engine-host-") as tmp:
        model_dir = init_tiny(Path(tmp) / "model", spec)
        for ms in decode_ms:
            settings = {
                # Room for every request's prompt and output at once (and each one's last part-filled
                # block), so no request is retracted for want of blocks: a GPU's pool is far larger.
                "RELAYRL_ENGINE_MAX_TOTAL_TOKENS": str(requests * (2 * max_len + 64)),
                **streaming_settings(stream_interval, overlap_schedule),
                "RELAYRL_ENGINE_MAX_PREFILL_TOKENS": str(GPU_MAX_PREFILL_TOKENS),
                DECODE_MS_ENV: str(ms),
                PREFILL_US_ENV: str(prefill_us_per_token),
            }
            log = Path(tmp) / f"engine-{ms:g}.log"
            with engine_process(model_dir, "cpu", settings, log, module=__name__) as url:
                figures = asyncio.run(stream_workload(url, work))
            result["passes"][f"{ms:g}ms"] = {key: figures[key] for key in FIGURES}
    return result


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    requests: Annotated[int, typer.Option(min=1, help="Requests (nano-vllm: 256).")] = 256,
    min_len: Annotated[int, typer.Option(min=1, help="Shortest prompt and output, tokens (nano-vllm: 100).")] = 100,
    max_len: Annotated[int, typer.Option(min=1, help="Longest prompt and output, tokens (nano-vllm: 1024).")] = 1024,
    decode_ms: Annotated[
        str,
        typer.Option(
            help="The simulated decode pass, milliseconds, comma-separated: each runs the workload in an engine of its"
            " own (0: the host's own ceiling)."
        ),
    ] = "0,3",
    prefill_us_per_token: Annotated[
        float,
        typer.Option(min=0, help="The simulated prefill pass, microseconds per token fed (at least one decode pass)."),
    ] = 3.0,
    stream_interval: StreamInterval = 1,
    overlap_schedule: OverlapSchedule = True,
) -> None:
    """What the engine's host side (HTTP, scheduler, sampling, streaming) can feed a GPU: nano-vllm's workload through
    the real engine process with the model's passes on a simulated GPU stream, each as long as a GPU pass; on any
    machine."""
    import json

    try:
        passes = [float(ms) for ms in decode_ms.split(",") if ms.strip()]
    except ValueError:
        passes = []
    # Distinct: each pass's figures are keyed by its wait, so a repeated one would hide the other's.
    if not passes or any(ms < 0 for ms in passes) or len({f"{ms:g}" for ms in passes}) < len(passes):
        raise typer.BadParameter(
            f"{decode_ms!r}: give distinct comma-separated milliseconds >= 0", param_hint="--decode-ms"
        )
    if min_len > max_len:
        raise typer.BadParameter(f"{min_len} is more than --max-len {max_len}", param_hint="--min-len")
    result = run_host_bench(requests, min_len, max_len, passes, prefill_us_per_token, stream_interval, overlap_schedule)
    typer.echo(json.dumps(result))


def _serve_with_simulated_passes() -> None:
    """The bench's engine process: ``relayrl engine serve`` with the model's passes on a
    :class:`SimulatedGPU` and its KV pool allocated whole at start, as on a GPU (a CPU pool grows as
    it fills, each growth a copy of the whole pool that a GPU engine never makes)."""
    from services.engine import scheduler, state
    from services.engine.cli import app
    from services.engine.kv_pool import BlockPool
    from services.engine.model_runner import ModelRunner

    gpu = SimulatedGPU(float(os.environ[DECODE_MS_ENV]) / 1e3, float(os.environ[PREFILL_US_ENV]) / 1e6)

    def forward_logits(runner: ModelRunner, *pass_inputs: Any) -> Any:
        return gpu.forward_logits(runner, *pass_inputs)

    ModelRunner.forward_logits = forward_logits  # type: ignore[method-assign]
    scheduler.read_back = gpu.read_back  # type: ignore[assignment]
    grown_as_needed = state.kv_pool_for

    def allocated_at_start(*args: Any, **kwargs: Any) -> BlockPool:
        pool = grown_as_needed(*args, **kwargs)
        return BlockPool(pool.layout, pool.block_size, pool.max_blocks)

    state.kv_pool_for = allocated_at_start  # type: ignore[assignment]
    app()


if __name__ == "__main__":
    _serve_with_simulated_passes()
