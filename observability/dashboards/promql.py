"""PromQL snippets the dashboards share, and the panel of summed counter rates built from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grafana_foundation_sdk.builders import timeseries

from observability.dashboards.common import Query, timeseries_panel

RATE_WINDOW = "$__rate_interval"


def counter_rate(series: str, selector: str = "") -> str:
    """Per-second increase of a monotonic total (a counter, or a gauge holding a running total)."""
    return f"rate({series}{selector}[{RATE_WINDOW}])"


def total_rate(series: str, legend: str = "") -> Query:
    """Per-second increase of a counter, summed over every target."""
    return Query(f"sum({counter_rate(series)})", legend)


def rates_panel(title: str, description: str, rates: Mapping[str, str]) -> timeseries.Panel:
    """Events per second: one series per legend → counter, each summed over every target."""
    return timeseries_panel(
        title, description, [total_rate(series, legend) for legend, series in rates.items()], unit="ops"
    )


def per_instance(aggregation: str, expr: str) -> Query:
    """One series per scrape target (each replica is its own), legended by its instance."""
    return Query(f"{aggregation} by (instance) ({expr})", "{{instance}}")


def zero_if_absent(expr: str) -> str:
    """Shows 0 instead of "No data" when a labelled counter has no children yet (nothing failed)."""
    return f"({expr}) or vector(0)"


def quantiles(histogram: str, by: Sequence[str] = (), levels: Sequence[float] = (0.5, 0.95, 0.99)) -> list[Query]:
    """p50/p95/p99 of a histogram family (give the name ending in the unit, without ``_bucket``)."""
    group = ", ".join(("le", *by))
    legend_labels = "".join(f" {{{{{label}}}}}" for label in by)
    return [
        Query(
            f"histogram_quantile({level}, sum by ({group}) ({counter_rate(histogram + '_bucket')}))",
            f"p{round(level * 100)}{legend_labels}",
        )
        for level in levels
    ]


def latency_panel(title: str, description: str, histogram: str) -> timeseries.Panel:
    """p50/p95/p99 of a histogram in seconds."""
    return timeseries_panel(title, description, quantiles(histogram), unit="s")


# The busy-time counter only grows when a request starts or ends, so a window of a few minutes
# keeps one long generation from reading as idle.
ROLLOUT_IDLE_BY_INSTANCE = (
    "1 - clamp_max(sum by (instance) (rate(relayrl_rollout_generation_busy_seconds_total[5m])), 1)"
)
