"""Sample age at delivery over a sliding window: the freshness figures verl users read."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AgeSummary:
    avg_versions: float
    max_versions: float
    avg_s: float
    max_s: float


class AgeWindow:
    """The last ``size`` deliveries' ages, in policy versions and seconds since the push."""

    def __init__(self, size: int) -> None:
        self._versions: deque[int] = deque(maxlen=size)
        self._seconds: deque[float] = deque(maxlen=size)

    def add(self, age_versions: int, age_s: float) -> None:
        self._versions.append(age_versions)
        self._seconds.append(age_s)

    def summary(self) -> AgeSummary:
        if not self._versions:
            return AgeSummary(0.0, 0.0, 0.0, 0.0)
        n = len(self._versions)
        return AgeSummary(
            avg_versions=sum(self._versions) / n,
            max_versions=float(max(self._versions)),
            avg_s=sum(self._seconds) / n,
            max_s=max(self._seconds),
        )
