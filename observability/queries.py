"""Every PromQL expression the dashboards and alert rules run, and the series each names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from observability.alerts.chart import RULES_FILE

# RelayRL's series all start with relayrl_ and SGLang's with sglang:, so a name is easy to spot
# without a PromQL parser (label names and functions never start with either).
_SERIES = re.compile(r"\b(relayrl_[a-zA-Z0-9_]+|sglang:[a-zA-Z0-9_:]+)")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # dashboard uid
    panel: str  # panel title
    ref_id: str
    expr: str


@dataclass(frozen=True)
class AlertRule:
    group: str
    alert: str
    expr: str


def panels(board: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every non-row panel of a dashboard, including panels nested in collapsed rows."""
    for panel in board.get("panels", []):
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


def dashboard_queries(board: Mapping[str, Any]) -> list[PanelQuery]:
    return [
        PanelQuery(board["uid"], panel["title"], target["refId"], target["expr"])
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


def load_dashboards(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def alert_rules(rules_file: Path = RULES_FILE) -> list[AlertRule]:
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    return [
        AlertRule(group["name"], rule.get("alert") or rule["record"], rule["expr"].strip())
        for group in groups
        for rule in group["rules"]
    ]


def referenced_series(expr: str) -> set[str]:
    return set(_SERIES.findall(expr))
