"""``relayrl paramsync ...`` and ``relayrl bench paramsync``. Only typer and stdlib load at import."""

from __future__ import annotations

import typer

app = typer.Typer(help="Paramsync: versioned weight broadcast from the trainer to every rollout replica.")


@app.command()
def serve(
    grpc_port: int = typer.Option(None, help="Overrides RELAYRL_PARAMSYNC_GRPC_PORT."),
    http_port: int = typer.Option(None, help="Overrides RELAYRL_PARAMSYNC_HTTP_PORT."),
    transport: str = typer.Option(None, help="Overrides RELAYRL_PARAMSYNC_TRANSPORT (grpc, disk, distributed)."),
) -> None:
    """Serve ParamSync over gRPC plus /healthz, /readyz, /metrics over HTTP (settings: RELAYRL_PARAMSYNC_*)."""
    import asyncio

    from relayrl.service_cli import settings_or_exit
    from services.paramsync.config import ParamSyncSettings
    from services.paramsync.server import serve as run

    settings = settings_or_exit(ParamSyncSettings, grpc_port=grpc_port, http_port=http_port, transport=transport)
    try:
        asyncio.run(run(settings))
    except ValueError as exc:  # a transport whose settings are incomplete
        typer.echo(f"paramsync: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("replicas")
def replicas(address: str = typer.Option(..., help="paramsync gRPC address, host:port")) -> None:
    """Print the version table as JSON."""
    import asyncio
    import dataclasses
    import json

    from services.paramsync.client import ParamSyncClient

    async def run() -> dict:
        async with ParamSyncClient(address, max_sync_retries=0, sync_timeout=10) as client:
            table = await client.list_replicas()
        return {"latest_version": table.latest_version, "replicas": [dataclasses.asdict(r) for r in table.replicas]}

    typer.echo(json.dumps(asyncio.run(run())))


def bench(
    size_mb: int = typer.Option(512, min=1, help="Size of the published version, MiB."),
    replicas: str = typer.Option("1,4", help="Replica counts to measure, comma separated."),
    checksum: str = typer.Option("xxh3_128", help="Per-tensor digest: xxh3_128, sha256 or crc32."),
    rounds: int = typer.Option(5, min=1, help="Versions timed per replica count after the first (medians)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON line (the only output format)."),
) -> None:
    """Time versions reaching 1 and N replicas, next to raw loopback TCP in the same run."""
    import json

    from services.paramsync.bench import run_bench

    try:
        counts = sorted({int(x) for x in replicas.split(",") if x.strip()})
    except ValueError:
        raise typer.BadParameter(f"--replicas must be integers separated by commas, got {replicas!r}") from None
    if not counts or counts[0] < 1:
        raise typer.BadParameter("--replicas needs at least one count >= 1")
    typer.echo(json.dumps(run_bench(size_mb, counts, checksum, rounds)))


if __name__ == "__main__":
    app()
