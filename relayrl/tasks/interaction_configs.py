"""The interaction configs shipped with the built-in multi-turn tasks.

Wherever an interaction config's path is accepted (``rollout.multi_turn_interaction_config_path``),
``builtin:<task>`` names the one of that task, as ``dataset: builtin:<task>`` names its rows: a
recipe then finds it in the installed package, from any working directory and wherever the recipe
file was copied to.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_PREFIX = "builtin:"
# Each file sits beside its task's module and ships as package data (pyproject.toml).
INTERACTION_CONFIGS = {"guess": "guess_interaction.yaml"}


def is_builtin(value: str | Path) -> bool:
    return str(value).startswith(BUILTIN_PREFIX)


def interaction_config_file(value: str | Path) -> Path:
    """The file ``value`` names: ``builtin:<task>`` is that task's shipped config, anything else a path."""
    if not is_builtin(value):
        return Path(value)
    name = str(value).removeprefix(BUILTIN_PREFIX)
    if name not in INTERACTION_CONFIGS:
        known = ", ".join(BUILTIN_PREFIX + task for task in INTERACTION_CONFIGS)
        raise ValueError(f"{value!r} is not a built-in interaction config; there is {known}")
    return Path(__file__).with_name(INTERACTION_CONFIGS[name])
