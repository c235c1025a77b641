"""``relayrl model``: create and inspect models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Create and inspect models.", no_args_is_help=True)


@app.command("init-tiny")
def init_tiny_command(
    directory: Annotated[Path, typer.Argument(help="Directory to write the model and tokenizer into.")],
    preset: Annotated[
        str,
        typer.Option(
            help="Size: tiny (~260 k parameters), small (~13 M) or base (Qwen2.5-0.5B's shape, ~494 M);"
            " tiny-rm: tiny as a one-label sequence-classification reward model (for `relayrl reward serve`)."
        ),
    ] = "tiny",
    arch: Annotated[str, typer.Option(help="Hugging Face architecture: qwen2 or llama.")] = "qwen2",
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    dtype: Annotated[
        str, typer.Option(help="Weights' dtype on disk: float32 or bfloat16 (half the bytes, e.g. ~1 GB for base).")
    ] = "float32",
) -> None:
    """Write a randomly initialised causal LM of a preset size and its byte-level tokenizer in Hugging Face format."""
    from relayrl.models.tiny import init_tiny, preset_spec

    try:
        spec = preset_spec(preset, arch=arch, seed=seed, dtype=dtype)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    init_tiny(directory, spec)
    typer.echo(f"wrote {preset} {arch} model ({dtype}) to {directory}")


@app.command("info")
def info_command(directory: Annotated[Path, typer.Argument(help="A Hugging Face model directory.")]) -> None:
    """Print the architecture, parameter count, bytes per dtype, tokenizer and config of a model directory.

    Parameters are counted on the meta device: nothing of the weights is read or allocated.
    """
    from transformers import AutoConfig

    from relayrl.models.loading import check_model_dir, load_tokenizer
    from relayrl.models.tiny import count_parameters

    check_model_dir(directory)
    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    params = count_parameters(config)
    tokenizer = load_tokenizer(directory)
    arch = (config.architectures or [config.model_type])[0]
    typer.echo(f"{arch}: {params:,} parameters, vocab {config.vocab_size} (tokenizer {len(tokenizer)} tokens)")
    typer.echo(f"eos {tokenizer.eos_token!r}, stored as {config.dtype}")
    typer.echo(f"bytes: float32 {params * 4:,} ({params * 4 / 2**30:.2f} GiB), bfloat16 {params * 2:,}")
    typer.echo(json.dumps(config.to_diff_dict(), indent=2, sort_keys=True, default=str))
