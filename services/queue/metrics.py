"""The queue's Prometheus metrics, named with the words verl users know (queue_size,
total_produced, total_consumed, dropped_samples, avg/max_sample_age, stale_samples_ratio).

Totals live in Redis (they survive a restart of the service), so they are gauges refreshed
from the stores every ``stats_refresh_s``; latencies are histograms observed per RPC.
"""

from __future__ import annotations

from relayrl.metrics import ServiceMetrics
from services.queue.stats import PromptQueueStats
from services.queue.trajectories import TrajectoryStats


class QueueMetrics:
    def __init__(self) -> None:
        m = ServiceMetrics("queue")
        self.registry = m
        self.queue_size = m.gauge("queue_size", "Groups accepted and not yet delivered.", unit="groups")
        self.pending = m.gauge("pending", "Groups delivered and not yet acknowledged.", unit="groups")
        self.capacity = m.gauge("capacity", "Most groups held (queued + pending).", unit="groups")
        self.total_produced = m.gauge("total_produced", "Groups accepted since the run began.", unit="groups")
        self.total_consumed = m.gauge("total_consumed", "Groups acknowledged by the trainer.", unit="groups")
        self.dropped = m.gauge(
            "dropped_samples",
            "Groups dropped since the run began, by reason (stale, missing_version, rolled_back, malformed,"
            " max_deliveries).",
            unit="groups",
            labels=("reason",),
        )
        self.duplicates = m.gauge(
            "duplicates",
            "Groups not stored since the run began because their prompt was finished already (generated twice,"
            " e.g. after a lost push reply); never counted as a drop.",
            unit="groups",
        )
        self.consumer_lag = m.gauge("consumer_lag", "Entries the trainer's group has not read yet.", unit="groups")
        self.stale_ratio = m.gauge("stale_samples_ratio", "Stale drops / (deliveries + stale drops).")
        self.avg_age_versions = m.gauge("avg_sample_age", "Mean age at delivery, recent window.", unit="versions")
        self.max_age_versions = m.gauge("max_sample_age", "Max age at delivery, recent window.", unit="versions")
        self.avg_age_s = m.gauge("avg_sample_age", "Mean time from push to delivery, recent window.", unit="seconds")
        self.max_age_s = m.gauge("max_sample_age", "Max time from push to delivery, recent window.", unit="seconds")
        self.push_latency = m.histogram("push_latency", "Push RPC latency, including waits for capacity.")
        self.pull_latency = m.histogram("pull_latency", "Pull RPC latency, including blocking for groups.")
        self.prompts_waiting = m.gauge("prompts_waiting", "Prompts released and not leased.", unit="prompts")
        self.prompts_leased = m.gauge("prompts_leased", "Prompts leased and not completed.", unit="prompts")
        self.prompts_reissued = m.gauge(
            "prompts_reissued", "Expired leases re-issued since the run began.", unit="prompts"
        )

    def update(self, traj: TrajectoryStats, prompts: PromptQueueStats) -> None:
        self.queue_size.set(traj.queue_size)
        self.pending.set(traj.pending)
        self.capacity.set(traj.capacity)
        self.total_produced.set(traj.total_produced)
        self.total_consumed.set(traj.total_consumed)
        for reason, count in traj.dropped_by_reason.items():
            self.dropped.labels(reason=reason).set(count)
        self.duplicates.set(traj.duplicates)
        self.consumer_lag.set(traj.queue_size)
        self.stale_ratio.set(traj.stale_samples_ratio)
        self.avg_age_versions.set(traj.ages.avg_versions)
        self.max_age_versions.set(traj.ages.max_versions)
        self.avg_age_s.set(traj.ages.avg_s)
        self.max_age_s.set(traj.ages.max_s)
        self.prompts_waiting.set(prompts.waiting)
        self.prompts_leased.set(prompts.leased)
        self.prompts_reissued.set(prompts.total_reissued)
