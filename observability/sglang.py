"""The SGLang metric families RelayRL's dashboards read, as SGLang defines them.

SGLang registers these in ``python/sglang/srt/metrics/collector.py`` (``SchedulerMetricsCollector``
and ``TokenizerMetricsCollector``), served on the engine's ``/metrics`` with ``--enable-metrics``.
They are not defined anywhere in RelayRL, so the dashboard checks accept exactly these.
"""

from __future__ import annotations

# family name → kind
SGLANG_METRICS: dict[str, str] = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
}


def sglang_series() -> set[str]:
    series: set[str] = set()
    for name, kind in SGLANG_METRICS.items():
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        series.update(name + suffix for suffix in suffixes)
    return series
