"""Writes the generated observability files into the chart: ``python -m observability.build``
(``make dashboards``). ``--check`` writes nothing and exits 1 when a committed file is stale.

Outputs: one JSON file per dashboard in ``deploy/helm/relayrl/dashboards/`` and the
PrometheusRule template ``deploy/helm/relayrl/templates/prometheusrule.yaml``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from observability.alerts.chart import render_template
from observability.dashboards import overview, paramsync, queue, rollout, trainer
from observability.dashboards.common import Board, to_json

CHART_DIR = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "relayrl"
DASHBOARDS_DIR = CHART_DIR / "dashboards"
PROMETHEUS_RULE_TEMPLATE = CHART_DIR / "templates" / "prometheusrule.yaml"

# File name in the chart → builder. The names become ConfigMap names and keys, so they stay stable.
DASHBOARDS: dict[str, Callable[[], Board]] = {
    "relayrl-overview.json": overview.build,
    "relayrl-rollout.json": rollout.build,
    "relayrl-trainer.json": trainer.build,
    "relayrl-queue.json": queue.build,
    "relayrl-paramsync.json": paramsync.build,
}


def generated_files(chart_dir: Path = CHART_DIR) -> dict[Path, str]:
    """Path → the text a fresh generation writes there."""
    files = {chart_dir / "dashboards" / name: to_json(build().build()) for name, build in DASHBOARDS.items()}
    files[chart_dir / "templates" / "prometheusrule.yaml"] = render_template()
    return files


def stale_files(chart_dir: Path = CHART_DIR) -> list[Path]:
    """Generated files that are missing or differ from a fresh generation."""
    return [path for path, text in generated_files(chart_dir).items() if not path.is_file() or path.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chart", type=Path, default=CHART_DIR, help="the chart folder to write into")
    parser.add_argument("--check", action="store_true", help="only check the committed files are up to date")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.chart)
        for path in stale:
            print(f"{path} is out of date: run `make dashboards`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in generated_files(args.chart).items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
