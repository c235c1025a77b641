"""The defined-metric catalog reads the names the way prometheus_client exposes them."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from observability.catalog import defined_metrics, defined_series
from relayrl.metrics import ServiceMetrics

_METRICS_MODULE = """
from relayrl.metrics import ServiceMetrics

class M:
    def __init__(self):
        m = ServiceMetrics("demo")
        self.a = m.counter("syncs", "doc", "total")
        self.b = m.counter("bytes_sent", "doc", "bytes_total", labels=("transport",))
        self.c = m.gauge("depth", "doc", unit="groups")
        self.d = m.histogram("latency", "doc")
        self.e = m.histogram("length", "doc", unit="tokens")
        self.f = m.counter("errors", "doc")
        self.g = m.histogram("reward", "doc", unit="", buckets=(-1, 0, 1))
"""

_DYNAMIC_KEYS = """
from relayrl.metrics import ServiceMetrics, key_to_metric_name

SERVICE = "learner"

def gauge_for(key):
    return key_to_metric_name(SERVICE, key)
"""

_STEP = """
def step():
    return {"actor/pg_loss": 1.0, "critic/score/mean": 0.5, "not a key": 2}
"""


def _service(root: Path, name: str, files: dict[str, str]) -> None:
    package = root / name
    package.mkdir(parents=True)
    for file_name, text in files.items():
        (package / file_name).write_text(text)


def test_factory_calls_expand_like_prometheus_client(tmp_path: Path) -> None:
    _service(tmp_path, "demo", {"metrics.py": _METRICS_MODULE})
    series = defined_series(tmp_path)
    # The same definitions, registered for real, expose exactly these names.
    m = ServiceMetrics("demo")
    m.counter("syncs", "doc", "total").inc()
    m.counter("bytes_sent", "doc", "bytes_total", labels=("transport",)).labels("grpc").inc()
    m.gauge("depth", "doc", unit="groups").set(1)
    m.histogram("latency", "doc").observe(0.1)
    m.histogram("length", "doc", unit="tokens").observe(3)
    m.counter("errors", "doc").inc()
    m.histogram("reward", "doc", unit="", buckets=(-1, 0, 1)).observe(0.5)
    exposed = {
        line.split("{")[0].split(" ")[0]
        for line in generate_latest(m.registry).decode().splitlines()
        if line and not line.startswith("#") and not line.split("{")[0].split(" ")[0].endswith("_created")
    }
    assert series == exposed


def test_keys_recorded_at_run_time_count_for_their_service_only(tmp_path: Path) -> None:
    _service(tmp_path, "learner", {"telemetry.py": _DYNAMIC_KEYS, "step.py": _STEP})
    _service(tmp_path, "other", {"step.py": _STEP})
    names = {m.name for m in defined_metrics(tmp_path)}
    assert names == {"relayrl_learner_actor_pg_loss", "relayrl_learner_critic_score_mean"}


def test_the_repository_services_define_metrics_for_every_service() -> None:
    services = {m.name.split("_")[1] for m in defined_metrics()}
    assert {"queue", "rollout", "trainer", "paramsync", "engine"} <= services
