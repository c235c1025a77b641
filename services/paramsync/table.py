"""The version table: which replica holds which version, since when, and who is lagging.

States: ``in_sync`` (holds the latest), ``syncing`` (behind, still within its deadline and
retries), ``lagging`` (retries exhausted or no report by the deadline). A lagging replica stays
in the table and in Prometheus with its lag, so it is visible; the others proceed regardless.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from services.paramsync.endpoints import ReplicaEndpoint
from services.paramsync.manifest import ReplicaVersion
from services.paramsync.metrics import ParamSyncMetrics

IN_SYNC, SYNCING, LAGGING = "in_sync", "syncing", "lagging"


def lag_deadline_s(sync_timeout: float, max_sync_retries: int, sync_retry_delay: float) -> float:
    """How long a replica may take to report a new version: every attempt timing out, plus the backoff."""
    attempts = max_sync_retries + 1
    return sync_timeout * attempts + sync_retry_delay * (2**max_sync_retries - 1)


@dataclass
class _Row:
    replica_id: str
    engine_url: str = ""
    version: int = 0
    updated_at_unix_s: float = 0.0
    consecutive_failures: int = 0
    last_error: str = ""
    lagging: bool = False
    # Monotonic time the replica first fell behind the latest version; None while in sync.
    behind_since: float | None = None


class VersionTable:
    def __init__(self, metrics: ParamSyncMetrics, max_sync_retries: int, deadline_s: float) -> None:
        self.metrics = metrics
        self.max_sync_retries = max_sync_retries
        self.deadline_s = deadline_s
        self.latest = 0
        self._rows: dict[str, _Row] = {}

    def ensure(self, replica_id: str, engine_url: str = "") -> None:
        row = self._rows.get(replica_id)
        if row is None:
            row = self._rows[replica_id] = _Row(replica_id, engine_url)
        elif engine_url:
            row.engine_url = engine_url
        self._refresh(row)

    def remove(self, replica_id: str) -> None:
        if self._rows.pop(replica_id, None) is not None:
            self.metrics.replica_version.remove(replica_id)
            self.metrics.replica_lag.remove(replica_id)
            self._count_lagging()

    def endpoints(self) -> list[ReplicaEndpoint]:
        return [ReplicaEndpoint(r.replica_id, r.engine_url) for r in self._rows.values()]

    def version_of(self, replica_id: str) -> int:
        row = self._rows.get(replica_id)
        return row.version if row else 0

    def set_latest(self, version: int) -> None:
        self.latest = max(self.latest, version)
        for row in self._rows.values():
            self._refresh(row)

    def record_success(self, replica_id: str, version: int, sync_s: float) -> None:
        self.ensure(replica_id)
        row = self._rows[replica_id]
        # A late report of an older version never moves a replica backwards in the table.
        if version >= row.version:
            row.version, row.updated_at_unix_s = version, time.time()
        row.consecutive_failures, row.last_error, row.lagging = 0, "", False
        row.behind_since = None  # progress restarts the deadline for whatever it still lacks
        self.metrics.syncs.inc()
        if sync_s > 0:
            self.metrics.sync_duration.observe(sync_s)
        self._refresh(row)

    def record_subscribed(self, replica_id: str, engine_url: str, held_version: int) -> None:
        """A (re)subscribing replica states what it holds; a restarted one may hold less than before."""
        self.ensure(replica_id, engine_url)
        row = self._rows[replica_id]
        if held_version < row.version:
            row.version, row.updated_at_unix_s, row.behind_since = held_version, time.time(), None
            self._refresh(row)

    def record_failure(self, replica_id: str, reason: str, error: str) -> None:
        self.ensure(replica_id)
        row = self._rows[replica_id]
        row.consecutive_failures += 1
        row.last_error = error
        row.lagging = row.lagging or row.consecutive_failures > self.max_sync_retries
        self.metrics.sync_failures.labels(reason).inc()
        self._refresh(row)

    def mark_lagging(self, replica_id: str, reason: str, error: str) -> None:
        self.ensure(replica_id)
        row = self._rows[replica_id]
        if not row.lagging:
            self.metrics.sync_failures.labels(reason).inc()
        row.lagging, row.last_error = True, error
        self._refresh(row)

    def check_deadlines(self, now: float | None = None) -> list[str]:
        """Marks lagging every replica behind the latest for longer than the deadline; returns their ids."""
        now = time.monotonic() if now is None else now
        late = [
            r.replica_id
            for r in self._rows.values()
            if not r.lagging and r.behind_since is not None and now - r.behind_since > self.deadline_s
        ]
        for replica_id in late:
            self.mark_lagging(
                replica_id, "timeout", f"did not report version {self.latest} within {self.deadline_s:.1f}s"
            )
        return late

    def snapshot(self) -> list[ReplicaVersion]:
        return [
            ReplicaVersion(
                r.replica_id,
                r.version,
                r.updated_at_unix_s,
                max(self.latest - r.version, 0),
                self._state(r),
                r.consecutive_failures,
                r.last_error,
                r.engine_url,
            )
            for r in sorted(self._rows.values(), key=lambda r: r.replica_id)
        ]

    def _state(self, row: _Row) -> str:
        if row.version >= self.latest:
            return IN_SYNC
        return LAGGING if row.lagging else SYNCING

    def _refresh(self, row: _Row) -> None:
        if row.version >= self.latest:
            row.behind_since, row.lagging = None, False
        elif row.behind_since is None:
            row.behind_since = time.monotonic()
        self.metrics.replica_version.labels(row.replica_id).set(row.version)
        self.metrics.replica_lag.labels(row.replica_id).set(max(self.latest - row.version, 0))
        self._count_lagging()

    def _count_lagging(self) -> None:
        self.metrics.replicas_lagging.set(sum(self._state(r) == LAGGING for r in self._rows.values()))
