"""What only some runs need is an optional extra of the package (pyproject.toml), not a dependency.

A GPU host installs the core alone (``make bundle`` ships no experiment tracker, Kubernetes client,
plotting or parquet library); the code that needs one imports it through :func:`require`, so a
missing package stops that feature with one line naming the extra that installs it.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """A feature's package is not installed; the message is one line naming the extra."""


def require(module: str, extra: str, feature: str) -> ModuleType:
    """``module``, imported; or :class:`MissingExtra` saying ``feature`` needs ``relayrl[extra]``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        package = module.partition(".")[0]
        if exc.name is None or exc.name.partition(".")[0] != package:
            raise  # the package is there but broken (one of its own imports failed): not ours to rename
        raise MissingExtra(
            f"{feature} needs {package}, which is not installed: pip install 'relayrl[{extra}]'"
        ) from None
