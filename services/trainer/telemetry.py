"""Training metrics under verl's keys, written to ``metrics.jsonl``, exported to Prometheus
as ``relayrl_trainer_<key>`` gauges (``actor/pg_loss`` → ``relayrl_trainer_actor_pg_loss``) and
handed to the experiment trackers of the ``logger`` setting (:mod:`services.trainer.loggers`)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import Gauge

from relayrl.metrics import ServiceMetrics, key_to_metric_name
from services.trainer.group_fate import GroupFates
from services.trainer.loggers import MetricLogger

SERVICE = "trainer"


class Telemetry:
    def __init__(self, run_dir: Path, loggers: Sequence[MetricLogger] = ()) -> None:
        self.metrics = ServiceMetrics(SERVICE)
        self.stalled = self.metrics.gauge(
            "stalled",
            "Seconds the longest wait on another service has gone without progress (0: none waiting).",
            "seconds",
            labels=("waiting_for", "peer"),
        )
        self._gauges: dict[str, Gauge] = {}
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self.groups_path = run_dir / "groups.jsonl"
        # What became of each group (GET /control/groups/{id}), the run's record read back on start.
        self.fates = GroupFates.read(self.groups_path)
        self.latest: dict[str, float] = {}
        self.loggers = list(loggers)

    def _gauge(self, key: str) -> Gauge:
        if key not in self._gauges:
            what = key_to_metric_name(SERVICE, key).removeprefix(f"relayrl_{SERVICE}_")
            self._gauges[key] = self.metrics.gauge(what, f"verl metric {key}")
        return self._gauges[key]

    def record(self, step: int, values: dict[str, float]) -> None:
        """One line per step in metrics.jsonl, the latest value of each key in Prometheus, and the step to
        every tracker."""
        finite = {k: float(v) for k, v in values.items() if math.isfinite(float(v))}
        for key, value in finite.items():
            self._gauge(key).set(value)
        self.latest = finite
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **finite}, sort_keys=True) + "\n")
        for logger in self.loggers:
            logger.log(step, finite)

    def close(self) -> None:
        """Flushes and closes the trackers (a wandb run is finished)."""
        for logger in self.loggers:
            logger.close()

    def record_groups(
        self, step: int, version: int, group_ids: list[str], ages: list[int], etas: list[int | None] | None = None
    ) -> None:
        """One line per step in groups.jsonl: the groups trained on, their age in versions and the η each was
        admitted under (``etas``; null for a group that carried none): age <= η is the staleness bound.

        A resumed trainer writes its steps again from the checkpoint on; the last line of each
        step number is the one the model carries.
        """
        admitted = {} if etas is None else {"etas": etas}
        line = {"step": step, "version": version, "group_ids": group_ids, "ages": ages, **admitted}
        with self.groups_path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.fates.add_line(line)

    def record_dropped(self, reason: str, group_ids: list[str]) -> None:
        """A line in groups.jsonl for groups the trainer skipped (and acknowledged) without training."""
        line = {"dropped": reason, "group_ids": group_ids}
        with self.groups_path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.fates.add_line(line)
