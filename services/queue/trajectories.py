"""The trajectory queue: one Redis Stream per run, read by the trainer through a consumer group.

Redis layout (keys in :mod:`services.queue.keys`):

- ``trajectories`` stream. Each entry is one group: header fields ``v_min``, ``v_max``
  (policy versions), ``gid``, ``n`` (samples), ``tokens`` (response tokens), ``t`` (push
  time, unix s), ``eval``, ``eta`` (the η the group's prompt was admitted under, when it carries
  one: the bound it is judged by), ``digest`` and the serialized ``TrajectoryGroup`` as ``payload``,
  so the staleness check reads the header without decoding the payload. Eval groups share it.
  ``digest`` (XXH3-64, ~6× cheaper than zlib's CRC-32 here) covers the payload and ``v_min``
  as validated at push: a pull re-runs the (per-token, costly) validation only for entries
  whose digest does not match, i.e. whatever did not come through Push intact (garbage
  written straight into Redis). Payload bytes are stored as received and handed out as stored
  (see :mod:`services.queue.wire`).
- A push first reserves room with a small Lua script (``XLEN + reserved + n <= capacity``,
  reservations in the ``push_reservations`` sorted set), then appends all its groups in one
  MULTI transaction that also drops its reservation; so concurrent producers can never
  overshoot capacity. Payloads never pass through Lua: copying 0.5 MB into the Lua VM and
  out again cost Redis three times the CPU of the appends themselves. A reservation expires
  after ``RESERVATION_TTL_MS``, so a service that dies between the two steps frees it.
- The same transaction completes the prompt of each group that carries its lease id
  (``_PUSHED_LUA``), and deletes again a group whose prompt was finished already: another group
  answered it, or it was dropped. Pushed first and completed in a second call, a prompt whose
  ``complete`` (or push reply) was lost in a Redis restart or a network cut was given back and
  generated again, and its second group stayed one group more than the trainer released for:
  a surplus that never drains, since every drop is made up for, and that the trainer met as one
  or more stale groups at every step for the rest of the run. A group without a lease (an OpenAI
  agent's) is deleted again when its group id was pushed in the last day: a retried push whose
  first answer was lost would otherwise store it twice, and a trainer holding both copies would
  train on it twice. ``produced`` counts the groups kept; the deleted ones count in
  ``duplicates`` (never as a drop, which the trainer replaces).
- An ack is one Lua script: ``XACK`` and, only for entries that were pending, ``XDEL``.
  Acknowledged entries are trimmed at once and nothing else is ever trimmed, so ``XLEN`` is
  exactly queued + pending groups (what capacity bounds) and no unacknowledged entry can be
  trimmed away (there is no ``MAXLEN`` on this stream).
- Dropped entries are copied to the ``stale`` stream (staleness verdicts) or the
  ``dead_letter`` stream (``malformed``, ``max_deliveries``) with the reason, then acked and
  deleted, in one MULTI transaction; counters live in the ``stats`` hash, so they survive a
  restart of the service.

Re-delivery, in the order a pull serves it:

0. Entries read for a pull whose reply never reached the consumer (client deadline or
   disconnect) are handed back to the same consumer on its next pull. Kept in the service's
   memory; when the service instance died with the reply (or Redis died after the read), the
   consumer finds more entries pending for it than it holds, says which it holds (``held``),
   and gets the others. Everything else below is kept in Redis, so several service instances
   may share a run.
1. A consumer name seen with a new session id (a restarted trainer) first gets its own
   pending entries again (``XREADGROUP`` from id 0, then onward), before anything new.
2. Pending entries of *another* consumer are claimed (``XCLAIM``) only when that consumer
   has neither pulled nor acked for ``consumer_idle_timeout_s``. The trainer acks only when
   a checkpoint is durable, so a live trainer keeps entries pending for many steps; entry
   idle time alone (``XAUTOCLAIM``) would steal them from it mid-run.
3. New entries (``XREADGROUP >``), blocking up to the pull's timeout.

An entry delivered more than ``max_deliveries`` times is dead-lettered, never delivered again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import xxhash
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from relayrl.staleness import Rollback, Verdict, admitted_bound, check_staleness, lineage_version, rollbacks_from_pairs
from services.queue.ages import AgeSummary, AgeWindow
from services.queue.bells import Bells, wait_for_ring
from services.queue.config import QueueSettings
from services.queue.errors import BadRequest, QueueFull
from services.queue.groupcheck import GroupHeader, inspect_group
from services.queue.keys import TRAINER_GROUP, Keys, is_entry_id
from services.queue.lengths import LengthSummary, LengthWindow
from services.queue.prompts import COMPLETE_PROMPT_LUA, prompt_key, script_keys

log = logging.getLogger(__name__)

# The drops for age: past the bound, from a version no one recorded, or from weights a resume rolled back.
AGE_DROP_REASONS = ("stale", "missing_version", "rolled_back")
DROP_REASONS = (*AGE_DROP_REASONS, "malformed", "max_deliveries")
MAX_CONSUMER_NAME = 200

RESERVATION_TTL_MS = 30_000
# How long the id of a group pushed without a lease is remembered: far longer than any retry of its push.
PUSHED_GROUP_TTL_S = 86_400

# KEYS: stream, reservations. ARGV: capacity, count, token, ttl_ms. Members are "token:count",
# scored by expiry (Redis time, ms). Returns 1 when the room is reserved, 0 when it is not there.
_RESERVE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local held = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  held = held + tonumber(string.match(member, ':(%d+)$'))
end
if redis.call('XLEN', KEYS[1]) + held + tonumber(ARGV[2]) > tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3] .. ':' .. ARGV[2])
return 1
"""

