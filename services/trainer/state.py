"""What a checkpoint keeps besides the weights, as one flat JSON object: the training loop's
counters (:class:`TrainerState`) and the feed's (:class:`FeedState`), each owned by one object."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Self

# Group ids trained on that a checkpoint remembers. A group already trained on comes back only
# when its acknowledgement was lost (Redis crashed within its AOF fsync interval after the ack),
# so the ids of the last few checkpoint intervals are enough to recognise it.
TRAINED_IDS_KEPT = 4096


@dataclass
class _Saved:
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Self:
        """This part of a checkpoint's JSON (the keys of the other part are ignored)."""
        return cls(**{k: v for k, v in raw.items() if k in cls.__dataclass_fields__})


@dataclass
class TrainerState(_Saved):
    """The training loop's counters; every rank holds them."""

    step: int = 0  # training steps completed
    version: int = 0  # latest policy version published (0 = the model directory)
    param_sync_count: int = 0  # versions published by this run (re-publishes after restarts included)
    processed_samples: int = 0
    skipped_empty_batches: int = 0


@dataclass
class FeedState(_Saved):
    """What rank 0's feed did with the queue over the run; only the feed changes it."""

    released: int = 0  # training prompts released over the run
    # Groups the trainer refused itself (the queue filters stale groups first, so this stays 0
    # unless a group aged while it waited in the trainer's buffer).
    dropped_stale: int = 0
    filtered_groups: int = 0  # dropped by dynamic sampling (filter_groups), each replaced by a new prompt
    data: dict[str, int] = field(default_factory=dict)  # PromptDataset.state_dict()
    duplicate_groups: int = 0  # delivered again after being trained on (and acknowledged) and skipped
    trained_group_ids: list[str] = field(default_factory=list)  # the newest TRAINED_IDS_KEPT, oldest first
    # (checkpoint version, resumed version) of each rollback of the run's lineage (relayrl.staleness.Rollback).
    rollbacks: list[list[int]] = field(default_factory=list)
    rolled_back_groups: int = 0  # groups the trainer skipped as started by discarded weights
    # η prompts were admitted under at the checkpoint (max_staleness auto resumes from it); None: not recorded.
    max_staleness: int | None = None

    def note_trained(self, group_ids: list[str]) -> None:
        self.trained_group_ids.extend(group_ids)
        del self.trained_group_ids[:-TRAINED_IDS_KEPT]
