"""Queue dashboard: depth against capacity, flow in and out, drops by reason, freshness, latency."""

from __future__ import annotations

from observability.dashboards.common import Board, Query, stat_panel, timeseries_panel
from observability.dashboards.promql import counter_rate, latency_panel, rates_panel, zero_if_absent

UID = "relayrl-queue"


def build() -> Board:
    board = Board(UID, "RelayRL / Queue", "The Redis Streams trajectory and prompt queues.", tags=["queue"])
    board.row("Depth").add(
        stat_panel("Queued groups", "Accepted and not yet delivered.", [Query("sum(relayrl_queue_queue_size_groups)")]),
        stat_panel("Pending groups", "Delivered, not yet acknowledged.", [Query("sum(relayrl_queue_pending_groups)")]),
        stat_panel(
            "Fill",
            "(queued + pending) / capacity: at 100% pushes wait (backpressure).",
            [Query(_FILL)],
            unit="percentunit",
        ),
        stat_panel("Capacity", "Most groups held (queued + pending).", [Query("sum(relayrl_queue_capacity_groups)")]),
        stat_panel("Unread entries", "Entries the trainer has not read yet.", [Query(_LAG)]),
        stat_panel("Stale ratio", "Stale drops / (deliveries + stale drops).", [Query(_STALE)], unit="percentunit"),
    )
    board.add(
        timeseries_panel(
            "Depth",
            "Groups queued and pending against capacity.",
            [
                Query("sum(relayrl_queue_queue_size_groups)", "queued"),
                Query("sum(relayrl_queue_pending_groups)", "pending"),
                Query("sum(relayrl_queue_capacity_groups)", "capacity"),
            ],
        ),
        timeseries_panel(
            "Prompts",
            "Prompt groups released by the trainer and waiting for a replica, and leased to one.",
            [
                Query("sum(relayrl_queue_prompts_waiting_prompts)", "waiting"),
                Query("sum(relayrl_queue_prompts_leased_prompts)", "leased"),
            ],
        ),
    )
    board.row("Flow").add(
        rates_panel(
            "Groups per second",
            "Accepted from rollout and acknowledged by the trainer.",
            {"produced": "relayrl_queue_total_produced_groups", "consumed": "relayrl_queue_total_consumed_groups"},
        ),
        timeseries_panel(
            "Drops by reason",
            "Groups dropped per second: stale (beyond η), malformed and max_deliveries go to the dead-letter stream.",
            [
                Query(
                    zero_if_absent(f"sum by (reason) ({counter_rate('relayrl_queue_dropped_samples_groups')})"),
                    "{{reason}}",
                )
            ],
            unit="ops",
            bars=True,
        ),
        rates_panel(
            "Re-issued prompt leases",
            "Expired leases handed to another replica per second (a replica died or stalled), and groups not"
            " stored because their prompt was answered already (generated twice, e.g. after a Redis restart).",
            {
                "re-issued": "relayrl_queue_prompts_reissued_prompts",
                "duplicates not stored": "relayrl_queue_duplicates_groups",
            },
        ),
        timeseries_panel(
            "Consumer lag",
            "Entries in the stream the trainer's consumer group has not read.",
            [Query(_LAG, "lag")],
        ),
    )
    board.row("Freshness").add(
        timeseries_panel(
            "Sample age at delivery (versions)",
            "Trainer version minus the group's start version, over a recent window; never above η.",
            [
                Query("max(relayrl_queue_avg_sample_age_versions)", "mean"),
                Query("max(relayrl_queue_max_sample_age_versions)", "max"),
            ],
            min_value=0,
        ),
        timeseries_panel(
            "Sample age at delivery (seconds)",
            "Time from push to delivery, over a recent window.",
            [
                Query("max(relayrl_queue_avg_sample_age_seconds)", "mean"),
                Query("max(relayrl_queue_max_sample_age_seconds)", "max"),
            ],
            unit="s",
        ),
    )
    board.row("Latency").add(
        latency_panel(
            "Push latency",
            "Push RPC latency, including waits for capacity.",
            "relayrl_queue_push_latency_seconds",
        ),
        latency_panel(
            "Pull latency",
            "Pull RPC latency, including blocking for groups.",
            "relayrl_queue_pull_latency_seconds",
        ),
    )
    return board


_FILL = (
    "(sum(relayrl_queue_queue_size_groups) + sum(relayrl_queue_pending_groups))"
    " / clamp_min(sum(relayrl_queue_capacity_groups), 1)"
)
_LAG = "sum(relayrl_queue_consumer_lag_groups)"
_STALE = "max(relayrl_queue_stale_samples_ratio)"
