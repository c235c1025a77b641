import asyncio
import json
import logging
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, Gauge

from relayrl.retry import RetryPolicy
from relayrl.schema import Group, Sample
from relayrl.stalls import StallWatch
from services.queue.errors import QueueUnavailable
from services.queue.stats import PromptQueueStats, QueueStats
from services.trainer.config import TrainerSettings
from services.trainer.control import Control
from services.trainer.data import PromptDataset, PromptRow
from services.trainer.feed import Feed, plan_release
from services.trainer.state import TRAINED_IDS_KEPT, FeedState, TrainerState

log = logging.getLogger(__name__)


def test_on_policy_releases_exactly_one_batch_for_the_current_version():
    assert plan_release(0, 0, 0, 1, 4, 100, released=0, replaced=0) == [0, 0, 0, 0]
    assert plan_release(0, 0, 0, 1, 4, 100, released=4, replaced=0) == []
    assert plan_release(1, 1, 0, 1, 4, 100, released=4, replaced=0) == [1, 1, 1, 1]


def test_staleness_bound_lets_prompts_run_eta_versions_ahead():
    # η = 2, a version every 2 steps: steps 0..5 train at versions 0..2
    assert plan_release(0, 0, 2, 2, 1, 100, released=0, replaced=0) == [0, 0, 1, 1, 2, 2]


def test_versions_follow_the_current_one_after_a_jump():
    # a resumed trainer whose version was moved past paramsync's latest (7 at step 4)
    assert plan_release(4, 7, 1, 1, 1, 100, released=4, replaced=0) == [7, 8]


def test_dropped_groups_are_replaced_and_the_run_length_caps_releases():
    assert plan_release(0, 0, 0, 1, 2, 100, released=2, replaced=1) == [0]
    assert len(plan_release(5, 5, 3, 1, 2, 6, released=0, replaced=0)) == 12


# --- a Feed resumed from a checkpoint, against an in-memory queue ------------------------


def _group(group_id: str, version: int, lengths: tuple[int, ...] = (1,)) -> Group:
    samples = [Sample([1, 2], [3] * n, [-0.5] * n, [version] * n, reward=1.0) for n in lengths]
    return Group(group_id, f"p/{group_id}", samples)


@dataclass
class _Delivered:
    entry_id: str
    group: Group
    delivery_count: int = 1
    age_versions: int = 0


@dataclass
class _Queue:
    """Hands out its groups once (as a consumer group does) and records acks."""

    waiting: list[_Delivered]
    acked: list[str] = field(default_factory=list)
    # What the queue measured of the lengths pushed: (long-answer threshold, their token share).
    generated_long: tuple[float, float] = (0.0, 0.0)

    async def release(self, prompts: list, release_id: str = "") -> int:
        return len(prompts)

    async def pull(self, consumer, version, max_staleness, max_groups, timeout_s, held=None) -> list[_Delivered]:
        got, self.waiting = self.waiting[:max_groups], self.waiting[max_groups:]
        return got

    async def ack(self, consumer: str, entry_ids: list[str]) -> int:
        self.acked.extend(entry_ids)
        return len(entry_ids)

    async def stats(self) -> QueueStats:
        threshold, share = self.generated_long
        return QueueStats(
            queue_size=len(self.waiting), total_produced=0, total_consumed=len(self.acked), dropped_by_reason={},
            pending=0, capacity=1024, avg_sample_age_versions=0.0, max_sample_age_versions=0.0,
            avg_sample_age_s=0.0, max_sample_age_s=0.0, stale_samples_ratio=0.0, consumer_lag=0,
            generated_long_threshold_tokens=threshold, generated_long_token_share=share, duplicate_groups=0,
        )  # fmt: skip

    async def prompt_stats(self) -> PromptQueueStats:
        return PromptQueueStats(0, 0, 0, 0, 0, abandoned_by_reason={}, dropped_by_reason={})


@dataclass
class _DownThenUp(_Queue):
    """Answers UNAVAILABLE to its first ``failures`` acks (a queue restarting)."""

    failures: int = 0

    async def ack(self, consumer: str, entry_ids: list[str]) -> int:
        if self.failures:
            self.failures -= 1
            raise QueueUnavailable("queue restarting")
        return await super().ack(consumer, entry_ids)


class _Io:
    def call(self, coro):
        return asyncio.run(coro)


def _feed(groups: list[Group], batch_size: int = 2, failures: int = 0) -> tuple[Feed, _Queue]:
    queue = _DownThenUp([_Delivered(f"e-{g.group_id}", g) for g in groups], failures=failures)
    settings = TrainerSettings(batch_size=batch_size, max_staleness=1, total_steps=100)
    dataset = PromptDataset([PromptRow("p/0", [1], "s", "", {})], seed=0)
    stalls = StallWatch(Gauge("t_stalled_seconds", "", ["waiting_for", "peer"], registry=CollectorRegistry()), 60, log)
    return Feed(settings, queue, _Io(), dataset, Control(), stalls), queue


def _resumed_feed(
    state: TrainerState, groups: list[Group], fed: FeedState | None = None, batch_size: int = 2
) -> tuple[Feed, _Queue]:
    feed, queue = _feed(groups, batch_size)
    # The trainer's resume() hands the Feed the checkpoint's JSON, which both states wrote.
    saved = {**state.to_json(), **(fed or FeedState()).to_json()}
    feed.restore(json.loads(json.dumps(saved)))
    return feed, queue


