"""Which Prometheus series RelayRL's services define, read from their source code.

Dashboards and alerts must only query series that some service exports. Rather than keep
a list by hand, this module parses every module under ``services/`` (no imports, so no
torch) and collects each ``ServiceMetrics`` factory call with literal arguments
(``m.counter("syncs", "...", "total")``).

A service that turns metric keys into gauges at run time (the trainer records verl's
``actor/pg_loss`` through ``key_to_metric_name(SERVICE, key)``) defines one gauge per key it
records; for such a service every verl-style key literal in its package (``"actor/pg_loss"``,
``"timing/step_s"``) counts as defined.

Names are expanded the way prometheus_client exposes them: counters end in ``_total``,
histograms add ``_bucket``, ``_sum`` and ``_count``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from relayrl.metrics import key_to_metric_name, metric_name

SERVICES_DIR = Path(__file__).resolve().parent.parent / "services"

# ServiceMetrics' factories and the unit each uses when none is given.
_FACTORY_DEFAULT_UNIT = {"counter": "", "gauge": "", "histogram": "seconds"}
_UNIT_POSITION = 2  # counter(what, doc, unit, labels)
# verl's metric keys: lower-case path segments joined by "/" (actor/pg_loss, critic/score/mean).
_VERL_KEY = re.compile(r"^[a-z][a-z0-9_]*(/[a-z0-9_@.]+)+$")


@dataclass(frozen=True)
class DefinedMetric:
    name: str  # the metric family name as prometheus_client registers it
    kind: str  # counter, gauge, histogram or histogram_without_sum
    source: str  # file that defines it, relative to the repository

    def series(self) -> tuple[str, ...]:
        """Names of the series this family exposes on /metrics."""
        if self.kind == "counter":
            base = self.name.removesuffix("_total")
            return (f"{base}_total",)
        if self.kind == "histogram":
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        if self.kind == "histogram_without_sum":
            return (f"{self.name}_bucket", f"{self.name}_count")
        return (self.name,)


def _literal(node: ast.AST | None, constants: dict[str, object] | None = None) -> object:
    """The value of a literal, or of a name bound to one at module level; None otherwise."""
    if node is None:
        return None
    if isinstance(node, ast.Name) and constants is not None:
        return constants.get(node.id)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None


def _module_constants(tree: ast.Module) -> dict[str, object]:
    constants: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _literal(node.value)
            if isinstance(value, str):
                constants[node.targets[0].id] = value
    return constants


def _call_name(call: ast.Call) -> str | None:
    return getattr(call.func, "id", getattr(call.func, "attr", None))


def _service_of(tree: ast.AST, package: str, constants: dict[str, object]) -> str:
    """The service a file's metrics belong to: its ``ServiceMetrics("<name>")``, else its package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _call_name(node) == "ServiceMetrics" and node.args:
            name = _literal(node.args[0], constants)
            if isinstance(name, str):
                return name
    return package


def _factory_metric(call: ast.Call, service: str, source: str) -> DefinedMetric | None:
    kind = _call_name(call)
    if kind not in _FACTORY_DEFAULT_UNIT or not call.args:
        return None
    what = _literal(call.args[0])
    if not isinstance(what, str):
        return None
    unit_node = call.args[_UNIT_POSITION] if len(call.args) > _UNIT_POSITION else None
    for keyword in call.keywords:
        if keyword.arg == "unit":
            unit_node = keyword.value
    unit = _FACTORY_DEFAULT_UNIT[kind] if unit_node is None else _literal(unit_node)
    if not isinstance(unit, str):
        return None
    buckets = next((_literal(k.value) for k in call.keywords if k.arg == "buckets"), None)
    # prometheus_client drops _sum from a histogram with a negative bucket (the sum could fall).
    if kind == "histogram" and isinstance(buckets, list | tuple) and any(b < 0 for b in buckets):
        kind = "histogram_without_sum"
    return DefinedMetric(metric_name(service, what, unit), kind, source)


@dataclass
class _FileScan:
    metrics: list[DefinedMetric]
    # Services whose metric keys this file turns into gauges at run time.
    dynamic_key_services: set[str]
    verl_keys: set[str]


def _scan(path: Path, services_dir: Path) -> _FileScan:
    tree = ast.parse(path.read_text(), filename=str(path))
    constants = _module_constants(tree)
    service = _service_of(tree, path.relative_to(services_dir).parts[0], constants)
    source = str(path.relative_to(services_dir.parent))
    scan = _FileScan([], set(), set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _VERL_KEY.match(node.value):
            scan.verl_keys.add(node.value)
        if not isinstance(node, ast.Call):
            continue
        if _call_name(node) == "key_to_metric_name" and len(node.args) == 2:
            key_service, key = (_literal(arg, constants) for arg in node.args)
            if isinstance(key_service, str) and isinstance(key, str):
                scan.metrics.append(DefinedMetric(key_to_metric_name(key_service, key), "gauge", source))
            elif isinstance(key_service, str):
                scan.dynamic_key_services.add(key_service)
            continue
        found = _factory_metric(node, service, source)
        if found is not None:
            scan.metrics.append(found)
    return scan


def defined_metrics(services_dir: Path = SERVICES_DIR) -> list[DefinedMetric]:
    """Every metric family the services define, sorted by name."""
    scans = {path: _scan(path, services_dir) for path in sorted(services_dir.rglob("*.py"))}
    found = {m.name: m for scan in scans.values() for m in scan.metrics}
    for service in {s for scan in scans.values() for s in scan.dynamic_key_services}:
        for path, scan in scans.items():
            if path.relative_to(services_dir).parts[0] != service:
                continue
            for key in scan.verl_keys:
                name = key_to_metric_name(service, key)
                found.setdefault(name, DefinedMetric(name, "gauge", str(path.relative_to(services_dir.parent))))
    return sorted(found.values(), key=lambda m: m.name)


def defined_series(services_dir: Path = SERVICES_DIR) -> set[str]:
    """Every series name the services expose on /metrics."""
    return {series for metric in defined_metrics(services_dir) for series in metric.series()}
