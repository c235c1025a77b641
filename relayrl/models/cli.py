"""``relayrl model``: create and inspect models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Create and inspect models.", no_args_is_help=True)


@app.command("init-tiny")
def init_tiny_command(
    directory: Annotated[Path, typer.Argument(help="Directory to write the model and tokenizer into.")],
    arch: Annotated[str, typer.Option(help="Hugging Face architecture: qwen2 or llama.")] = "qwen2",
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    hidden_size: Annotated[int, typer.Option(help="Model width.")] = 64,
    num_layers: Annotated[int, typer.Option(help="Transformer blocks.")] = 4,
) -> None:
    """Write a tiny randomly initialised causal LM and its tokenizer in Hugging Face format."""
    if arch not in ("qwen2", "llama"):
        raise typer.BadParameter(f"unknown architecture {arch!r}; choose qwen2 or llama", param_hint="--arch")
    from relayrl.models.tiny import TinyModelSpec, init_tiny

    init_tiny(directory, TinyModelSpec(arch=arch, seed=seed, hidden_size=hidden_size, num_layers=num_layers))
    typer.echo(f"wrote tiny {arch} model to {directory}")


@app.command("info")
def info_command(directory: Annotated[Path, typer.Argument(help="A Hugging Face model directory.")]) -> None:
    """Print the architecture, parameter count and tokenizer of a model directory."""
    from relayrl.models.loading import load_causal_lm, load_tokenizer

    model = load_causal_lm(directory)
    tokenizer = load_tokenizer(directory)
    params = sum(p.numel() for p in model.parameters())
    typer.echo(f"{type(model).__name__}: {params:,} parameters, vocab {len(tokenizer)}, eos {tokenizer.eos_token!r}")
