"""The reward service's Prometheus metrics (``relayrl_reward_*``)."""

from __future__ import annotations

from relayrl.metrics import ServiceMetrics

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class RewardMetrics:
    def __init__(self) -> None:
        self.registry = ServiceMetrics("reward")
        m = self.registry
        self.requests = m.counter("requests", "/score requests answered, by HTTP status code.", "total", ("code",))
        self.items_scored = m.counter("items_scored", "Items scored (one score each).", "total")
        self.forward_passes = m.counter("forward_passes", "Batched forward passes (or judge generations).", "total")
        self.batch_size = m.histogram(
            "batch_size", "Sequences scored in one forward pass.", unit="items", buckets=_BATCH_BUCKETS
        )
        self.request_latency = m.histogram("request_latency", "Seconds from a /score request to its answer.")
        self.forward_latency = m.histogram("forward_latency", "Seconds of one batched forward pass.")
        self.queue_wait = m.histogram("queue_wait", "Seconds an item waited for its batch to start.")
        self.pending_items = m.gauge("pending_items", "Items waiting for a batch.")
        self.errors = m.counter(
            "errors",
            "Failed /score requests: bad_request (4xx) or model (the forward pass raised).",
            "total",
            ("kind",),
        )
        self.unparsed_verdicts = m.counter(
            "unparsed_verdicts", "Judge outputs without a verdict (scored judge_unparsed_score).", "total"
        )
        self.model_loaded = m.gauge("model_loaded", "1 once the model is loaded and /readyz answers 200.")
