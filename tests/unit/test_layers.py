"""The import graph keeps its layers: core (``relayrl``) → ``services`` → ``commands``, and no cycles.

The shared core is what every service builds on, so it imports no service and no command; a
service never reaches up into the commands that compose services (not even by starting one as
``python -m``); and no two services import each other. Imports inside functions count: they
are edges too.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("relayrl", "services", "commands")
ABOVE_SERVICES = ("commands",)
GENERATED = ("relayrl.v1",)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The known modules ``module`` imports, at any depth of its code, relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            # ``from pkg import mod`` is an edge to ``pkg.mod`` where that is a module, else to ``pkg``.
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin for a in node.names]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` also runs ``a`` and ``a.b``; the deepest known module is the edge.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    files = {module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    files = {name: path for name, path in files.items() if not _within(name, GENERATED)}
    known = set(files)
    return {name: imports_of(path.read_text(), name, path.name == "__init__.py", known) for name, path in files.items()}


def layer(module: str) -> int:
    if _within(module, ABOVE_SERVICES):
        return 2
    if _within(module, ("services",)):
        return 1
    return 0


def service_of(module: str) -> str | None:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "services" and len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def service_cycles(graph: dict[str, set[str]]) -> list[str]:
    between: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for b in targets:
            sa, sb = service_of(a), service_of(b)
            if sa and sb and sa != sb:
                between[sa].add(sb)
    return sorted(f"{a} <-> {b}" for a in between for b in between[a] if a < b and a in between.get(b, set()))


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_the_graph_sees_the_tree(graph: dict[str, set[str]]) -> None:
    assert "relayrl.retry" in graph and "services.trainer.feed" in graph
    assert "relayrl.retry" in graph["services.trainer.feed"]


def test_no_layer_imports_a_higher_one(graph: dict[str, set[str]]) -> None:
    assert upward_imports(graph) == []


def test_the_core_imports_no_service_and_no_command(graph: dict[str, set[str]]) -> None:
    core = {a: {b for b in targets if layer(b) > 0} for a, targets in graph.items() if layer(a) == 0}
    assert {a: b for a, b in core.items() if b} == {}


def test_no_service_starts_a_command_as_a_module() -> None:
    starts = re.compile(r"""["']-m["']\s*,\s*["']commands[.'"]""")
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "services").rglob("*.py") if starts.search(p.read_text())]
    assert found == []


def test_no_two_services_import_each_other(graph: dict[str, set[str]]) -> None:
    assert service_cycles(graph) == []


def test_no_import_cycles_between_modules(graph: dict[str, set[str]]) -> None:
    assert module_cycles(graph) == []


def test_the_checks_catch_what_they_forbid(tmp_path: Path) -> None:
    sources = {
        "relayrl/__init__.py": "",
        "relayrl/core.py": "def f():\n    from services.a import thing\n",
        "commands/stack/__init__.py": "",
        "services/a/__init__.py": "",
        "services/a/thing.py": "from services.b import other\nfrom commands.stack import run\n",
        "services/b/__init__.py": "",
        "services/b/other.py": "import services.a.thing\n",
        "commands/stack/run.py": "",
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = import_graph(tmp_path)
    assert upward_imports(g) == [
        "relayrl.core -> services.a.thing",
        "services.a.thing -> commands.stack.run",
    ]
    assert service_cycles(g) == ["services.a <-> services.b"]
    assert module_cycles(g) == [["services.a.thing", "services.b.other"]]
