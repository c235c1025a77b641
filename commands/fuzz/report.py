"""What one fuzzed interface did: calls by outcome, and the failures worth a look."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Failures kept verbatim per interface and kind of failure, enough to reproduce without flooding the JSON line.
MAX_EXAMPLES = 5


@dataclass
class Tally:
    calls: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    crashes: int = 0
    hangs: int = 0
    # gRPC: UNKNOWN, INTERNAL or a status without a message. REST: a 5xx nobody explained.
    unexplained: int = 0
    # Accepted work that was gone after the run, or a valid call refused after it.
    lost: int = 0
    examples: list[str] = field(default_factory=list)

    def fail(self, kind: str, detail: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if sum(e.startswith(f"{kind}:") for e in self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{kind}: {detail[:300]}")

    @property
    def ok(self) -> bool:
        return not (self.crashes or self.hangs or self.unexplained or self.lost)

    def as_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "by_status": dict(sorted(self.by_status.items())),
            "crashes": self.crashes,
            "hangs": self.hangs,
            "unexplained_errors": self.unexplained,
            "lost": self.lost,
            "examples": self.examples,
        }
