"""Prometheus helpers: one registry per service, names ``relayrl_<service>_<what>_<unit>``.

Training metrics keep verl's keys (``actor/pg_loss``); :func:`key_to_metric_name` maps them
onto Prometheus names (``relayrl_trainer_actor_pg_loss``) so logs, ``metrics.jsonl`` and
Prometheus use the same vocabulary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds; spans sub-millisecond Redis calls to multi-minute generations.
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(service: str, what: str, unit: str = "") -> str:
    parts = ["relayrl", service, what] + ([unit] if unit else [])
    return "_".join(parts)


def key_to_metric_name(service: str, key: str) -> str:
    """``("trainer", "actor/pg_loss")`` → ``relayrl_trainer_actor_pg_loss``; a key under the
    service's own name is not named twice: ``trainer/global_steps`` → ``relayrl_trainer_global_steps``."""
    what = _INVALID.sub("_", key).strip("_").lower()
    return metric_name(service, what.removeprefix(f"{service}_"))


class ServiceMetrics:
    """A service's private registry plus factories that enforce the naming scheme."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()

    def counter(self, what: str, doc: str, unit: str = "", labels: Sequence[str] = ()) -> Counter:
        return Counter(metric_name(self.service, what, unit), doc, labelnames=labels, registry=self.registry)

    def gauge(self, what: str, doc: str, unit: str = "", labels: Sequence[str] = ()) -> Gauge:
        return Gauge(metric_name(self.service, what, unit), doc, labelnames=labels, registry=self.registry)

    def histogram(
        self,
        what: str,
        doc: str,
        unit: str = "seconds",
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
    ) -> Histogram:
        return Histogram(
            metric_name(self.service, what, unit), doc, labelnames=labels, buckets=buckets, registry=self.registry
        )

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for ``/metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
