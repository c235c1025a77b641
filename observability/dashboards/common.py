"""Building blocks shared by every dashboard: the datasource variable, panel helpers, layout.

Every panel queries the datasource chosen in the ``datasource`` template variable (type
prometheus), so the JSON imports as is, without Grafana's ``${DS_...}`` input prompts.
Rate windows use Grafana's ``$__rate_interval`` so they stay valid at any scrape interval.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
)
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
TAG = "relayrl"
# Grafana's full width is 24 grid columns.
GRID_WIDTH = 24


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a panel and the legend of its series."""

    expr: str
    legend: str = ""


def _targets(queries: Sequence[Query]) -> list[prometheus.Dataquery]:
    targets = []
    for index, query in enumerate(queries):
        target = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + index)).datasource(DATASOURCE).range()
        if query.legend:
            target = target.legend_format(query.legend)
        targets.append(target)
    return targets


Panel = TypeVar("Panel", timeseries.Panel, stat.Panel)


def _framed(
    panel: Panel, title: str, description: str, queries: Sequence[Query], unit: str, width: int, height: int
) -> Panel:
    """What every panel has: its text, the datasource and queries, the unit and the place it takes."""
    return (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .span(width)
        .height(height)
    )


def timeseries_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str = "short",
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
    bars: bool = False,
    min_value: float | None = None,
) -> timeseries.Panel:
    panel = (
        _framed(timeseries.Panel(), title, description, queries, unit, width, height)
        .line_width(1)
        .fill_opacity(10)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(StackingMode.NORMAL))
    if bars:
        panel = panel.draw_style(GraphDrawStyle.BARS).fill_opacity(60)
    if min_value is not None:
        panel = panel.min(min_value)
    return panel


def stat_panel(
    title: str, description: str, queries: Sequence[Query], unit: str = "short", width: int = 4, height: int = 4
) -> stat.Panel:
    return (
        _framed(stat.Panel(), title, description, queries, unit, width, height)
        # The latest value, big, with a sparkline of the time range behind it.
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .graph_mode(BigValueGraphMode.AREA)
        .color_mode(BigValueColorMode.VALUE)
    )


class Board:
    """A dashboard under construction: numbers panels in order so ids are stable across runs."""

    def __init__(self, uid: str, title: str, description: str, tags: Sequence[str] = ()) -> None:
        self._next_id = 1
        self._builder = (
            dashboard.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags([TAG, *tags])
            .editable()
            .tooltip(DashboardCursorSync.CROSSHAIR)
            .refresh("30s")
            .time("now-1h", "now")
            .timezone("browser")
            .with_variable(dashboard.DatasourceVariable(DATASOURCE_VARIABLE).label("Data source").type("prometheus"))
            .link(
                dashboard.DashboardLink("RelayRL")
                .type("dashboards")
                .tags([TAG])
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
            )
        )

    def row(self, title: str) -> Board:
        self._builder = self._builder.with_row(dashboard.Row(title).id(self._take_id()))
        return self

    def add(self, *panels: timeseries.Panel | stat.Panel) -> Board:
        for panel in panels:
            self._builder = self._builder.with_panel(panel.id(self._take_id()))
        return self

    def build(self) -> dashboard.Dashboard:
        return self._builder

    def _take_id(self) -> int:
        taken = self._next_id
        self._next_id += 1
        return taken


def to_json(board: dashboard.Dashboard) -> str:
    """The dashboard as Grafana JSON, with sorted keys so regeneration is byte-for-byte stable."""
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
