"""The prompt queue's counters: one type for the store that counts them, the servicer that
sends them and the client that receives them (``PromptQueueStats`` in queue.proto)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from relayrl.v1 import queue_pb2 as qpb


@dataclass(frozen=True, slots=True)
class PromptQueueStats:
    waiting: int
    leased: int
    total_released: int
    total_completed: int
    total_reissued: int
    # Leases given back by replicas, and prompts dropped after too many give-backs, by reason.
    abandoned_by_reason: dict[str, int]
    dropped_by_reason: dict[str, int]

    def to_proto(self) -> qpb.PromptQueueStats:
        return qpb.PromptQueueStats(**asdict(self))

    @classmethod
    def from_proto(cls, msg: qpb.PromptQueueStats) -> PromptQueueStats:
        return cls(
            waiting=msg.waiting,
            leased=msg.leased,
            total_released=msg.total_released,
            total_completed=msg.total_completed,
            total_reissued=msg.total_reissued,
            abandoned_by_reason=dict(msg.abandoned_by_reason),
            dropped_by_reason=dict(msg.dropped_by_reason),
        )