# Runs in the push's MULTI right after its XADDs. KEYS: the prompt scripts' eight
# (services.queue.prompts.script_keys), prompt seq, stream, stats, room bell, pushed groups. ARGV:
# now (unix s), how long a lease-less group's id is remembered (s), then the prompt key ('' for a
# group without a lease) and group id of each group appended, in order. Completes each group's
# prompt; a group whose prompt is finished already (completed or dropped: its key is at most the
# last one released and has no data), or a lease-less group whose id was pushed already, is a
# duplicate and is deleted. Returns the duplicates' positions (1-based).
_PUSHED_LUA = (
    COMPLETE_PROMPT_LUA
    + """
local now = tonumber(ARGV[1])
local n = (#ARGV - 2) / 2
local released = tonumber(redis.call('GET', KEYS[9]) or '0')
local done, dups, forgotten = 0, {}, false
for i = 1, n do
  local k, gid = ARGV[2 * i + 1], ARGV[2 * i + 2]
  if k ~= '' then
    if complete_prompt(k) == 1 then
      done = done + 1
    elseif tonumber(k) <= released then
      table.insert(dups, i)
    end
  else
    if not forgotten then
      redis.call('ZREMRANGEBYSCORE', KEYS[13], '-inf', now - tonumber(ARGV[2]))
      forgotten = true
    end
    if redis.call('ZADD', KEYS[13], 'NX', now, gid) == 0 then table.insert(dups, i) end
  end
end
if done > 0 then redis.call('HINCRBY', KEYS[4], 'completed', done) end
if #dups > 0 then
  -- Only duplicates read entries back into Lua: the last n are the ones this MULTI appended.
  local appended = redis.call('XREVRANGE', KEYS[10], '+', '-', 'COUNT', n)
  for _, i in ipairs(dups) do redis.call('XDEL', KEYS[10], appended[n - i + 1][1]) end
  redis.call('HINCRBY', KEYS[11], 'duplicates', #dups)
  redis.call('PUBLISH', KEYS[12], #dups)
end
if n > #dups then redis.call('HINCRBY', KEYS[11], 'produced', n - #dups) end
return dups
"""
)

# KEYS: stream, stats, consumers, room bell. ARGV: group, consumer, now, then entry ids. Stamps
# the consumer as alive; deletes only what this call acknowledged, and rings pushes waiting for room.
_ACK_LUA = """
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
local acked = 0
for i = 4, #ARGV do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i]) == 1 then
    redis.call('XDEL', KEYS[1], ARGV[i])
    acked = acked + 1
  end
end
if acked > 0 then
  redis.call('HINCRBY', KEYS[2], 'consumed', acked)
  redis.call('PUBLISH', KEYS[4], acked)
end
return acked
"""

# KEYS: rollbacks, prompts waiting, prompt min_start. ARGV: checkpoint version, resumed version.
# Records the rollback (the widest one from a checkpoint version), then raises every waiting
# prompt's earliest start to the resumed version. Returns how many prompts were raised.
_ROLLBACK_LUA = """
local before = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or ARGV[1])
if tonumber(ARGV[2]) > before then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
local held = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[2])
for _, k in ipairs(held) do
  redis.call('ZADD', KEYS[2], ARGV[2], k)
  redis.call('HSET', KEYS[3], k, ARGV[2])
end
return #held
"""

