"""The feed after a resume: it tells the queue of the rollback, judges groups along the lineage,
and counts the work still out from the queue, so it releases neither twice nor too little."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from services.queue.stats import PromptQueueStats, QueueStats
from services.trainer.state import FeedState, TrainerState
from tests.unit.trainer.test_feed import _Delivered, _DownThenUp, _feed, _group


@dataclass
class _HoldingQueue(_DownThenUp):
    """The in-memory queue, also holding prompts (waiting, leased) and delivered-unacked groups, and
    turning each released prompt into a group at ``version`` at once, as a fast rollout would."""

    prompts_waiting: int = 0
    prompts_leased: int = 0
    pending: int = 0
    dropped: int = 0
    version: int = 0
    released: int = 0
    rollbacks: list[tuple[int, int]] = field(default_factory=list)

    async def release(self, prompts: list, release_id: str = "") -> int:
        self.released += len(prompts)
        self.waiting += [
            _Delivered(f"e-new{self.released}-{i}", _group(f"new{i}", self.version)) for i in range(len(prompts))
        ]
        return len(prompts)

    async def rollback(self, checkpoint_version: int, resumed_version: int) -> int:
        self.rollbacks.append((checkpoint_version, resumed_version))
        return 0

    async def stats(self) -> QueueStats:
        return dataclasses.replace(
            await super().stats(), pending=self.pending, dropped_by_reason={"stale": self.dropped}
        )

    async def prompt_stats(self) -> PromptQueueStats:
        return PromptQueueStats(self.prompts_waiting, self.prompts_leased, 0, 0, 0, {}, {})


def _resumed(groups, batch_size=2, **queue_state):
    feed, plain = _feed(groups, batch_size)
    queue = _HoldingQueue(plain.waiting, **queue_state)
    feed.queue = queue
    # Checkpoint of step 5 at version 5, η = 1, batch 2: it had released the prompts of steps 1 to 7.
    feed.restore(
        json.loads(json.dumps({**TrainerState(step=5, version=5).to_json(), **FeedState(released=14).to_json()}))
    )
    return feed, queue


def test_work_the_killed_trainer_released_after_its_checkpoint_is_not_released_again():
    # The killed trainer ran to step 9 and released up to step 11 (22 prompts); 4 of its groups were
    # dropped meanwhile. Still in the queue: 3 waiting prompts, 1 leased, 2 queued groups, and the
    # 8 groups of steps 6 to 9 it trained on without acknowledging them.
    held = [_group(f"q{i}", 10) for i in range(2)]  # generated after the resume
    feed, queue = _resumed(held, prompts_waiting=3, prompts_leased=1, pending=8, dropped=4, version=10)
    feed.resumed(step=5, checkpoint_version=5, resumed_version=10)
    assert queue.rollbacks == [(5, 10)]
    # Counted from the checkpoint alone, the 4 drops would be released again though 14 prompts are out.
    feed.next_batch(step=5, version=10)
    assert queue.released == 0


def test_after_a_rollback_the_checkpoints_own_groups_are_trained_and_the_discarded_ones_dropped():
    groups = [_group("at-checkpoint", 5), _group("discarded", 7), _group("fresh", 10)]
    feed, queue = _resumed(groups, version=10)
    feed.resumed(step=5, checkpoint_version=5, resumed_version=10)
    batch = feed.next_batch(step=5, version=10)
    assert [g.group_id for g in batch.groups] == ["at-checkpoint", "fresh"]
    assert [feed.age(g, 10) for g in batch.groups] == [0, 0]
    assert feed.state.dropped_stale == 1 and queue.acked == ["e-discarded"]
    assert feed.checkpoint_state()["rollbacks"] == [[5, 10]]  # the next checkpoint keeps the lineage


def test_a_count_of_work_out_that_was_too_high_is_set_right_once_the_queue_holds_nothing():
    # At the resume 3 eval prompts of a validation before the crash were waiting: counted as work out,
    # they would never come back as training groups, and the trainer would wait for them forever.
    feed, queue = _resumed([], prompts_waiting=3, version=5)
    feed.resumed(step=5, checkpoint_version=5, resumed_version=5)
    queue.prompts_waiting = 0  # the eval prompts were generated and their groups are gone
    batch = feed.next_batch(step=5, version=5)
    assert len(batch.groups) == 2 and queue.released == 4  # steps 6 and 7, as from an exact count
