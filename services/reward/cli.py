"""``relayrl reward``: the reward-model service; ``relayrl bench reward``: its batching benchmark."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="The reward-model service: batched scoring over HTTP.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """The reward service: a group even with one command, as ``relayrl reward serve`` names it."""


@app.command("serve")
def serve_command(
    model: Annotated[str | None, typer.Option(help="Hugging Face model directory (RELAYRL_REWARD_MODEL_PATH).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (RELAYRL_REWARD_HTTP_PORT).")] = None,
    host: Annotated[str | None, typer.Option(help="Bind address (RELAYRL_REWARD_HOST).")] = None,
    kind: Annotated[str | None, typer.Option(help="classifier or judge (RELAYRL_REWARD_KIND).")] = None,
) -> None:
    """Serve POST /score with dynamic batching until SIGTERM/SIGINT; settings from RELAYRL_REWARD_*."""
    import asyncio

    from relayrl.service_cli import settings_or_exit
    from services.reward.config import RewardSettings

    settings = settings_or_exit(
        RewardSettings, required={"model_path": "--model DIR"}, model_path=model, http_port=port, host=host, kind=kind
    )
    from relayrl.serving import uncollected_start

    # Imported once the settings are known good: loading pulls in torch, which takes seconds.
    with uncollected_start():
        from services.reward.server import serve

    asyncio.run(serve(settings))


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    requests: Annotated[int, typer.Option(help="/score requests per measurement.")] = 64,
    items_per_request: Annotated[int, typer.Option(help="Items per request (the rollout sends one group).")] = 8,
    concurrency: Annotated[int, typer.Option(help="Requests in flight at once.")] = 8,
    max_batch_size: Annotated[int, typer.Option(help="max_batch_size of the batching service.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(help="max_wait_ms of the batching service.")] = 5.0,
    tokens: Annotated[
        int, typer.Option(help="Longest scored sequence, tokens (the demo's prompt + answer is ~20).")
    ] = 24,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds; figures are medians.")] = 3,
    model: Annotated[str, typer.Option(help="Reward model directory; empty: a tiny-rm made for the run.")] = "",
) -> None:
    """Scored samples/s of the reward service at batch size 1 vs. dynamic batching, same load, same run."""
    import json

    from services.reward.bench import BenchSpec, run_bench

    spec = BenchSpec(
        requests=requests,
        items_per_request=items_per_request,
        concurrency=concurrency,
        max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms,
        tokens=tokens,
        rounds=rounds,
        model=model,
    )
    result = run_bench(spec)
    typer.echo(json.dumps(result) if json_output else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    app()
