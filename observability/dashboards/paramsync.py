"""Paramsync dashboard: versions held, per-replica version and lag, sync and publish durations."""

from __future__ import annotations

from observability.dashboards.common import Board, Query, stat_panel, timeseries_panel
from observability.dashboards.promql import (
    counter_rate,
    latency_panel,
    rates_panel,
    total_rate,
    zero_if_absent,
)

UID = "relayrl-paramsync"


def build() -> Board:
    board = Board(UID, "RelayRL / Paramsync", "Weight versions and their broadcast to rollout replicas.", ["paramsync"])
    board.row("Versions").add(
        stat_panel("Latest version", "Newest complete version held.", [Query("max(relayrl_paramsync_latest_version)")]),
        stat_panel(
            "Replicas lagging",
            "Replicas whose sync retries are exhausted.",
            [Query("sum(relayrl_paramsync_replicas_lagging)")],
        ),
        stat_panel(
            "Max replica lag",
            "Versions the furthest-behind replica trails the latest.",
            [Query("max(relayrl_paramsync_replica_lag_versions)")],
        ),
        stat_panel(
            "Versions published",
            "Versions accepted from the trainer since paramsync started.",
            [Query("sum(relayrl_paramsync_versions_published_total)")],
        ),
    )
    board.add(
        timeseries_panel(
            "Version per replica",
            "The version each rollout replica serves, against the latest held.",
            [
                Query("max(relayrl_paramsync_latest_version)", "latest"),
                Query("max by (replica) (relayrl_paramsync_replica_version)", "{{replica}}"),
            ],
        ),
        timeseries_panel(
            "Lag per replica",
            "latest − replica version; above 1 for long means the replica cannot keep up or its syncs fail.",
            [Query("max by (replica) (relayrl_paramsync_replica_lag_versions)", "{{replica}}")],
            min_value=0,
        ),
    )
    board.row("Sync").add(
        latency_panel(
            "Sync duration",
            "From announcement to the version live in a replica's engine.",
            "relayrl_paramsync_sync_duration_seconds",
        ),
        latency_panel(
            "Publish duration",
            "From the trainer's manifest to the last verified byte of its upload.",
            "relayrl_paramsync_publish_duration_seconds",
        ),
        rates_panel(
            "Syncs and publishes",
            "Versions loaded by replicas and versions published by the trainer, per second.",
            {
                "replica syncs": "relayrl_paramsync_syncs_total",
                "published": "relayrl_paramsync_versions_published_total",
            },
        ),
        timeseries_panel(
            "Failures by reason",
            "Failed replica syncs and refused uploads per second.",
            [
                Query(
                    zero_if_absent(f"sum by (reason) ({counter_rate('relayrl_paramsync_sync_failures_total')})"),
                    "sync {{reason}}",
                ),
                Query(
                    zero_if_absent(f"sum by (reason) ({counter_rate('relayrl_paramsync_publish_failures_total')})"),
                    "publish {{reason}}",
                ),
            ],
            unit="ops",
        ),
        timeseries_panel(
            "Weight bandwidth",
            "Bytes per second received from the trainer (of which copied from its memory files on paramsync's"
            " host) and sent to replicas, by transport. Replicas on paramsync's host map versions: nothing is sent.",
            [
                total_rate("relayrl_paramsync_bytes_received_bytes_total", "received"),
                total_rate("relayrl_paramsync_bytes_copied_bytes_total", "copied from the trainer's memory"),
                Query(
                    zero_if_absent(f"sum by (transport) ({counter_rate('relayrl_paramsync_bytes_sent_bytes_total')})"),
                    "sent {{transport}}",
                ),
            ],
            unit="Bps",
        ),
    )
    return board
