"""Paramsync's Prometheus metrics (``relayrl_paramsync_*``)."""

from __future__ import annotations

from relayrl.metrics import ServiceMetrics

# Weight syncs take from milliseconds (tiny models) to minutes (large ones over slow links).
SYNC_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ParamSyncMetrics:
    def __init__(self) -> None:
        self.service = ServiceMetrics("paramsync")
        m = self.service
        self.versions_published = m.counter("versions_published", "Versions accepted from the trainer.", "total")
        self.publish_failures = m.counter(
            "publish_failures", "Uploads refused or failed, by reason.", "total", labels=("reason",)
        )
        self.latest_version = m.gauge("latest_version", "Latest complete version held.")
        self.bytes_received = m.counter("bytes_received", "Weight bytes received from the trainer.", "bytes_total")
        self.bytes_copied = m.counter(
            "bytes_copied",
            "Weight bytes of uploads copied from the trainer's memory files on this host instead of received"
            " over a socket (also counted in bytes_received).",
            "bytes_total",
        )
        self.bytes_sent = m.counter(
            "bytes_sent", "Weight bytes sent to replicas, by transport.", "bytes_total", labels=("transport",)
        )
        self.publish_duration = m.histogram(
            "publish_duration", "Seconds from manifest to the last verified byte of an upload.", buckets=SYNC_BUCKETS_S
        )
        self.syncs = m.counter("syncs", "Versions a replica reported as loaded.", "total")
        self.sync_duration = m.histogram(
            "sync_duration",
            "Seconds from announcement to a version live in a replica's engine.",
            buckets=SYNC_BUCKETS_S,
        )
        self.sync_failures = m.counter("sync_failures", "Failed replica syncs, by reason.", "total", labels=("reason",))
        self.replica_version = m.gauge("replica_version", "Version each replica holds.", labels=("replica",))
        self.replica_lag = m.gauge(
            "replica_lag", "Versions each replica is behind the latest.", "versions", labels=("replica",)
        )
        self.replicas_lagging = m.gauge("replicas_lagging", "Replicas whose retries are exhausted.")
