"""``relayrl engine``: the built-in CPU engine that serves SGLang's native HTTP API."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(help="The built-in CPU inference engine (SGLang's native HTTP API).", no_args_is_help=True)


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
    """Serve a model with continuous batching on CPU until SIGTERM/SIGINT."""
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
    from relayrl.serving import uncollected_start

    # Imported once the settings are known good: the service pulls in torch, which takes seconds.
    with uncollected_start():
        from services.engine.server import serve

    asyncio.run(serve(settings))


if __name__ == "__main__":
    app()
