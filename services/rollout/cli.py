"""``relayrl rollout``: a rollout replica, and its benchmark."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="Rollout replicas: lease prompts, generate with an engine, score, push.", no_args_is_help=True)


@app.command("serve")
def serve_command(
    engine_url: Annotated[str | None, typer.Option(help="Engine base URL (RELAYRL_ROLLOUT_ENGINE_URL).")] = None,
    queue_address: Annotated[
        str | None, typer.Option(help="Queue gRPC host:port (RELAYRL_ROLLOUT_QUEUE_ADDRESS).")
    ] = None,
    paramsync_address: Annotated[
        str | None, typer.Option(help="Paramsync gRPC host:port (RELAYRL_ROLLOUT_PARAMSYNC_ADDRESS).")
    ] = None,
    replica_id: Annotated[str | None, typer.Option(help="Replica name (RELAYRL_ROLLOUT_REPLICA_ID).")] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP port (RELAYRL_ROLLOUT_HTTP_PORT).")] = None,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port (RELAYRL_ROLLOUT_GRPC_PORT).")] = None,
) -> None:
    """Run one rollout replica until SIGTERM/SIGINT."""
    import asyncio

    from relayrl.service_cli import settings_or_exit
    from services.rollout.config import RolloutSettings

    settings = settings_or_exit(
        RolloutSettings,
        engine_url=engine_url,
        queue_address=queue_address,
        paramsync_address=paramsync_address,
        replica_id=replica_id,
        http_port=http_port,
        grpc_port=grpc_port,
    )
    from services.rollout.server import serve

    asyncio.run(serve(settings))


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    prompts: Annotated[int, typer.Option(help="Prompts generated through each path.")] = 32,
    n: Annotated[int, typer.Option(help="Samples per prompt.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Response budget per sample, tokens.")] = 64,
    inflight: Annotated[int, typer.Option(help="Prompts in flight (requests in flight = inflight × n).")] = 8,
    rounds: Annotated[int, typer.Option(help="Alternating direct/service rounds; medians are reported.")] = 3,
    device: Annotated[str, typer.Option(help="Where the engine runs: cpu or cuda (RELAYRL_ENGINE_DEVICE).")] = "cpu",
) -> None:
    """Tokens/s through the rollout service vs. the same requests sent straight to the engine, same run."""
    import json

    from relayrl.devices import check_bench_device
    from services.rollout.bench import run_bench

    check_bench_device(device)
    result = run_bench(prompts, n, max_new_tokens, inflight, rounds, device)
    typer.echo(json.dumps(result.to_dict()))
