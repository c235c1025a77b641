"""``relayrl engine``: the built-in engine that serves SGLang's native HTTP API; ``relayrl bench engine``."""

from __future__ import annotations

from typing import Annotated

import typer

from services.engine.bench import OverlapSchedule, StreamInterval, streaming_settings

app = typer.Typer(help="The built-in inference engine (SGLang's native HTTP API).", no_args_is_help=True)


@app.callback()
def main() -> None:
    """The built-in engine: a group even with one command, as ``relayrl engine serve`` names it."""


@app.command("serve")
def serve_command(
    model: Annotated[str | None, typer.Option(help="Hugging Face model directory (RELAYRL_ENGINE_MODEL_PATH).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (RELAYRL_ENGINE_HTTP_PORT).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (RELAYRL_ENGINE_HOST).")] = None,
    weight_version: Annotated[
        str | None, typer.Option(help="Initial weight_version (RELAYRL_ENGINE_WEIGHT_VERSION).")
    ] = None,
) -> None:
    """Serve a model with continuous batching (on RELAYRL_ENGINE_DEVICE) until SIGTERM/SIGINT."""
    import asyncio

    from relayrl.service_cli import settings_or_exit
    from services.engine.config import EngineSettings

    settings = settings_or_exit(
        EngineSettings,
        required={"model_path": "--model DIR"},
        model_path=model,
        http_port=port,
        host=host,
        weight_version=weight_version,
    )
    from relayrl.config import SettingsError
    from relayrl.serving import uncollected_start

    # Imported once the settings are known good: the service pulls in torch, which takes seconds.
    with uncollected_start():
        from services.engine.server import serve

    try:
        asyncio.run(serve(settings))
    except SettingsError as err:  # what only the loaded model tells (the KV cache's room on the GPU)
        typer.echo(err.one_line(), err=True)
        raise typer.Exit(2) from None


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    preset: Annotated[str, typer.Option(help="Model preset: tiny, small or base (Qwen2.5-0.5B's shape).")] = "tiny",
    requests: Annotated[int, typer.Option(help="Requests (nano-vllm: 256).")] = 256,
    min_len: Annotated[int, typer.Option(help="Shortest prompt and output, tokens (nano-vllm: 100).")] = 100,
    max_len: Annotated[int, typer.Option(help="Longest prompt and output, tokens (nano-vllm: 1024).")] = 1024,
    hf_batch: Annotated[int, typer.Option(help="Static batch size of the Hugging Face generate floor.")] = 64,
    floors: Annotated[bool, typer.Option(help="Also run HF generate and generate_batch on the workload.")] = True,
    floor_requests: Annotated[
        int, typer.Option(help="Run the floors on the first N requests only (their tokens/s is compared); 0: all.")
    ] = 0,
    attention: Annotated[
        str,
        typer.Option(
            "--attention",
            "--attention-backend",
            help="The engine's attention backends, comma-separated (auto, torch_native, flex_attention, triton): each"
            " runs the workload in one engine process of its own, in this run; the fastest is reported as engine,"
            " one that fails under failed (the others still run; exit code 1).",
        ),
    ] = "auto",
    cuda_graph: Annotated[bool, typer.Option(help="Decode from CUDA graphs on cuda.")] = True,
    cuda_graph_max_bs: Annotated[
        int, typer.Option(min=1, help="The largest decode batch replayed from a CUDA graph (the engine's setting).")
    ] = 256,
    stream_interval: StreamInterval = 1,
    overlap_schedule: OverlapSchedule = True,
    profile_steps: Annotated[
        int,
        typer.Option(
            min=0,
            help="After each engine's workload, profile this many decode steps of a full batch through /start_profile"
            " (engines.<name>.profile: seconds by kind of kernel, the busiest kernels, on cuda the GPU's busy share);"
            " 0: none.",
        ),
    ] = 0,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            help="At this many seconds abort a workload still running (its rate is taken over the tokens streamed"
            " until then: cut_short) and start no further engine or floor (skipped). Default: no limit."
        ),
    ] = None,
) -> None:
    """nano-vllm's workload streamed through the engine's HTTP API, with HF generate and generate_batch as floors,
    one run."""
    import json
    from typing import get_args

    from relayrl.devices import check_bench_device
    from services.engine.bench import run_bench
    from services.engine.config import AttentionBackend, EngineSettings

    check_bench_device(device)
    backends = [name.strip() for name in attention.split(",") if name.strip()]
    known = get_args(AttentionBackend)
    # auto is a backend named by device: with that backend also listed, the two would be one run twice.
    resolved = {
        EngineSettings.model_construct(device=device, attention_backend=name).resolved_attention_backend()
        for name in backends
        if name in known
    }
    if not backends or any(name not in known for name in backends) or len(resolved) < len(backends):
        raise typer.BadParameter(
            f"{attention!r}: give a comma-separated list of distinct {', '.join(known)}", param_hint="--attention"
        )
    settings = {
        "RELAYRL_ENGINE_DISABLE_CUDA_GRAPH": str(not cuda_graph).lower(),
        "RELAYRL_ENGINE_CUDA_GRAPH_MAX_BS": str(cuda_graph_max_bs),
        **streaming_settings(stream_interval, overlap_schedule),
    }
    result = run_bench(
        preset,
        device,
        requests,
        min_len,
        max_len,
        hf_batch,
        floors,
        settings,
        floor_requests,
        attention=backends,
        timeout_s=timeout_s,
        profile_steps=profile_steps,
    )
    typer.echo(json.dumps(result))
    if result.get("failed"):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
