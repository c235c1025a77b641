"""The queues' counters as typed values: ``QueueStats`` (the trajectory queue, as the client
receives it) and ``PromptQueueStats`` (one type for the store that counts them, the servicer that
sends them and the client that receives them); their fields are those of queue.proto's messages."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from google.protobuf.message import Message

from relayrl.v1 import queue_pb2 as qpb

S = TypeVar("S")


def from_proto(cls: type[S], msg: Message) -> S:
    """The dataclass ``cls`` from the proto message with the same field names (maps become dicts)."""

    def plain(value: Any) -> Any:
        return dict(value) if hasattr(value, "items") else value

    return cls(**{f.name: plain(getattr(msg, f.name)) for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The trajectory queue's counters; see ``QueueStats`` in queue.proto for each field."""

    queue_size: int
    total_produced: int
    total_consumed: int
    dropped_by_reason: dict[str, int]
    pending: int
    capacity: int
    avg_sample_age_versions: float
    max_sample_age_versions: float
    avg_sample_age_s: float
    max_sample_age_s: float
    stale_samples_ratio: float
    consumer_lag: int
    generated_long_threshold_tokens: float
    generated_long_token_share: float
    duplicate_groups: int


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
