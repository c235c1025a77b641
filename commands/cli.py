"""The ``relayrl`` command. Every sub-command module imports only typer at load time, so
``relayrl --help`` answers at once; heavy imports happen inside the commands."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperOption

# typer 0.29 labels every flag (even --help) "<bool>"; a flag takes no value, so show none. Other
# typer releases (a GPU image's own) have no such hook, and need no fix: leave them as they are.
_option_type_label = getattr(TyperOption, "display_type_rich", None)

if _option_type_label is not None:

    def _flag_without_type(self: TyperOption, ctx: object) -> str | None:
        return None if self.is_flag else _option_type_label(self, ctx)

    TyperOption.display_type_rich = _flag_without_type  # type: ignore[method-assign]

app = typer.Typer(
    help="RelayRL: fully asynchronous RL post-training for LLMs.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

# `relayrl <name> ...` → the Typer app named `app` in each module.
COMMAND_GROUPS: dict[str, str] = {
    "model": "relayrl.models.cli",
    "engine": "services.engine.cli",
    "rollout": "services.rollout.cli",
    "queue": "services.queue.cli",
    "paramsync": "services.paramsync.cli",
    "trainer": "services.trainer.cli",
    "reward": "services.reward.cli",
    "ctl": "commands.ctl.cli",
}

# `relayrl <name>` → a single command.
COMMANDS: dict[str, str] = {
    "up": "commands.stack.cli:up",
    "demo": "commands.stack.cli:demo",
    "chaos": "commands.stack.chaos.cli:chaos",
    "fuzz": "commands.fuzz.cli:fuzz",
    "check": "commands.stack.cli:check",
    "export": "commands.stack.cli:export",
    "sft": "services.trainer.sft.cli:sft",
    "replay": "commands.stack.replay:replay",
}

# `relayrl bench <name>` → a function that prints one JSON line of figures.
BENCHMARKS: dict[str, str] = {
    "queue": "services.queue.cli:bench",
    "rollout": "services.rollout.cli:bench",
    "paramsync": "services.paramsync.cli:bench",
    "trainer": "services.trainer.cli:bench",
    "reward": "services.reward.cli:bench",
    "e2e": "commands.stack.bench:bench",
    "weights": "commands.stack.bench_weights:bench",
    "learning": "commands.stack.bench_learning:bench",
    "compare": "commands.stack.compare:bench",
    "openai": "services.rollout.openai_bench:bench",
    "engine": "services.engine.cli:bench",
    "engine-host": "services.engine.host_bench:bench",
    "sampling": "services.engine.sampling_bench:bench",
    "staleness": "commands.stack.bench_staleness:bench",
    "checkpoint": "services.trainer.checkpoint_bench:bench",
    "logprobs": "services.trainer.logprob_bench:bench",
}

bench_app = typer.Typer(help="Benchmarks; each prints its figures, measured side by side in one run.")


def _load(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr or "app")


def _add(group: typer.Typer, name: str, function: Callable[..., Any]) -> None:
    # The command list shows the docstring's first paragraph, and rich keeps its line breaks, which
    # there fall mid-row; joined, rich wraps it to the terminal.
    summary = " ".join(inspect.cleandoc(function.__doc__ or "").split("\n\n")[0].split())
    group.command(name, short_help=summary or None)(function)


for _name, _module in COMMAND_GROUPS.items():
    _group = _load(_module)
    app.add_typer(_group, name=_name, help=_group.info.help)
for _name, _function in COMMANDS.items():
    _add(app, _name, _load(_function))
for _name, _function in BENCHMARKS.items():
    _add(bench_app, _name, _load(_function))
if BENCHMARKS:
    app.add_typer(bench_app, name="bench")


@app.command()
def version() -> None:
    """Print the RelayRL version."""
    from relayrl import __version__

    typer.echo(__version__)


def _version_flag(value: bool) -> None:
    if value:
        version()
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(
        False, "--version", callback=_version_flag, is_eager=True, help="Print the RelayRL version and exit."
    ),
) -> None:
    pass


def main() -> None:
    """The ``relayrl`` command: a feature whose optional extra is missing stops with its one line."""
    from relayrl.extras import MissingExtra

    try:
        app()
    except MissingExtra as missing:
        typer.echo(f"relayrl: {missing}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
