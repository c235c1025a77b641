"""PromQL snippets the dashboards share."""

from __future__ import annotations

from collections.abc import Sequence

from observability.dashboards.common import Query

RATE_WINDOW = "$__rate_interval"


def counter_rate(series: str, selector: str = "") -> str:
    """Per-second increase of a monotonic total (a counter, or a gauge holding a running total)."""
    return f"rate({series}{selector}[{RATE_WINDOW}])"


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


# The busy-time counter only grows when a request starts or ends, so a window of a few minutes
# keeps one long generation from reading as idle.
ROLLOUT_IDLE_BY_INSTANCE = (
    "1 - clamp_max(sum by (instance) (rate(relayrl_rollout_generation_busy_seconds_total[5m])), 1)"
)
