"""The replica's side of the prompt queue: lease, renew, give back, deliver.

A prompt whose group is dropped as stale or whose generation fails is given back to the queue
at once (``abandon``), so it is leased again now rather than after the queue's lease timeout;
only when the queue cannot be reached is it left to its lease. A lease is completed only once
its group was accepted by the queue.

Every queue call is retried on any error (one log line per retry): the replica outlives a
queue outage, and a prompt given back late only waits out its lease.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from relayrl.retry import RetryPolicy, any_error, call_with_retries, retrying
from relayrl.schema import Group, PromptSpec
from relayrl.stalls import StallWatch
from services.rollout.metrics import RolloutMetrics
from services.rollout.state import ReplicaState

log = logging.getLogger(__name__)

# Bounds on the lease keeper's sleep between checks, seconds.
LEASE_CHECK_MIN_S = 0.05
LEASE_CHECK_MAX_S = 30.0
# A queue call that failed is tried again after this long, for as long as the caller allows.
QUEUE_RETRY = RetryPolicy(attempts=None, first_wait_s=1.0, max_wait_s=1.0)


class Lease(Protocol):
    lease_id: str
    prompt: PromptSpec
    expires_at: float


class LeaseAnswer(Protocol):
    leases: Sequence[Lease]
    newer_version_waiting: bool


class ReplicaQueue(Protocol):
    """What the replica needs from the queue service (services.queue.client.QueueClient fits)."""

    async def lease_batch(
        self, replica_id: str, max_prompts: int, held_version: int, block_timeout_s: float = 0.0
    ) -> LeaseAnswer: ...

    async def renew(self, replica_id: str, lease_ids: list[str]) -> tuple[list[str], float]: ...

    async def abandon(
        self,
        replica_id: str,
        lease_ids: list[str],
        reason: str,
        min_start_version: int = 0,
        all_held: bool = False,
        keep_lease_ids: Sequence[str] = (),
    ) -> tuple[list[str], list[str]]: ...

    async def push(self, groups: list[Group], timeout_s: float = 0.0) -> list[str]: ...


@dataclass
class LeaseKeeper:
    state: ReplicaState
    queue: ReplicaQueue
    metrics: RolloutMetrics
    stalls: StallWatch
    block_timeout_s: float
    push_timeout_s: float
    # A lease call failed since the last give-back of what such a call may have leased.
    _answer_lost: bool = field(default=False, init=False)

    @property
    def replica_id(self) -> str:
        return self.state.replica_id

    async def reclaim_predecessors_leases(self) -> None:
        """Gives back what a killed replica of the same id still held, before leasing anything.

        Its prompts would otherwise wait out the queue's lease timeout (600 s by default). The
        queue may still be starting, so this waits for it.
        """
        with self.stalls.waiting("an answer", "queue") as wait:
            async for attempt in retrying("reclaim this replica's earlier leases", any_error, QUEUE_RETRY, log):
                with attempt:
                    wait.tick()
                    requeued, dropped = await self.queue.abandon(self.replica_id, [], "replica_restart", all_held=True)
        if requeued or dropped:
            log.info("gave back %d leases held by this replica before it restarted", len(requeued) + len(dropped))

    async def lease(self, max_prompts: int) -> Sequence[Lease]:
        """Up to ``max_prompts`` new leases; none when the replica stopped being leasable while
        the queue was out of reach, or after ``block_timeout_s`` without any.

        When the queue says only prompts for newer weights wait, this waits for the held
        version to change (at most ``block_timeout_s``) before returning, so the next lease
        asks with the new version at once.
        """
        async for attempt in retrying("lease prompts", any_error, QUEUE_RETRY, log):
            with attempt:
                if not self.state.leasable():
                    return []
                if self._answer_lost:
                    await self._give_back_unknown_leases()
                held = self.state.held_version
                try:
                    answer = await self.queue.lease_batch(self.replica_id, max_prompts, held, self.block_timeout_s)
                except Exception:
                    self._answer_lost = True
                    raise
        if answer.newer_version_waiting and self.state.held_version == held:
            await self.state.version_changed(self.block_timeout_s)
        return answer.leases

    async def _give_back_unknown_leases(self) -> None:
        """Gives back every lease the queue counts as this replica's but it does not hold.

        A lease call that failed may have leased prompts all the same: the queue instance, or Redis,
        died after the leases were taken and before the answer came back. Nobody would generate
        those prompts until the queue's lease timeout (600 s by default) re-issued them, and a
        trainer needing them for its next step would wait as long.
        """
        requeued, dropped = await self.queue.abandon(
            self.replica_id, [], "lost_answer", all_held=True, keep_lease_ids=self.state.lease_ids()
        )
        self._answer_lost = False
        if requeued or dropped:
            self.metrics.abandoned_leases.labels(reason="lost_answer").inc(len(requeued) + len(dropped))
            log.warning("gave back %d leases a failed lease call took without its answer", len(requeued) + len(dropped))

    async def keep(self) -> None:
        """Renews each lease in flight when half its time is left; drops prompts whose lease was lost.

        Without renewal a generation that outlasts the queue's lease timeout is re-issued to
        another replica and its group pushed twice. A lease the queue refuses to renew was
        re-issued already: its prompt is dropped here, since the other lease will deliver it.
        """
        while True:
            wait = self.state.until_next_renewal(time.time(), LEASE_CHECK_MAX_S)
            await self.state.lease_added(min(max(wait, LEASE_CHECK_MIN_S), LEASE_CHECK_MAX_S))
            now = time.time()
            due = self.state.leases_due(now)
            if not due:
                continue
            renewed, expires_at = await call_with_retries(
                f"renew {len(due)} leases",
                functools.partial(self.queue.renew, self.replica_id, due),
                any_error,
                QUEUE_RETRY,
                log,
            )
            kept = set(renewed)
            for lease_id in due:
                held = self.state.held_lease(lease_id)
                if held is None:  # finished meanwhile
                    continue
                if lease_id in kept:
                    self.state.renewed(lease_id, expires_at, now)
                else:
                    log.warning("lease %s was re-issued to another replica; dropping its prompt", lease_id)
                    held.task.cancel()

    async def deliver(self, lease: Lease, group: Group) -> None:
        """Pushes the group; the queue completes its lease in the transaction that stores it, so no
        answer lost after that (a Redis restart, a cut link) can have the prompt generated twice."""
        await self.queue.push([group], timeout_s=self.push_timeout_s)

    async def give_back(self, lease: Lease, reason: str, min_start_version: int = 0) -> None:
        """Returns a lease whose group will not be pushed, so its prompt is leased again at once.

        While the queue cannot be reached the give-back is retried until the lease would have
        expired anyway (then the queue re-issues it by itself).
        """
        held = self.state.held_lease(lease.lease_id)
        expires_at = held.expires_at if held else lease.expires_at
        policy = RetryPolicy(
            attempts=None,
            deadline_s=max(expires_at - time.time(), LEASE_CHECK_MIN_S),
            first_wait_s=QUEUE_RETRY.first_wait_s,
            max_wait_s=QUEUE_RETRY.max_wait_s,
        )
        with self.stalls.waiting("an answer", "queue") as wait:
            try:
                async for attempt in retrying(f"give back lease {lease.lease_id}", any_error, policy, log):
                    with attempt:
                        wait.tick()
                        _, dropped = await self.queue.abandon(
                            self.replica_id, [lease.lease_id], reason, max(min_start_version, 0)
                        )
            except Exception as exc:
                log.warning("could not give back lease %s (%r); it expired and will be re-issued", lease.lease_id, exc)
                return
        self.metrics.abandoned_leases.labels(reason=reason).inc()
        if dropped:
            log.warning("prompt %s was given back too often and was dropped (%s)", lease.prompt.prompt_id, reason)
