"""Rank 0's side of the queue: releasing prompts ahead (within the staleness bound), pulling
and routing delivered groups, validation rounds, and acknowledgements after checkpoints.

The :class:`Feed` alone holds what is queue-facing: groups buffered for later batches, entries
trained on and not yet acknowledged, and the counters a checkpoint keeps (:class:`FeedState`).
The training loop tells it the step and version and asks it for batches and acknowledgements.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relayrl.retry import RetryPolicy, retrying_sync
from relayrl.schema import Group, PromptSpec
from relayrl.staleness import admitted_bound, check_staleness, lineage_version, min_start_version, rollbacks_from_pairs
from relayrl.stalls import StallWatch
from services.queue.errors import is_transient
from services.trainer.config import TrainerSettings
from services.trainer.control import Control
from services.trainer.data import PromptDataset, PromptRow, response_budget, to_spec
from services.trainer.filtering import no_signal_reason, signal_metrics
from services.trainer.length_bias import LengthBias
from services.trainer.links import Delivered, IoThread, TrajectoryQueue
from services.trainer.state import FeedState

log = logging.getLogger(__name__)

T = TypeVar("T")

# Training cannot go on without the queue, and a restarted queue loses nothing (Redis holds the
# state), so a queue that is down is waited out, however long, rather than crashing the trainer.
QUEUE_RETRY = RetryPolicy(attempts=None, first_wait_s=0.5, max_wait_s=10.0)


def plan_release(
    step: int,
    version: int,
    max_staleness: int,
    sync_every: int,
    batch_size: int,
    total_steps: int,
    released: int,
    replaced: int,
) -> list[int]:
    """The training version of each prompt to release now (empty: nothing to release).

    The version moves up by one every ``sync_every`` steps, so the steps that may still use a
    prompt started now, at version v, are those that will train at <= v + η: up to step
    (step // sync_every + η + 1) · sync_every (capped by the run's length). Prompts whose groups
    were dropped (``replaced``) are made up for. Each prompt's training version sets its
    ``min_start_version``, so with η = 0 exactly the current step's prompts are out and a
    replica can start them only at the current version.
    """
    period = step // sync_every
    horizon = min((period + max_staleness + 1) * sync_every, total_steps)
    count = batch_size * horizon + replaced - released
    out = []
    for i in range(max(count, 0)):
        planned_step = (released + i - replaced) // batch_size
        out.append(version + max(0, planned_step // sync_every - period))
    return out


@dataclass
class Batch:
    groups: list[Group]
    entry_ids: list[str]
    wait_s: float
    # Of wait_s, the seconds spent in queue calls (the rest waited for groups to arrive).
    queue_s: float
    metrics: dict[str, float] = field(default_factory=dict)


class Feed:
    def __init__(
        self,
        settings: TrainerSettings,
        queue: TrajectoryQueue,
        io: IoThread,
        dataset: PromptDataset,
        control: Control,
        stalls: StallWatch,
        on_drop: Callable[[str, list[str]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.io = io
        self.dataset = dataset
        self.control = control
        self.stalls = stalls
        # Told of every group skipped here (reason, group ids) just before it is acknowledged: the
        # run's record of drops, which a crash cannot roll back the way it rolls back the state's
        # counters. Before, so a crash in between can only re-deliver a group already recorded.
        self.on_drop = on_drop
        self.state = FeedState()
        self._buffer: list[Delivered] = []
        # Entries trained on, with the step that trained them, waiting for a durable checkpoint.
        self._unacked: list[tuple[int, str]] = []
        self._seen: set[str] = set()
        self._eval_groups: dict[str, Group] = {}
        self._queue_dropped = 0
        # The queue's long-answer threshold and generated share, from its last stats.
        self._generated_long = (0.0, 0.0)
        self.length_bias = LengthBias()
        # η in force for admission: what new prompts are released under (and stamped with). The
        # training loop changes it under max_staleness auto; each group is judged by the η it carries.
        self.max_staleness = settings.initial_staleness
        self._prompts_waiting: int | None = None  # at the last prompt stats
        self._starved: list[bool] = []  # per wait round of this batch: nothing left to lease
        self._rpc_s = 0.0  # seconds in queue calls since the last batch
        self._filtered_now: dict[str, int] = defaultdict(int)  # reason -> groups, this batch
        # Since the last resume (see resumed): eval groups of validations released before it, each
        # counted there as outstanding training work, so each is made up for like a drop.
        self._resumed, self._strays = False, 0
        self._outstanding = 0  # prompts and groups the queue holds for training, at the last stats
        # Entries pending for the trainer beyond those it holds, at the last stats: read for replies
        # that never reached it (see _pull).
        self._unheld = 0
        self._wanted_evals: set[str] = set()  # prompt ids of the validation under way

    # --- checkpoints --------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """The counters and dataset position a checkpoint keeps (keys of the checkpoint's JSON)."""
        self.state.data = self.dataset.state_dict()
        self.state.max_staleness = self.max_staleness
        return self.state.to_json()

    def restore(self, raw: dict[str, Any]) -> None:
        """Continues from a checkpoint's JSON (the one :meth:`checkpoint_state` contributed to)."""
        self.state = FeedState.from_json(raw)
        if self.state.data:
            self.dataset.load_state_dict(self.state.data)
        if self.settings.auto_staleness and self.state.max_staleness is not None:
            self.max_staleness = min(self.state.max_staleness, self.settings.max_staleness_limit)

    def resumed(self, step: int, checkpoint_version: int, resumed_version: int) -> None:
        """After a resume from the checkpoint of ``step``: tells the queue of the rollback, and counts
        the work still out from what the queue holds now.

        The checkpoint's ``released`` counts the prompts released up to it, but the killed trainer
        released more after it, and the groups it trained on since were never acknowledged: all of
        that is still in the queue. Counted as never released, it would be released a second time,
        and with every drop made up for, that surplus would go stale again and again for the rest of
        the run. So ``released`` is set from what the queue holds: waiting and leased prompts,
        queued and delivered groups.
        """
        if resumed_version > checkpoint_version:
            self.state.rollbacks.append([checkpoint_version, resumed_version])
        self._rpc("rollback", lambda: self.queue.rollback(checkpoint_version, resumed_version))
        self._resumed, self._strays = True, 0
        self._refresh_dropped()
        self.state.released = self.settings.batch_size * step + self._replaced() + self._outstanding

    def _replaced(self) -> int:
        """Released prompts that will never train (dropped, filtered, or counted out at a resume by mistake)."""
        return self._queue_dropped + self.state.dropped_stale + self.state.filtered_groups + self._strays

    def _recount_if_starved(self, step: int) -> None:
        """After a resume, the count of work out may be too high: a prompt leased and pushed but not yet
        completed was counted twice, and eval groups or a duplicate in the queue are no training work.
        Too high, it would never be released and the trainer would wait forever; so when the queue holds
        nothing for the trainer, which makes the count exact, it is set from the queue again."""
        if self._resumed and self._outstanding == 0:
            self.state.released = min(self.state.released, self.settings.batch_size * step + self._replaced())

    def lineage_version(self, group: Group) -> int | None:
        """The version ``group`` is judged by along the trainer's lineage (relayrl.staleness.Rollback);
        None when discarded weights started it."""
        return lineage_version(group.min_policy_version, rollbacks_from_pairs(self.state.rollbacks))

    def age(self, group: Group, version: int) -> int:
        """How many versions along the trainer's lineage ``group`` is behind ``version``."""
        lineage = self.lineage_version(group)
        assert lineage is not None, f"group {group.group_id} was started by weights a rollback discarded"
        return version - lineage

    def buffered_count(self) -> int:
        """Groups delivered and held for the next batches."""
        return len(self._buffer)

    def unacked_count(self) -> int:
        """Groups trained on whose acknowledgement waits for a durable checkpoint."""
        return len(self._unacked)

    def _rpc(self, what: str, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Runs one queue call, retried while the queue is down or restarting (:data:`QUEUE_RETRY`);
        a stop request ends the wait."""

        def transient(exc: BaseException) -> bool:
            return is_transient(exc) and not self.control.stop_requested.is_set()

        started = time.perf_counter()
        try:
            with self.stalls.waiting("an answer", "queue") as wait:
                for attempt in retrying_sync(f"queue {what}", transient, QUEUE_RETRY, log):
                    with attempt:
                        if attempt.retry_state.attempt_number > 1:
                            wait.tick()
                        return self.io.call(call())
        finally:
            self._rpc_s += time.perf_counter() - started
        raise AssertionError("unreachable: tenacity returns or re-raises")

    # --- releasing ----------------------------------------------------------------------

    def _release_ahead(self, step: int, version: int) -> int:
        """Releases the training prompts :func:`plan_release` asks for; returns how many."""
        s = self.settings
        if s.prompt_source == "agents":
            return 0  # agent-only training: every group comes from agents through the OpenAI endpoint
        eta = self.max_staleness
        versions = plan_release(
            step,
            version,
            eta,
            s.sync_every,
            s.batch_size,
            s.total_steps,
            self.state.released,
            self._replaced(),
        )
        if not versions:
            return 0
        now = time.time()
        specs = [
            to_spec(
                row,
                s.n_samples,
                min_start_version(train_version, eta),
                version,
                now,
                temperature=s.temperature,
                top_p=s.top_p,
                max_new_tokens=response_budget(row, s.max_new_tokens),
                max_staleness=eta,
            )
            for row, train_version in zip(self.dataset.take(len(versions)), versions, strict=True)
        ]
        self._release(specs)
        self.state.released += len(specs)
        return len(specs)

    def _release(self, specs: list[PromptSpec]) -> None:
        """One release, retried under one id: a retry whose first answer was lost puts nothing out twice."""
        release_id = uuid.uuid4().hex
        self._rpc("release", lambda: self.queue.release(specs, release_id=release_id))

    def _refresh_dropped(self) -> None:
        """Groups the queue dropped, and prompts it dropped after too many give-backs: both are made up for."""
        # Prompts first: a prompt whose group is pushed between the two reads is then counted twice (as
        # leased and as queued), never missed, so _outstanding is 0 only when the queue holds nothing.
        prompt_stats = self._rpc("prompt stats", self.queue.prompt_stats)
        stats = self._rpc("stats", self.queue.stats)
        prompts = prompt_stats.dropped_by_reason
        self._prompts_waiting = int(prompt_stats.waiting)
        self._queue_dropped = int(sum(stats.dropped_by_reason.values()) + sum(prompts.values()))
        self._generated_long = (stats.generated_long_threshold_tokens, stats.generated_long_token_share)
        waiting = prompt_stats.waiting + prompt_stats.leased + stats.queue_size + stats.pending
        self._outstanding = int(waiting) - len(self._unacked)
        self._unheld = int(stats.pending) - len(self._seen)

    # --- pulling ------------------------------------------------------------------------

    def _pull(self, version: int, max_groups: int) -> int:
        """Pulls and routes up to ``max_groups`` groups; returns how many came.

        Every entry pending for the trainer is one it holds, unless a pull's reply died with the
        queue instance (or Redis) that read it: those stay pending to this live consumer and nothing
        delivers them again. The trainer would wait for them for good (its count of work out
        includes them), so when more are pending than it holds, it tells the queue what it holds.
        """
        s = self.settings
        rpc_s = self._rpc_s
        held = sorted(self._seen) if self._unheld > 0 else None
        got = self._rpc(
            "pull",
            lambda: self.queue.pull(s.consumer, version, self.max_staleness, max_groups, s.pull_timeout_s, held=held),
        )
        if not got:
            self._rpc_s = rpc_s  # an empty pull only blocked, waiting for groups
        trained = set(self.state.trained_group_ids)
        for delivered in got:
            self._route(delivered, trained)
        return len(got)

    def _route(self, d: Delivered, trained: set[str]) -> None:
        if d.entry_id in self._seen:
            return  # re-delivered while we still hold it (acks wait for checkpoints)
        if d.group.group_id in trained:
            # Trained on in the state we run from and acknowledged, but the ack was lost.
            self.state.duplicate_groups += 1
            self._strays += int(self._resumed)  # counted as work out at the resume
            log.warning("group %s was trained on already; skipping it", d.group.group_id)
            self._dropped("duplicate", [d.group.group_id])
            self._ack_now([d.entry_id])
            return
        self._seen.add(d.entry_id)
        if d.group.is_eval:
            if self._resumed and d.group.prompt_id not in self._wanted_evals:
                self._strays += 1
            self._eval_groups[d.group.prompt_id] = d.group
            self._ack_now([d.entry_id])
            return
        if self.settings.filter_groups_enable and (
            reason := no_signal_reason(d.group, self.settings.filter_groups_metric)
        ):
            self.state.filtered_groups += 1
            self._filtered_now[reason] += 1
            self._dropped(reason, [d.group.group_id])
            self._ack_now([d.entry_id])
            return
        self._buffer.append(d)

    def _drop_stale(self, version: int) -> None:
        fresh = []
        for d in self._buffer:
            if check_staleness(self.lineage_version(d.group), version, self._bound(d.group)).ok:
                fresh.append(d)
            else:
                self.state.dropped_stale += 1
                self._dropped("stale", [d.group.group_id])
                self._ack_now([d.entry_id])
        self._buffer = fresh

    def _bound(self, group: Group) -> int:
        """The η ``group`` is judged by: the one its prompt was admitted under (relayrl.staleness)."""
        return admitted_bound(group.max_staleness, self.max_staleness)

    def _dropped(self, reason: str, group_ids: list[str]) -> None:
        if self.on_drop is not None:
            self.on_drop(reason, group_ids)

    def next_batch(self, step: int, version: int) -> Batch | None:
        """The batch that trains step ``step + 1`` at ``version``: blocks until ``batch_size`` fresh
        groups are in hand; None when asked to stop.

        Its groups count as trained from here on: their entries wait for
        :meth:`acknowledge_through` and their ids go into the next checkpoint.
        """
        started = time.perf_counter()
        self._rpc_s = 0.0
        size = self.settings.batch_size
        self._drop_stale(version)
        with self.stalls.waiting("trajectory groups", "rollout") as wait:
            while len(self._buffer) < size:
                if self.control.stop_requested.is_set():
                    return None
                self._check_generation_budget()
                if not self.control.consuming.is_set():
                    wait.progress()  # paused on request: not a stall
                    time.sleep(0.1)
                    continue
                self._refresh_dropped()
                self._recount_if_starved(step)
                self._starved.append(self._prompts_waiting == 0)
                self._release_ahead(step, version)
                came = self._pull(version, size - len(self._buffer))
                self._drop_stale(version)
                if came:
                    wait.progress()
                else:
                    wait.tick()
        taken, self._buffer = self._buffer[:size], self._buffer[size:]
        for d in taken:
            verdict = check_staleness(self.lineage_version(d.group), version, self._bound(d.group))
            assert verdict.ok, f"group {d.group.group_id} is {verdict.verdict} at version {version}"
        self._unacked.extend((step + 1, d.entry_id) for d in taken)
        self.state.note_trained([d.group.group_id for d in taken])
        groups = [d.group for d in taken]
        return Batch(
            groups,
            [d.entry_id for d in taken],
            time.perf_counter() - started,
            self._rpc_s,
            {
                **self._filter_metrics(),
                **signal_metrics(groups, self.settings.filter_groups_metric),
                **self._length_bias_metrics(groups),
                **self._admission_metrics(),
            },
        )

    def _admission_metrics(self) -> dict[str, float]:
        """``staleness/admission_starved``: the share of this batch's wait rounds in which the prompt queue had
        nothing left to lease (absent when the batch was in hand without waiting)."""
        rounds, self._starved = self._starved, []
        return {"staleness/admission_starved": sum(rounds) / len(rounds)} if rounds else {}

    def _check_generation_budget(self) -> None:
        limit = self.settings.max_num_gen_batches
        if limit and sum(self._filtered_now.values()) + self.settings.batch_size > limit * self.settings.batch_size:
            raise RuntimeError(
                f"dynamic sampling: more than max_num_gen_batches={limit} batches of groups generated for one batch "
                f"({dict(self._filtered_now)} without signal); the data is too easy or too hard for the policy"
            )

    def _length_bias_metrics(self, groups: list[Group]) -> dict[str, float]:
        lengths = [len(sample.response_token_ids) for group in groups for sample in group.samples]
        return self.length_bias.record(lengths, *self._generated_long)

    def _filter_metrics(self) -> dict[str, float]:
        if not self.settings.filter_groups_enable:
            return {}
        size = self.settings.batch_size
        dropped = sum(self._filtered_now.values())
        out = {
            "filter_groups/dropped": float(dropped),
            "filter_groups/dropped_all_solved": float(self._filtered_now.get("all_solved", 0)),
            "filter_groups/dropped_all_failed": float(self._filtered_now.get("all_failed", 0)),
            "filter_groups/gen_batches_per_batch": (dropped + size) / size,
            "filter_groups/dropped_total": float(self.state.filtered_groups),
        }
        self._filtered_now.clear()
        return out

    # --- validation ---------------------------------------------------------------------

    def validate(self, rows: list[PromptRow], step: int, version: int) -> dict[str, float]:
        """Greedy generation of ``rows`` at ``version`` after ``step``; ``val/test_score/<data_source>``.

        No training prompts are released meanwhile, and a rollout replica holding a validation prompt
        starts no training generation until its validation prompts are done (ROLL pauses sampling for
        validation the same way); training groups that arrive are kept.
        """
        s, v = self.settings, version
        tag = f"eval/{step}/"
        specs = [to_spec(r, 1, v, v, time.time(), temperature=0.0, max_new_tokens=s.max_new_tokens) for r in rows]
        for spec in specs:
            spec.prompt_id = tag + spec.prompt_id
            spec.is_eval = True
        self._release(specs)
        wanted = {spec.prompt_id for spec in specs}
        self._wanted_evals = wanted
        deadline = time.monotonic() + s.eval_timeout_s
        while not wanted <= self._eval_groups.keys() and time.monotonic() < deadline:
            if self.control.stop_requested.is_set():
                break
            self._pull(version, max(1, len(wanted - self._eval_groups.keys())))
        scores: dict[str, list[float]] = defaultdict(list)
        returned = wanted & self._eval_groups.keys()
        for pid in returned:
            group = self._eval_groups.pop(pid)
            scores[group.data_source].extend(x.reward for x in group.samples)
        metrics = {f"val/test_score/{ds}": sum(v_) / len(v_) for ds, v_ in scores.items()}
        # Below 1 when the eval timeout struck before every prompt came back.
        metrics["val/returned_ratio"] = len(returned) / max(len(wanted), 1)
        self._wanted_evals = set()
        return metrics

    # --- acknowledging ------------------------------------------------------------------

    def _ack_now(self, entry_ids: list[str]) -> None:
        if entry_ids:
            self._rpc("ack", lambda: self.queue.ack(self.settings.consumer, entry_ids))
            self._seen.difference_update(entry_ids)

    def acknowledge_through(self, step: int) -> None:
        """Once the checkpoint of ``step`` is durable: acknowledges every group trained at or before it."""
        self._ack_now([entry_id for trained_at, entry_id in self._unacked if trained_at <= step])
        self._unacked = [(trained_at, entry_id) for trained_at, entry_id in self._unacked if trained_at > step]
