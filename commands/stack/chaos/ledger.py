"""The four numbers RelayRL promises are zero, measured from what the run leaves behind.

- The trainer's ``groups.jsonl`` says which groups each step trained on and at what age, and
  which groups the trainer skipped (stale, duplicate) as it acknowledged them. A resumed
  trainer writes the steps after its checkpoint again, so a line for step s at or below a step
  already read marks a resume from a checkpoint before s: the steps from s on that were read
  before it are rolled back, whether or not the resumed trainer gets that far again before
  the run ends. What is left are the steps the final model carries, the *lineage*.
- The queue's statistics (kept in Redis with its AOF) say how many groups it accepted
  (``total_produced``), dropped with a reason, and still holds (queued or delivered, not yet
  acknowledged) at the end.

``lost_groups`` = accepted − (distinct groups trained in the lineage or skipped by the trainer)
− dropped by the queue − still held. ``trained_twice`` = lineage entries of a group id already
trained in an earlier step. ``staleness_violations`` = lineage groups older than η when
trained. Version regressions come from :class:`VersionWatch`, which polls every engine.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from relayrl import http_client


@dataclass
class Lineage:
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> its last groups.jsonl line
    skipped: set[str] = field(default_factory=set)  # group ids the trainer acknowledged without training

    @classmethod
    def read(cls, path: Path) -> Lineage:
        lineage = cls()
        if not path.is_file():
            return lineage
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a kill
            if "dropped" in row:
                lineage.skipped.update(row["group_ids"])
            elif "step" in row:
                step = int(row["step"])
                for rolled_back in [s for s in lineage.steps if s >= step]:
                    del lineage.steps[rolled_back]
                lineage.steps[step] = row
        return lineage

    def trained(self) -> list[str]:
        return [gid for step in sorted(self.steps) for gid in self.steps[step]["group_ids"]]

    def trained_twice(self) -> int:
        ids = self.trained()
        return len(ids) - len(set(ids))

    def staleness_violations(self, max_staleness: int) -> int:
        """Groups trained older than the η they were admitted under (``max_staleness`` for one that carried none)."""
        return sum(
            1
            for row in self.steps.values()
            for age, eta in zip(row["ages"], row.get("etas") or [None] * len(row["ages"]), strict=True)
            if age > (max_staleness if eta is None else eta)
        )


def lost_groups(lineage: Lineage, produced: int, queue_dropped: int, queued: int, pending: int) -> int:
    accounted = len(set(lineage.trained()) | lineage.skipped)
    return produced - accounted - queue_dropped - queued - pending


@dataclass
class VersionWatch:
    """Polls each engine's ``/get_model_info`` and counts a regression whenever an engine process
    serves an older weight version than it served before. A restarted engine starts again from
    the model directory (version 0) and is a new process: its reset is counted apart, as
    ``engine_resets``, since the rollout labels what it generates with the engine's real
    version and the staleness check applies to it."""

    last: dict[str, tuple[int, int]] = field(default_factory=dict)  # engine -> (pid, version)
    regressions: list[str] = field(default_factory=list)
    resets: int = 0

    def observe(self, engine: str, pid: int, version: int) -> None:
        before = self.last.get(engine)
        if before is not None:
            if before[0] == pid and version < before[1]:
                self.regressions.append(f"{engine} went from v{before[1]} to v{version}")
            elif before[0] != pid and version < before[1]:
                self.resets += 1
        self.last[engine] = (pid, version)

    def poll(self, engines: dict[str, tuple[str, int | None]]) -> None:
        """``engines``: name -> (base URL, pid of its process or None while it is down)."""
        for name, (url, pid) in engines.items():
            if pid is None:
                continue
            try:
                answer = http_client.get(f"{url}/get_model_info", timeout=2.0).json()
                version = int(answer.get("weight_version") or 0)
            except (httpx.HTTPError, ValueError):
                continue  # down, stopped or restarting
            self.observe(name, pid, version)


def step_gaps(metrics_path: Path, until: float | None = None) -> list[float]:
    """Seconds between consecutive training steps written to metrics.jsonl (the stall measure),
    and from the last step to ``until`` (the end of the run) when given."""
    times = []
    if metrics_path.is_file():
        for line in metrics_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "trainer/global_steps" in row:
                times.append(float(row["time"]))
    if until is not None and times:
        times.append(max(until, times[-1]))
    return [b - a for a, b in itertools.pairwise(times)]


@dataclass
class Verdict:
    """What the run proved; every count but ``steps`` must be zero."""

    lost_groups: int
    trained_twice: int
    staleness_violations: int
    version_regressions: int
    steps: int
    produced: int
    trained_groups: int
    skipped_by_trainer: int
    queue_dropped: int
    queue_dropped_by_reason: dict[str, int]
    still_queued: int
    engine_resets: int
    max_step_gap_s: float
    stalls_over_30s: int


def verdict(
    run_dir: Path, queue_address: str, max_staleness: int, watch: VersionWatch, ended_at: float | None = None
) -> Verdict:
    from commands.ctl.components import queue_status

    lineage = Lineage.read(run_dir / "groups.jsonl")
    q = queue_status(queue_address, timeout_s=10.0)
    dropped = int(sum(q.dropped_by_reason.values()))
    gaps = step_gaps(run_dir / "metrics.jsonl", ended_at)
    return Verdict(
        lost_groups=lost_groups(lineage, q.total_produced, dropped, q.queue_size, q.pending),
        trained_twice=lineage.trained_twice(),
        staleness_violations=lineage.staleness_violations(max_staleness),
        version_regressions=len(watch.regressions),
        steps=max(lineage.steps, default=0),
        produced=q.total_produced,
        trained_groups=len(set(lineage.trained())),
        skipped_by_trainer=len(lineage.skipped - set(lineage.trained())),
        queue_dropped=dropped,
        queue_dropped_by_reason={k: int(v) for k, v in sorted(q.dropped_by_reason.items()) if v},
        still_queued=q.queue_size + q.pending,
        engine_resets=watch.resets,
        max_step_gap_s=round(max(gaps, default=0.0), 2),
        stalls_over_30s=sum(1 for g in gaps if g > 30.0),
    )