# KEYS: consumers, sessions, redeliver_from. ARGV: consumer, now, session id. The start of
# every pull: stamps the consumer as alive, notes a new session (a restarted consumer: its own
# pending entries are re-delivered from id 0) and returns {restarted, redelivery cursor}.
# New entries are read by a plain XREADGROUP: read inside a script, every payload would be
# copied into Lua and back, which costs more than the round trip it saves.
_BEGIN_PULL_LUA = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local restarted = 0
if ARGV[3] ~= '' then
  local previous = redis.call('HGET', KEYS[2], ARGV[1])
  if previous ~= ARGV[3] then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
    if previous then
      redis.call('HSET', KEYS[3], ARGV[1], '0')
      restarted = 1
    end
  end
end
return {restarted, redis.call('HGET', KEYS[3], ARGV[1])}
"""


@dataclass(frozen=True, slots=True)
class Delivery:
    entry_id: str
    # The serialized TrajectoryGroup, exactly as stored.
    payload: bytes
    delivery_count: int
    age_versions: int


@dataclass(frozen=True, slots=True)
class PullResult:
    deliveries: list[Delivery]
    dropped_stale: int


@dataclass(frozen=True, slots=True)
class TrajectoryStats:
    queue_size: int
    pending: int
    capacity: int
    total_produced: int
    total_consumed: int
    total_delivered: int
    dropped_by_reason: dict[str, int]
    # Groups deleted at their push because their prompt was finished already (see _PUSHED_LUA).
    duplicates: int
    stale_samples_ratio: float
    ages: AgeSummary
    lengths: LengthSummary


@dataclass(frozen=True, slots=True)
class _RawEntry:
    entry_id: str
    # None when the entry was deleted while still pending (nothing left to deliver).
    fields: dict[bytes, bytes] | None
    delivery_count: int


def _entries(reply: Any) -> list[tuple[Any, Any]]:
    """The (id, fields) pairs of a one-stream XREADGROUP reply, RESP2 or RESP3."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return next(iter(reply.values()))[0]
    return reply[0][1]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def payload_digest(payload: bytes, v_min: int) -> int:
    """XXH3-64 over the staleness header the payload was validated with and the payload."""
    hasher = xxhash.xxh3_64(str(v_min).encode())
    hasher.update(payload)
    return hasher.intdigest()


def entry_fields(header: GroupHeader, payload: bytes, now: float) -> dict[str, Any]:
    """The header fields and payload of one stream entry (``eta`` only for a group that carries the η
    its prompt was admitted under)."""
    admitted = {} if header.max_staleness is None else {"eta": header.max_staleness}
    return {
        **admitted,
        "v_min": header.min_policy_version,
        "v_max": header.max_policy_version,
        "gid": header.group_id,
        "n": header.samples,
        "tokens": header.response_tokens,
        "t": repr(header.created_at_unix_s or now),
        "eval": int(header.is_eval),
        "digest": payload_digest(payload, header.min_policy_version),
        "payload": payload,
    }


