"""``relayrl queue``: run the queue service; ``relayrl bench queue``: its benchmark."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="The Redis Streams trajectory and prompt queues.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """The queue service: a group even with one command, as ``relayrl queue serve`` names it."""


@app.command("serve")
def serve_command(
    grpc_port: Annotated[int | None, typer.Option(help="Overrides RELAYRL_QUEUE_GRPC_PORT.")] = None,
    http_port: Annotated[int | None, typer.Option(help="Overrides RELAYRL_QUEUE_HTTP_PORT.")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Overrides RELAYRL_REDIS_URL.")] = None,
) -> None:
    """Serve TrajectoryQueue and PromptQueue over gRPC, with /healthz, /readyz, /metrics over HTTP.

    Settings come from RELAYRL_QUEUE_* and the shared RELAYRL_REDIS_URL, RELAYRL_RUN_ID.
    """
    import asyncio

    from relayrl.service_cli import settings_or_exit
    from services.queue.config import QueueSettings
    from services.queue.server import serve

    settings = settings_or_exit(QueueSettings, grpc_port=grpc_port, http_port=http_port, redis_url=redis_url)
    asyncio.run(serve(settings))


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    groups: Annotated[int, typer.Option(help="Groups pushed through each path.")] = 400,
    producers: Annotated[int, typer.Option(help="Concurrent producers.")] = 4,
    batch: Annotated[int, typer.Option(help="Groups per push and per pull.")] = 8,
    samples: Annotated[int, typer.Option(help="Samples per group.")] = 8,
    response_tokens: Annotated[int, typer.Option(help="Response tokens per sample.")] = 1024,
    rounds: Annotated[int, typer.Option(min=1, help="Alternating raw/service rounds; figures are medians.")] = 3,
) -> None:
    """Queue throughput end to end (push → pull → ack over gRPC) against raw Redis, same run, same payload."""
    import asyncio
    import json

    from services.queue.bench import BenchSpec, run_bench

    spec = BenchSpec(
        groups=groups,
        producers=producers,
        batch=batch,
        samples=samples,
        response_tokens=response_tokens,
        rounds=rounds,
    )
    result = asyncio.run(run_bench(spec))
    typer.echo(json.dumps(result) if json_output else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    app()
