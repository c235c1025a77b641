"""Classes named by import path in a YAML file, as verl's tool and interaction configs name them."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml


def import_class(path: str) -> type:
    """``package.module.Class`` (verl's form) or ``package.module:Class``."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"class_name {path!r} is not 'package.module.Class'")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from exc
    if not isinstance(cls, type):
        raise ValueError(f"{path!r} is not a class")
    return cls


def read_yaml(path: str | Path, key: str) -> list[dict[str, Any]]:
    """The list under ``key`` of the YAML file at ``path``."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    entries = (data or {}).get(key) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path}: expected a list of mappings under {key!r}")
    return entries
