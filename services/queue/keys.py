"""Every Redis key the queue service uses, namespaced by run id: ``relayrl:{run_id}:<name>``."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The trainer's consumer group on the trajectory stream.
TRAINER_GROUP = "trainers"

# A stream entry id's shape, ``<ms>-<seq>`` (an HTTP route's pattern too). ASCII digits only: ``\d``
# also takes other scripts' digits, which Redis refuses.
ENTRY_ID_PATTERN = r"([0-9]{1,20})-([0-9]{1,20})"
_ENTRY_ID = re.compile(ENTRY_ID_PATTERN)


def is_entry_id(text: str) -> bool:
    """Whether Redis takes ``text`` as a stream entry id: ``<ms>-<seq>``, each part below 2**64
    (a larger one is Redis's ``Invalid stream ID`` error, which a client must see as its own)."""
    match = _ENTRY_ID.fullmatch(text)
    return match is not None and all(int(part) < 1 << 64 for part in match.groups())


@dataclass(frozen=True, slots=True)
class Keys:
    run_id: str

    def _key(self, name: str) -> str:
        return f"relayrl:{self.run_id}:{name}"

    # Trajectory queue.
    @property
    def trajectories(self) -> str:
        """Stream of accepted groups: exactly the queued + delivered-not-acknowledged ones."""
        return self._key("trajectories")

    @property
    def pushed_groups(self) -> str:
        """Sorted set group id → push time (unix s) of the groups pushed without a lease, for a day:
        a push of one of them again (a retry whose first answer was lost) stores nothing."""
        return self._key("pushed_groups")

    @property
    def push_reservations(self) -> str:
        """Sorted set "token:groups" → expiry (ms): room held by pushes between check and append."""
        return self._key("push_reservations")

    @property
    def room_bell(self) -> str:
        """Pub/sub channel: an ack or a drop freed room in the stream (wakes pushes at capacity)."""
        return self._key("bell:room")

    @property
    def stale(self) -> str:
        """Stream of groups dropped by the staleness check, with the reason and versions."""
        return self._key("stale")

    @property
    def dead_letter(self) -> str:
        """Stream of malformed or too-often-delivered entries, with the reason."""
        return self._key("dead_letter")

    @property
    def stats(self) -> str:
        """Hash of durable counters (produced, consumed, delivered, dropped:<reason>)."""
        return self._key("stats")

    @property
    def consumers(self) -> str:
        """Hash consumer name → unix seconds of its last pull or ack (liveness)."""
        return self._key("consumers")

    @property
    def sessions(self) -> str:
        """Hash consumer name → session id of the process currently using that name."""
        return self._key("sessions")

    @property
    def redeliver_from(self) -> str:
        """Hash consumer name → id after which its own pending entries are still to be re-delivered."""
        return self._key("redeliver_from")

    # Prompt queue.
    @property
    def prompt_seq(self) -> str:
        return self._key("prompts:seq")

    def prompt_release(self, release_id: str) -> str:
        """String: how many prompts the release ``release_id`` put out (expires; see ``ReleaseRequest``)."""
        return self._key(f"prompts:release:{release_id}")

    @property
    def prompt_bell(self) -> str:
        """Pub/sub channel: prompts became leasable (released or given back; wakes blocked leases)."""
        return self._key("bell:prompts")

    @property
    def prompts_waiting(self) -> str:
        """Sorted set prompt key → min_start_version: released and not leased."""
        return self._key("prompts:waiting")

    @property
    def prompts_leased(self) -> str:
        """Sorted set prompt key → lease expiry (unix seconds)."""
        return self._key("prompts:leased")

    @property
    def prompt_data(self) -> str:
        """Hash prompt key → serialized PromptGroup; present until the prompt is completed."""
        return self._key("prompts:data")

    @property
    def prompt_min_start(self) -> str:
        """Hash prompt key → min_start_version (to put an expired lease back in the waiting set)."""
        return self._key("prompts:min_start")

    @property
    def prompt_deliveries(self) -> str:
        """Hash prompt key → times leased."""
        return self._key("prompts:deliveries")

    @property
    def prompt_owner(self) -> str:
        """Hash prompt key → replica holding its current lease."""
        return self._key("prompts:owner")

    @property
    def prompt_abandons(self) -> str:
        """Hash prompt key → times its lease was given back (Abandon)."""
        return self._key("prompts:abandons")

    @property
    def rollbacks(self) -> str:
        """Hash checkpoint version K → resumed version R of each trainer rollback (relayrl.staleness.Rollback)."""
        return self._key("rollbacks")

    @property
    def prompt_stats(self) -> str:
        """Hash of durable counters (released, completed, reissued, abandoned:<reason>, dropped:<reason>)."""
        return self._key("prompts:stats")
