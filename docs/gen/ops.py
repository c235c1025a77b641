"""The Operate page's lists of dashboards and alerts, read from the files the chart ships.

A dashboard's image (``docs/figures/dashboard-<name>.png``, drawn from a run by
``python -m docs.gen.dashboards``, which needs a run and so is not part of ``python -m docs.gen``)
is embedded under its panel table when the file exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from docs.gen.figures import FIGURES
from docs.gen.settings_ref import cell

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "deploy" / "helm" / "relayrl" / "dashboards"
ALERTS = ROOT / "observability" / "alerts" / "relayrl-rules.yaml"
CAPTION = (
    "*Rendered by `python -m docs.gen.dashboards` from this dashboard's own queries against the Prometheus"
    " of a demo run (`relayrl up --monitor`); not a Grafana screenshot.*"
)


def image_of(dashboard: Path) -> Path:
    """``relayrl-overview.json`` -> ``docs/figures/dashboard-overview.png``."""
    return FIGURES / f"dashboard-{dashboard.stem.removeprefix('relayrl-')}.png"


def dashboards(page: Path) -> str:
    """One section per dashboard: its description, then each row's panels with what they show."""
    parts = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        # The JSON lives outside the site, so it is named, not linked.
        lines = [f"**{board['title']}** (`uid: {board['uid']}`, `deploy/helm/relayrl/dashboards/{path.name}`)."]
        if board.get("description"):
            lines[0] += f" {board['description']}"
        lines += ["", "| row | panel | shows |", "| --- | --- | --- |"]
        row = ""
        for panel in board.get("panels", []):
            if panel.get("type") == "row":
                row = panel.get("title", "")
                continue
            lines.append(f"| {cell(row)} | {cell(panel.get('title', ''))} | {cell(panel.get('description', ''))} |")
        image = image_of(path)
        if image.is_file():
            link = Path(os.path.relpath(image, page.parent)).as_posix()
            lines += ["", f"![{board['title']}, rendered from a demo run]({link})", "", CAPTION]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def alerts(page: Path) -> str:
    rules = yaml.safe_load(ALERTS.read_text())
    lines = ["| alert | for | severity | meaning |", "| --- | --- | --- | --- |"]
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            notes = rule.get("annotations", {})
            meaning = f"{notes.get('summary', '')}. {notes.get('description', '')}".strip(". ")
            lines.append(
                f"| `{rule['alert']}` | {rule.get('for', '')} | {rule.get('labels', {}).get('severity', '')} |"
                f" {cell(meaning)} |"
            )
    return "\n".join(lines) + "\n"