def test_after_resume_staleness_is_judged_against_the_restored_version_not_zero():
    # Restored at version 5 with η = 1: a group started at version 3 is stale (it would pass
    # against version 0), those started at 4 and 5 are fresh.
    feed, queue = _resumed_feed(TrainerState(step=5, version=5), [_group("old", 3), _group("a", 4), _group("b", 5)])
    batch = feed.next_batch(step=5, version=5)
    assert [g.group_id for g in batch.groups] == ["a", "b"]
    assert feed.state.dropped_stale == 1 and queue.acked == ["e-old"]


def test_a_group_trained_before_the_checkpoint_and_delivered_again_is_skipped_not_retrained():
    before = FeedState()
    before.note_trained(["done"])
    feed, queue = _resumed_feed(
        TrainerState(step=3, version=3), [_group("done", 3), _group("a", 3), _group("b", 3)], before
    )
    batch = feed.next_batch(step=3, version=3)
    assert [g.group_id for g in batch.groups] == ["a", "b"]
    assert feed.state.duplicate_groups == 1 and queue.acked == ["e-done"]


def test_trained_ids_kept_in_a_checkpoint_are_bounded():
    state = FeedState()
    state.note_trained([str(i) for i in range(TRAINED_IDS_KEPT + 10)])
    assert len(state.trained_group_ids) == TRAINED_IDS_KEPT and state.trained_group_ids[-1] == str(TRAINED_IDS_KEPT + 9)


def test_trained_groups_are_acknowledged_only_through_the_checkpointed_step():
    feed, queue = _feed([_group(g, 0) for g in "abcd"])
    first = feed.next_batch(step=0, version=0)
    second = feed.next_batch(step=1, version=0)
    assert [first.entry_ids, second.entry_ids] == [["e-a", "e-b"], ["e-c", "e-d"]]
    assert feed.unacked_count() == 4 and queue.acked == []
    feed.acknowledge_through(1)  # the checkpoint after step 1 covers the first batch only
    assert queue.acked == ["e-a", "e-b"] and feed.unacked_count() == 2
    feed.acknowledge_through(2)
    assert queue.acked == ["e-a", "e-b", "e-c", "e-d"] and feed.unacked_count() == 0


def test_a_batch_counts_its_groups_as_trained_and_a_checkpoint_keeps_them_with_the_dataset_position():
    feed, _ = _feed([_group(g, 0) for g in "abc"])
    feed.next_batch(step=0, version=0)
    assert feed.buffered_count() == 0
    saved = feed.checkpoint_state()
    assert saved["trained_group_ids"] == ["a", "b"] and saved["released"] == feed.state.released > 0
    assert saved["data"] == feed.dataset.state_dict()
    assert TrainerState.from_json(saved) == TrainerState()  # the loop's part is not the feed's


def test_a_queue_call_is_retried_while_the_queue_is_unavailable_and_not_once_stop_is_asked(monkeypatch):
    monkeypatch.setattr("services.trainer.feed.QUEUE_RETRY", RetryPolicy(attempts=None, first_wait_s=0.01))
    feed, queue = _feed([_group(g, 0) for g in "ab"], failures=2)
    feed.next_batch(step=0, version=0)
    feed.acknowledge_through(1)
    assert queue.acked == ["e-a", "e-b"] and queue.failures == 0

    feed, queue = _feed([_group(g, 0) for g in "ab"], failures=1)
    feed.next_batch(step=0, version=0)
    feed.control.stop_requested.set()
    with pytest.raises(QueueUnavailable):
        feed.acknowledge_through(1)
    assert queue.acked == []


def test_each_batch_reports_its_share_of_long_answer_tokens_against_the_generated_share():
    # The queue saw answers of 100 tokens or more carry half the tokens generated; the trainer's
    # first batch has one 100-token answer among 40-token ones, the second only short answers.
    groups = [_group("a", 0, (40, 40, 40, 100)), _group("b", 0, (40, 40, 40, 40))]
    feed, queue = _feed(groups, batch_size=1)
    queue.generated_long = (100.0, 0.5)
    first = feed.next_batch(step=0, version=0).metrics
    assert first["length_bias/long_threshold_tokens"] == 100.0
    assert first["length_bias/trained_long_share"] == pytest.approx(100 / 220)
    second = feed.next_batch(step=1, version=0).metrics
    assert second["length_bias/trained_long_share"] == 0.0
    # Over the run: 100 of 380 tokens were long, against half of those generated.
    assert second["length_bias/trained_long_share_run"] == pytest.approx(100 / 380)
    assert second["length_bias/trained_to_generated_run"] == pytest.approx((100 / 380) / 0.5)


def test_no_length_bias_figures_before_the_queue_has_measured_lengths():
    feed, _ = _feed([_group("a", 0), _group("b", 0)])
    assert not any(key.startswith("length_bias/") for key in feed.next_batch(step=0, version=0).metrics)


def test_each_batch_reports_the_share_of_its_groups_that_teach_grpo_nothing():
    mixed = _group("b", 0, (1, 1))
    mixed.samples[1].reward = 0.0
    feed, _ = _feed([_group("a", 0, (1, 1)), mixed])
    metrics = feed.next_batch(step=0, version=0).metrics
    assert metrics["batch/no_signal_frac"] == metrics["batch/all_solved_frac"] == 0.5
    assert metrics["batch/all_failed_frac"] == 0.0
