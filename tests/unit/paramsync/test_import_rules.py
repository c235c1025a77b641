"""Paramsync's import rules (issue #18 item 5): it imports nothing from the rollout service (the
rollout uses paramsync's client, never the other way) nor from the engine (the engine takes the
receiving end of the ``torch_dist`` channel from paramsync, and paramsync reaches engines over
SGLang's HTTP API only), and the two discovery backends do not import each other (each stands
alone; ``endpoints.py`` holds what they share)."""

from __future__ import annotations

import ast
from pathlib import Path

PARAMSYNC = Path(__file__).resolve().parents[3] / "services" / "paramsync"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-local imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _offenders(prefix: str) -> dict[str, list[str]]:
    offenders = {
        str(path.relative_to(PARAMSYNC)): sorted(n for n in _imports(path) if n.startswith(prefix))
        for path in PARAMSYNC.rglob("*.py")
    }
    assert len(offenders) > 20  # the walk found the package
    return {k: v for k, v in offenders.items() if v}


def test_paramsync_imports_nothing_from_the_rollout() -> None:
    assert _offenders("services.rollout") == {}


def test_paramsync_imports_nothing_from_the_engine() -> None:
    assert _offenders("services.engine") == {}


def test_the_discovery_backends_do_not_import_each_other() -> None:
    static, k8s = PARAMSYNC / "discovery.py", PARAMSYNC / "discovery_k8s.py"
    assert not {n for n in _imports(static) if "discovery_k8s" in n}
    assert not {
        n
        for n in _imports(k8s)
        if n.startswith("services.paramsync.discovery") and n != "services.paramsync.discovery_k8s"
    }