class TrajectoryQueue:
    def __init__(self, redis: aioredis.Redis, settings: QueueSettings, bells: Bells) -> None:
        self._redis = redis
        self._settings = settings
        self._bells = bells
        self._keys = Keys(settings.run_id)
        self._reserve_script = redis.register_script(_RESERVE_LUA)
        self._ack_script = redis.register_script(_ACK_LUA)
        self._rollback_script = redis.register_script(_ROLLBACK_LUA)
        self._ages = AgeWindow(settings.age_window)
        self._lengths = LengthWindow(settings.length_window)
        # consumer → entry ids read for it whose pull reply was never received.
        self._undelivered: dict[str, list[str]] = {}
        # consumer → the session id for which Redis last showed it no redelivery cursor. A
        # cursor appears only when a consumer shows up with a new session, so a pull with the
        # same session reads new entries in its first round trip.
        self._no_cursor: dict[str, str] = {}
        self._next_reclaim_check = 0.0
        # Deliveries not yet added to the ``delivered`` counter: added by the next pull's first
        # round trip or the next stats read, which saves a round trip on every pull.
        self._delivered_unrecorded = 0

    async def ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(self._keys.trajectories, TRAINER_GROUP, id="0", mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    # Push -------------------------------------------------------------------------------

    async def push(self, payloads: list[bytes], timeout_s: float) -> list[str]:
        """Stores serialized groups, all or none, waiting up to ``timeout_s`` for capacity."""
        if not payloads:
            raise BadRequest("push carries no groups")
        cap = self._settings.capacity
        if len(payloads) > cap:
            raise BadRequest(f"push of {len(payloads)} groups can never fit the capacity of {cap} groups")
        if not timeout_s >= 0:  # also NaN, which would poison the wait's deadline
            raise BadRequest(f"timeout_s must be a number >= 0, got {timeout_s}")
        headers = await self._validated(payloads)
        now = time.time()
        entries = [entry_fields(header, payload, now) for header, payload in zip(headers, payloads, strict=True)]
        wait_s = min(timeout_s or self._settings.push_timeout_s, self._settings.max_push_timeout_s)
        deadline = time.monotonic() + wait_s
        token = uuid.uuid4().hex
        keys = [self._keys.trajectories, self._keys.push_reservations]
        while True:
            rung = self._bells.waiter(self._keys.room_bell)
            if await self._reserve_script(keys=keys, args=[cap, len(entries), token, RESERVATION_TTL_MS]):
                entry_ids = await self._append(entries, f"{token}:{len(entries)}", headers)
                for header in headers:
                    if not header.is_eval:
                        self._lengths.add(header.response_lengths)
                return entry_ids
            left = deadline - time.monotonic()
            if left <= 0:
                raise QueueFull(
                    f"queue stayed at its capacity of {cap} groups (queued + unacknowledged) for {wait_s:g}s;"
                    f" none of the {len(headers)} groups was stored"
                )
            await wait_for_ring(rung, min(left, self._settings.poll_interval_s))

    async def _append(self, entries: list[dict[str, Any]], reservation: str, headers: list[GroupHeader]) -> list[str]:
        """Appends the entries, completes their prompts and frees their reservation in one
        transaction: all or none. Entries answering a prompt finished already are deleted in it."""
        k = self._keys
        pipe = self._redis.pipeline(transaction=True)
        for fields in entries:
            pipe.xadd(k.trajectories, fields)
        pipe.zrem(k.push_reservations, reservation)
        keys = [*script_keys(k), k.prompt_seq, k.trajectories, k.stats, k.room_bell, k.pushed_groups]
        args = [repr(time.time()), PUSHED_GROUP_TTL_S]
        for header in headers:
            args += [prompt_key(header.lease_id), header.group_id]
        # EVAL, not EVALSHA: a pipeline holding a registered script first asks SCRIPT EXISTS.
        pipe.eval(_PUSHED_LUA, len(keys), *keys, *args)
        replies = await pipe.execute()
        entry_ids = [_text(i) for i in replies[: len(entries)]]
        for position in replies[-1]:
            header = headers[int(position) - 1]
            if header.lease_id:
                log.warning(
                    "group %s answers lease %s, whose prompt was finished already: not stored (a duplicate)",
                    header.group_id,
                    header.lease_id,
                )
            else:
                log.warning("group %s was pushed already: not stored again (a duplicate)", header.group_id)
        return entry_ids

    async def _validated(self, payloads: list[bytes]) -> list[GroupHeader]:
        headers, problems = [], []
        for i, payload in enumerate(payloads):
            found = inspect_group(payload)
            if found.header is None:
                problems.append(f"group {i}: {'; '.join(found.problems)}")
                await self._dead_letter_rejected(payload, found.problems)
            else:
                headers.append(found.header)
        if problems:
            raise BadRequest("malformed trajectory groups, nothing stored: " + " | ".join(problems))
        return headers

    async def _dead_letter_rejected(self, payload: bytes, problems: list[str]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        fields = {"reason": "malformed", "detail": "; ".join(problems), "source": "push"}
        fields["payload"] = payload
        pipe.xadd(self._keys.dead_letter, fields, maxlen=self._settings.dead_letter_maxlen, approximate=True)
        pipe.hincrby(self._keys.stats, "dropped:malformed", 1)
        await pipe.execute()

    # Pull -------------------------------------------------------------------------------

    async def pull(
        self,
        consumer: str,
        session_id: str,
        current_version: int,
        max_staleness: int,
        max_groups: int,
        block_timeout_s: float,
        held: Collection[str] | None = None,
    ) -> PullResult:
        """Up to ``max_groups`` groups for ``consumer``, owed ones first (see the module's re-delivery order).

        ``held``: the entries the consumer holds unacknowledged, when it sees more pending for it
        than that; the others pending to it are owed (:meth:`_owed_to`).
        """
        self._check_pull_args(consumer, current_version, max_staleness, max_groups, block_timeout_s)
        if held is not None and len(held) > self._settings.capacity:
            cap = self._settings.capacity
            raise BadRequest(f"held lists {len(held)} entries; no consumer holds more than capacity={cap}")
        deadline = time.monotonic() + min(block_timeout_s, self._settings.max_block_timeout_s)
        # New entries come last: read them up front only when nothing can be owed first.
        read_now = (
            held is None
            and self._no_cursor.get(consumer) == session_id
            and not self._undelivered.get(consumer)
            and not self._reclaim_due()
        )
        rollbacks = await self.rollbacks()
        cursor, batch = await self._begin_pull(consumer, session_id, max_groups if read_now else 0)
        if held is not None and cursor is None:  # a cursor walks every pending entry anyway
            self._undelivered[consumer] = await self._owed_to(consumer, held)
        delivered: list[Delivery] = []
        dropped_stale = 0
        while True:
            want = max_groups - len(delivered)
            if not batch:
                batch = await self._undelivered_first(consumer, want)
            if not batch and cursor is not None:
                batch, cursor = await self._own_pending(consumer, want, cursor)
            batch = (
                batch or await self._reclaim_from_dead(consumer, want) or await self._read_new(consumer, want, deadline)
            )
            for raw in batch:
                outcome = await self._judge(consumer, raw, current_version, max_staleness, rollbacks)
                if isinstance(outcome, Delivery):
                    delivered.append(outcome)
                elif outcome in AGE_DROP_REASONS:
                    dropped_stale += 1
            # A batch that was all stale says nothing about what follows it: keep reading.
            if delivered or (not batch and time.monotonic() >= deadline):
                break
            batch = []
        self._delivered_unrecorded += len(delivered)
        return PullResult(delivered, dropped_stale)

    def not_received(self, consumer: str, deliveries: list[Delivery]) -> None:
        """Records that a pull's reply never reached ``consumer``: its next pull gets these again."""
        if deliveries:
            log.warning("pull reply to %s was not received: %d entries will be re-delivered", consumer, len(deliveries))
            self._undelivered.setdefault(consumer, []).extend(d.entry_id for d in deliveries)

    async def _owed_to(self, consumer: str, held: Collection[str]) -> list[str]:
        """The entries pending to ``consumer`` that it does not hold, oldest first.

        Entries read for a pull are pending to the consumer from that read on. When the service
        instance dies before its reply reaches the consumer (or Redis dies after the read, before
        answering it), nothing remembers them (:meth:`not_received` is memory): a live consumer
        never restarts its session, so they stayed pending to it for good, and a trainer waiting
        for them waited for good. Only the consumer knows what it holds.
        """
        pending = await self._redis.xpending_range(
            self._keys.trajectories, TRAINER_GROUP, "-", "+", self._settings.capacity, consumername=consumer
        )
        kept = set(held)
        owed = [i for i in (_text(p["message_id"]) for p in pending) if i not in kept]
        if owed:
            log.warning(
                "consumer %s holds %d of the %d entries pending to it: the other %d were read for replies it never "
                "received, and are delivered again",
                consumer,
                len(pending) - len(owed),
                len(pending),
                len(owed),
            )
        return owed

    async def _undelivered_first(self, consumer: str, want: int) -> list[_RawEntry]:
        ids = self._undelivered.get(consumer)
        if not ids:
            return []
        taken, self._undelivered[consumer] = ids[:want], ids[want:]
        ordered = sorted(taken, key=_id_order)
        pending = await self._redis.xpending_range(
            self._keys.trajectories, TRAINER_GROUP, ordered[0], ordered[-1], 10 * len(taken), consumername=consumer
        )
        # Only entries this consumer still holds: acked or reclaimed ones are someone else's now.
        counts = {_text(p["message_id"]): int(p["times_delivered"]) + 1 for p in pending}
        owned = [i for i in taken if i in counts]
        if not owned:
            return []
        # Claiming to the same consumer re-reads the entries and counts the delivery.
        claimed = await self._redis.xclaim(self._keys.trajectories, TRAINER_GROUP, consumer, 0, owned)
        return [_RawEntry(_text(i), fields or None, counts[_text(i)]) for i, fields in claimed]

    def _check_pull_args(
        self, consumer: str, current_version: int, max_staleness: int, max_groups: int, block_timeout_s: float
    ) -> None:
        if not consumer or len(consumer) > MAX_CONSUMER_NAME or not consumer.isprintable():
            raise BadRequest(f"consumer must be a printable name of 1..{MAX_CONSUMER_NAME} characters")
        if current_version < 0:
            raise BadRequest(f"current_version must be >= 0, got {current_version}")
        if max_staleness < 0:
            raise BadRequest(f"max_staleness must be >= 0, got {max_staleness}")
        if not 1 <= max_groups <= self._settings.max_groups_per_pull:
            raise BadRequest(f"max_groups must be in 1..{self._settings.max_groups_per_pull}, got {max_groups}")
        if not block_timeout_s >= 0:  # also NaN, which would poison the wait's deadline
            raise BadRequest(f"block_timeout_s must be a number >= 0, got {block_timeout_s}")

    async def _begin_pull(self, consumer: str, session_id: str, count: int) -> tuple[str | None, list[_RawEntry]]:
        """Runs ``_BEGIN_PULL_LUA`` and, when ``count`` > 0, reads new entries in the same round trip.

        Returns the consumer's redelivery cursor and the new entries to judge. Should a cursor
        turn up all the same (another service instance saw this consumer restart), what was
        read stays pending on this consumer after the cursor, and the walk through its own
        pending entries delivers it in order.
        """
        keys = [self._keys.consumers, self._keys.sessions, self._keys.redeliver_from]
        pipe = self._redis.pipeline(transaction=False)
        recorded = self._record_deliveries(pipe)
        # EVAL, not EVALSHA: a pipeline holding a registered script first asks SCRIPT EXISTS.
        pipe.eval(_BEGIN_PULL_LUA, len(keys), *keys, consumer, repr(time.time()), session_id)
        if count:
            pipe.xreadgroup(TRAINER_GROUP, consumer, {self._keys.trajectories: ">"}, count=count)
        try:
            replies = await pipe.execute()
        except Exception as err:
            self._delivered_unrecorded += recorded
            if not isinstance(err, ResponseError) or not _stream_gone(err):
                raise
            # The stream was deleted under us (FLUSHALL, a manual DEL): start afresh.
            await self.ensure_group()
            return await self._begin_pull(consumer, session_id, 0)
        replies = replies[1:] if recorded else replies
        (restarted, cursor), new = replies[0], replies[1] if count else None
        if restarted:
            log.info("consumer %s restarted (new session): re-delivering its pending entries first", consumer)
            # Entries its previous session never received are among them: owed twice, they would be
            # delivered twice (and the stale copy dropped while the other was trained).
            self._undelivered.pop(consumer, None)
        if cursor is not None:
            self._no_cursor.pop(consumer, None)
            return _text(cursor), []
        self._no_cursor[consumer] = session_id
        return None, [_RawEntry(_text(i), fields or None, 1) for i, fields in _entries(new)]

    async def _own_pending(self, consumer: str, want: int, cursor: str) -> tuple[list[_RawEntry], str | None]:
        """This consumer's pending entries after ``cursor``, and where the next read starts (None: done)."""
        reply = await self._redis.xreadgroup(TRAINER_GROUP, consumer, {self._keys.trajectories: cursor}, count=want)
        entries = _entries(reply)
        if not entries:
            await self._redis.hdel(self._keys.redeliver_from, consumer)
            return [], None
        ids = [_text(e[0]) for e in entries]
        await self._redis.hset(self._keys.redeliver_from, consumer, ids[-1])
        counts = await self._delivery_counts(consumer, ids[0], ids[-1], len(ids))
        entries_out = [
            _RawEntry(i, fields or None, counts.get(i, 1)) for i, (_, fields) in zip(ids, entries, strict=True)
        ]
        return entries_out, ids[-1]

    async def _delivery_counts(self, consumer: str, first: str, last: str, count: int) -> dict[str, int]:
        pending = await self._redis.xpending_range(
            self._keys.trajectories, TRAINER_GROUP, first, last, count, consumername=consumer
        )
        return {_text(p["message_id"]): int(p["times_delivered"]) for p in pending}

    def _reclaim_due(self) -> bool:
        return time.monotonic() >= self._next_reclaim_check

    async def _reclaim_from_dead(self, consumer: str, want: int) -> list[_RawEntry]:
        if not self._reclaim_due():
            return []
        idle_s = self._settings.consumer_idle_timeout_s
        self._next_reclaim_check = time.monotonic() + min(1.0, idle_s / 4)
        seen = await self._redis.hgetall(self._keys.consumers)
        try:
            infos = await self._redis.xinfo_consumers(self._keys.trajectories, TRAINER_GROUP)
        except ResponseError as err:
            if not _stream_gone(err):
                raise
            return []  # _read_new recreates the stream and the group
        now = time.time()
        for info in infos:
            name = _text(info["name"])
            if name == consumer or int(info["pending"]) == 0:
                continue
            last = seen.get(name.encode())
            inactive_s = now - float(last) if last is not None else int(info["idle"]) / 1000
            if inactive_s < idle_s:
                continue
            pending = await self._redis.xpending_range(
                self._keys.trajectories, TRAINER_GROUP, "-", "+", want, consumername=name
            )
            counts = {_text(p["message_id"]): int(p["times_delivered"]) + 1 for p in pending}
            # min_idle_time guards the race where the owner came back between the checks above.
            claimed = await self._redis.xclaim(
                self._keys.trajectories, TRAINER_GROUP, consumer, int(idle_s * 1000), list(counts)
            )
            if not claimed:
                continue
            log.warning(
                "consumer %s inactive for %.0fs: %d of its pending entries re-delivered to %s",
                name,
                inactive_s,
                len(claimed),
                consumer,
            )
            self._next_reclaim_check = 0.0
            return [_RawEntry(_text(i), fields or None, counts.get(_text(i), 1)) for i, fields in claimed]
        return []

    async def _read_new(self, consumer: str, want: int, deadline: float) -> list[_RawEntry]:
        block_ms = int((deadline - time.monotonic()) * 1000)
        # BLOCK 0 would mean "forever" to Redis; no BLOCK is the non-blocking read.
        block = block_ms if block_ms >= 1 else None
        try:
            reply = await self._redis.xreadgroup(
                TRAINER_GROUP, consumer, {self._keys.trajectories: ">"}, count=want, block=block
            )
        except ResponseError as err:
            if not _stream_gone(err):
                raise
            # The stream was deleted under us (FLUSHALL, a manual DEL): start afresh.
            await self.ensure_group()
            return []
        return [_RawEntry(_text(i), fields or None, 1) for i, fields in _entries(reply)]

    async def _judge(
        self, consumer: str, raw: _RawEntry, current_version: int, max_staleness: int, rollbacks: tuple[Rollback, ...]
    ) -> Delivery | str | None:
        """Delivers ``raw`` or drops it; returns the Delivery, the drop reason, or None (gone)."""
        if raw.fields is None:
            await self._redis.xack(self._keys.trajectories, TRAINER_GROUP, raw.entry_id)
            return None
        if raw.delivery_count > self._settings.max_deliveries:
            detail = f"delivered {raw.delivery_count} times (max_deliveries={self._settings.max_deliveries})"
            return await self._drop(consumer, raw, "max_deliveries", detail, self._keys.dead_letter)
        try:
            v_min = int(raw.fields[b"v_min"])
        except (KeyError, ValueError):
            return await self._drop(consumer, raw, "malformed", "missing or non-integer v_min header", None)
        stored_v_min, lineage = v_min, lineage_version(v_min, rollbacks)
        if lineage is None:
            detail = f"min_policy_version {v_min} was made by weights a trainer rollback discarded"
            return await self._drop(consumer, raw, Verdict.ROLLED_BACK.value, detail, self._keys.stale)
        # Judged along the trainer's lineage: versions a rollback skipped add nothing to the age.
        v_min = lineage
        bound = admitted_bound(_admitted_eta(raw.fields), max_staleness)
        verdict = check_staleness(v_min, current_version, bound)
        if verdict.verdict is not Verdict.FRESH:
            detail = f"min_policy_version {v_min} at consumer version {current_version}, max_staleness {bound}"
            return await self._drop(consumer, raw, verdict.verdict.value, detail, self._keys.stale)
        payload = raw.fields.get(b"payload", b"")
        # Entries that came through Push intact were validated there; anything else is checked now.
        if raw.fields.get(b"digest") != str(payload_digest(payload, stored_v_min)).encode():
            problem = _problem_with(payload, stored_v_min)
            if problem:
                return await self._drop(consumer, raw, "malformed", problem, None)
        age_versions = verdict.age_versions or 0
        self._ages.add(age_versions, max(0.0, time.time() - _pushed_at(raw)))
        return Delivery(raw.entry_id, payload, raw.delivery_count, age_versions)

    async def _drop(self, consumer: str, raw: _RawEntry, reason: str, detail: str, stream: str | None) -> str:
        assert raw.fields is not None
        fields: dict[Any, Any] = {
            b"reason": reason,
            b"detail": detail,
            b"source_entry_id": raw.entry_id,
            b"consumer": consumer,
            b"delivery_count": raw.delivery_count,
        }
        fields.update({b"field:" + k: v for k, v in raw.fields.items()})
        pipe = self._redis.pipeline(transaction=True)
        target = stream or self._keys.dead_letter
        pipe.xadd(target, fields, maxlen=self._settings.dead_letter_maxlen, approximate=True)
        pipe.xack(self._keys.trajectories, TRAINER_GROUP, raw.entry_id)
        pipe.xdel(self._keys.trajectories, raw.entry_id)
        pipe.hincrby(self._keys.stats, f"dropped:{reason}", 1)
        pipe.publish(self._keys.room_bell, 1)
        await pipe.execute()
        if stream is None or reason == "max_deliveries":
            log.warning("entry %s dead-lettered (%s): %s", raw.entry_id, reason, detail)
        else:
            log.debug("entry %s dropped (%s): %s", raw.entry_id, reason, detail)
        return reason

    def _record_deliveries(self, pipe: Pipeline) -> int:
        """Queues the increment of the ``delivered`` counter on ``pipe``; returns how much it adds."""
        count, self._delivered_unrecorded = self._delivered_unrecorded, 0
        if count:
            pipe.hincrby(self._keys.stats, "delivered", count)
        return count

    async def _read_stats(self) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        recorded = self._record_deliveries(pipe)
        pipe.xlen(self._keys.trajectories)
        pipe.xpending(self._keys.trajectories, TRAINER_GROUP)
        pipe.hgetall(self._keys.stats)
        try:
            replies = await pipe.execute()
        except Exception:
            self._delivered_unrecorded += recorded
            raise
        return replies[1:] if recorded else replies

    # Rollbacks --------------------------------------------------------------------------

    async def rollback(self, checkpoint_version: int, resumed_version: int) -> int:
        """Records a trainer rollback (relayrl.staleness.Rollback) and holds every waiting prompt back
        until ``resumed_version``; returns how many were held back."""
        if not 0 <= checkpoint_version <= resumed_version:
            raise BadRequest(
                f"need 0 <= checkpoint_version <= resumed_version, got {checkpoint_version} and {resumed_version}"
            )
        keys = [self._keys.rollbacks, self._keys.prompts_waiting, self._keys.prompt_min_start]
        return int(await self._rollback_script(keys=keys, args=[checkpoint_version, resumed_version]))

    async def rollbacks(self) -> tuple[Rollback, ...]:
        """Every rollback recorded for this run."""
        pairs = await self._redis.hgetall(self._keys.rollbacks)
        return rollbacks_from_pairs([(int(k), int(v)) for k, v in pairs.items()])

    # Ack and stats ----------------------------------------------------------------------

    async def ack(self, consumer: str, entry_ids: list[str]) -> int:
        if not consumer:
            raise BadRequest("consumer must be set")
        bad = [i for i in entry_ids if not is_entry_id(i)]
        if bad:
            raise BadRequest(f"not stream entry ids (want '<ms>-<seq>'): {bad[:5]}")
        keys = [self._keys.trajectories, self._keys.stats, self._keys.consumers, self._keys.room_bell]
        return int(await self._ack_script(keys=keys, args=[TRAINER_GROUP, consumer, repr(time.time()), *entry_ids]))

    async def stats(self) -> TrajectoryStats:
        try:
            length, pending_info, counters = await self._read_stats()
        except ResponseError as err:
            if not _stream_gone(err):
                raise
            await self.ensure_group()
            length, pending_info, counters = await self._read_stats()
        pending = int(pending_info["pending"])
        values = {_text(k): int(v) for k, v in counters.items()}
        dropped = {reason: values.get(f"dropped:{reason}", 0) for reason in DROP_REASONS}
        stale = dropped["stale"] + dropped["missing_version"]
        delivered = values.get("delivered", 0)
        return TrajectoryStats(
            queue_size=max(0, int(length) - pending),
            pending=pending,
            capacity=self._settings.capacity,
            total_produced=values.get("produced", 0),
            total_consumed=values.get("consumed", 0),
            total_delivered=delivered,
            dropped_by_reason=dropped,
            duplicates=values.get("duplicates", 0),
            stale_samples_ratio=stale / (delivered + stale) if delivered + stale else 0.0,
            ages=self._ages.summary(),
            lengths=self._lengths.summary(),
        )


def _problem_with(payload: bytes, v_min: int) -> str:
    """Why a stored payload is not a trainable group with this header; empty when it is one."""
    found = inspect_group(payload)
    if found.header is None:
        return "; ".join(found.problems)
    if found.header.min_policy_version != v_min:
        return f"header v_min {v_min} != payload min_policy_version {found.header.min_policy_version}"
    return ""


def _stream_gone(err: ResponseError) -> bool:
    return "NOGROUP" in str(err) or "no such key" in str(err)


def _admitted_eta(fields: dict[bytes, Any]) -> int | None:
    """The η an entry's prompt was admitted under (its ``eta`` header), None when it has none."""
    raw = fields.get(b"eta")
    try:
        return None if raw is None else max(int(raw), 0)
    except ValueError:
        return None


def _id_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


def _pushed_at(raw: _RawEntry) -> float:
    assert raw.fields is not None
    try:
        return float(raw.fields[b"t"])
    except (KeyError, ValueError):
        # Stream ids start with the append time in milliseconds.
        return int(raw.entry_id.split("-")[0]) / 1000
