"""The prompt queue: the trainer releases prompts, rollout replicas lease and complete them.

Why not a stream with a consumer group: a lease must skip prompts whose
``min_start_version`` is above the replica's ``held_version`` and leave them for replicas
with newer weights, and a consumer group can only hand out entries in order. So the queue
keeps released prompts in a sorted set scored by ``min_start_version`` (members are
zero-padded release sequence numbers, so equal scores lease in release order):

- ``prompts:waiting``  sorted set  key → min_start_version (released, not leased)
- ``prompts:leased``   sorted set  key → lease expiry, unix seconds
- ``prompts:data``, ``prompts:min_start``, ``prompts:deliveries``, ``prompts:owner``
  hashes keyed by prompt key; ``prompts:stats`` durable counters.

Every state change is one Lua script, so no prompt is ever in both sets, in neither while
unfinished, or handed to two replicas at once. A lease first moves expired leases back to
``waiting`` (re-issue), then takes up to ``max_prompts`` keys with score <= held_version.
Prompts a replica may not start stay in ``waiting``; nothing is lost. A lease id is
``<key>.<delivery>``; completing any lease of a prompt finishes the prompt (its group was
pushed), so a late completion by a replica whose lease had expired still counts once. The push
of a group that carries its lease id completes the prompt itself, in the transaction that stores
the group (:mod:`services.queue.trajectories`): a replica that loses the answer to its push or
to its ``complete`` and gives the lease back cannot have the prompt generated a second time. A
replica renews the leases of prompts still in flight (``renew``); a lease that was re-issued
meanwhile is not renewed, which tells the replica to drop that prompt. A replica that will not
push a group for its lease (the group was stale, or generation failed) gives the lease back
(``abandon``): the prompt waits again at once, never for the lease timeout, and is dropped
(counted) only after ``max_prompt_abandons`` give-backs.
Lease expiry is judged by the clock of the service instance handling the call, so instances
sharing a run need synchronised clocks (NTP); the lease timeout dwarfs ordinary skew.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from relayrl.v1 import trajectory_pb2 as pb
from services.queue.bells import Bells, wait_for_ring
from services.queue.config import QueueSettings
from services.queue.errors import BadRequest
from services.queue.keys import Keys
from services.queue.stats import PromptQueueStats

LEASE_ID = re.compile(r"^(\d{12})\.(\d+)$")

# KEYS: waiting, leased, min_start, stats. ARGV: now.
_REQUEUE_LUA = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, k in ipairs(expired) do
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZADD', KEYS[1], redis.call('HGET', KEYS[3], k), k)
end
if #expired > 0 then redis.call('HINCRBY', KEYS[4], 'reissued', #expired) end
"""

# KEYS: waiting, leased, min_start, stats, data, deliveries, owner.
# ARGV: now, held_version, max_prompts, expires_at, replica. Returns key, delivery, payload triples.
_LEASE_LUA = (
    _REQUEUE_LUA
    + """
local picked = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
local out = {}
for _, k in ipairs(picked) do
  redis.call('ZREM', KEYS[1], k)
  redis.call('ZADD', KEYS[2], ARGV[4], k)
  redis.call('HSET', KEYS[7], k, ARGV[5])
  table.insert(out, k)
  table.insert(out, redis.call('HINCRBY', KEYS[6], k, 1))
  table.insert(out, redis.call('HGET', KEYS[5], k))
end
return out
"""
)

# Finishes prompt k; 1 when it was unfinished, 0 when it was finished (completed or dropped) already.
# KEYS[1..8]: waiting, leased, min_start, stats, data, deliveries, owner, abandons. Shared by
# _COMPLETE_LUA and the push (services.queue.trajectories), which completes a group's prompt with it.
COMPLETE_PROMPT_LUA = """
local function complete_prompt(k)
  if redis.call('HDEL', KEYS[5], k) == 0 then return 0 end
  redis.call('ZREM', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('HDEL', KEYS[3], k)
  redis.call('HDEL', KEYS[6], k)
  redis.call('HDEL', KEYS[7], k)
  redis.call('HDEL', KEYS[8], k)
  return 1
end
"""

# KEYS: waiting, leased, min_start, stats, data, deliveries, owner, abandons. ARGV: prompt keys.
_COMPLETE_LUA = (
    COMPLETE_PROMPT_LUA
    + """
local done = 0
for _, k in ipairs(ARGV) do done = done + complete_prompt(k) end
if done > 0 then redis.call('HINCRBY', KEYS[4], 'completed', done) end
return done
"""
)


# KEYS: leased, deliveries, owner. ARGV: expires_at, replica, then key and delivery pairs.
# A lease is extended only while nobody else can hold it: still in ``leased``, same owner,
# same delivery (an expired lease not yet re-issued is still this replica's alone).
_RENEW_LUA = """
local renewed = {}
for i = 3, #ARGV, 2 do
  local k, d = ARGV[i], ARGV[i + 1]
  if redis.call('ZSCORE', KEYS[1], k) and redis.call('HGET', KEYS[3], k) == ARGV[2]
      and redis.call('HGET', KEYS[2], k) == d then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], k)
    table.insert(renewed, k .. '.' .. d)
  end
end
return renewed
"""


# KEYS: waiting, leased, min_start, stats, data, deliveries, owner, abandons, bell channel.
# ARGV: replica, reason, min_start_version, max_abandons, all_held (1/0), then key and delivery
# pairs. Only a lease this replica still holds is given back (as in renew); with all_held, every
# lease it holds but those the pairs name. Returns the requeued and the dropped lease ids, the
# first list's length first.
_ABANDON_LUA = """
local pairs_ = {}
if ARGV[5] == '1' then
  local keep = {}
  for i = 6, #ARGV, 2 do keep[ARGV[i] .. '.' .. ARGV[i + 1]] = true end
  local owners = redis.call('HGETALL', KEYS[7])
  for i = 1, #owners, 2 do
    local d = redis.call('HGET', KEYS[6], owners[i])
    if owners[i + 1] == ARGV[1] and not keep[owners[i] .. '.' .. tostring(d)] then
      table.insert(pairs_, owners[i])
      table.insert(pairs_, d)
    end
  end
else
  for i = 6, #ARGV do table.insert(pairs_, ARGV[i]) end
end
local requeued, dropped = {}, {}
for i = 1, #pairs_, 2 do
  local k, d = pairs_[i], pairs_[i + 1]
  if redis.call('ZSCORE', KEYS[2], k) and redis.call('HGET', KEYS[7], k) == ARGV[1]
      and redis.call('HGET', KEYS[6], k) == d then
    redis.call('ZREM', KEYS[2], k)
    redis.call('HDEL', KEYS[7], k)
    if redis.call('HINCRBY', KEYS[8], k, 1) >= tonumber(ARGV[4]) then
      for _, h in ipairs({KEYS[3], KEYS[5], KEYS[6], KEYS[8]}) do redis.call('HDEL', h, k) end
      redis.call('HINCRBY', KEYS[4], 'dropped:' .. ARGV[2], 1)
      table.insert(dropped, k .. '.' .. d)
    else
      local start = math.max(tonumber(redis.call('HGET', KEYS[3], k)), tonumber(ARGV[3]))
      redis.call('HSET', KEYS[3], k, start)
      redis.call('ZADD', KEYS[1], start, k)
      redis.call('HINCRBY', KEYS[4], 'abandoned:' .. ARGV[2], 1)
      table.insert(requeued, k .. '.' .. d)
    end
  end
end
if #requeued > 0 then redis.call('PUBLISH', KEYS[9], #requeued) end
local out = {#requeued}
for _, v in ipairs(requeued) do table.insert(out, v) end
for _, v in ipairs(dropped) do table.insert(out, v) end
return out
"""

ABANDON_REASON = re.compile(r"^[a-z_]{1,32}$")
MAX_RELEASE_ID = 64
# How long a release_id is remembered: far longer than any retry of one release.
RELEASE_ID_TTL_S = 86_400
# Each call is one Lua script, which holds Redis while it runs: bound the work one call can ask for.
MAX_PROMPTS_PER_LEASE = 1024
MAX_LEASE_IDS_PER_CALL = 4096


@dataclass(frozen=True, slots=True)
class LeaseOutcome:
    grants: list[LeaseGrant]
    # Nothing was leasable at the asked version but prompts for a newer one wait.
    newer_version_waiting: bool = False


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    lease_id: str
    prompt: pb.PromptGroup
    expires_at_unix_s: float
    delivery_count: int


class PromptQueue:
    def __init__(self, redis: aioredis.Redis, settings: QueueSettings, bells: Bells) -> None:
        self._redis = redis
        self._settings = settings
        self._bells = bells
        self._keys = Keys(settings.run_id)
        self._script_keys = script_keys(self._keys)
        self._requeue = redis.register_script(_REQUEUE_LUA)
        self._lease = redis.register_script(_LEASE_LUA)
        self._complete = redis.register_script(_COMPLETE_LUA)
        self._renew = redis.register_script(_RENEW_LUA)
        self._abandon = redis.register_script(_ABANDON_LUA)

    async def release(self, prompts: list[pb.PromptGroup], release_id: str = "") -> int:
        """Puts ``prompts`` out for leasing; returns how many. A ``release_id`` released already puts
        out nothing again and returns what the first release did (a retry whose first answer was lost)."""
        if not prompts:
            raise BadRequest("release carries no prompts")
        if len(release_id) > MAX_RELEASE_ID or not release_id.isprintable():
            raise BadRequest(f"release_id must be printable and at most {MAX_RELEASE_ID} characters")
        problems = [f"prompt {i}: {p}" for i, msg in enumerate(prompts) for p in _prompt_problems(msg)]
        if problems:
            raise BadRequest("malformed prompts, nothing released: " + "; ".join(problems))
        last = await self._redis.incrby(self._keys.prompt_seq, len(prompts))
        marker = self._keys.prompt_release(release_id) if release_id else None
        async with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    if marker is not None:
                        # Watched, so a concurrent copy of this release that stores first makes ours fail.
                        await pipe.watch(marker)
                        done = await pipe.get(marker)
                        if done is not None:
                            return int(done)
                    pipe.multi()
                    for seq, msg in zip(range(last - len(prompts) + 1, last + 1), prompts, strict=True):
                        key = f"{seq:012d}"
                        pipe.hset(self._keys.prompt_data, key, msg.SerializeToString())
                        pipe.hset(self._keys.prompt_min_start, key, msg.min_start_version)
                        pipe.zadd(self._keys.prompts_waiting, {key: msg.min_start_version})
                    pipe.hincrby(self._keys.prompt_stats, "released", len(prompts))
                    if marker is not None:
                        pipe.set(marker, len(prompts), ex=RELEASE_ID_TTL_S)
                    pipe.publish(self._keys.prompt_bell, len(prompts))
                    await pipe.execute()
                    return len(prompts)
                except WatchError:
                    continue

    async def lease(self, replica_id: str, max_prompts: int, held_version: int, block_timeout_s: float) -> LeaseOutcome:
        """Up to ``max_prompts`` prompts that may start at ``held_version``; blocks up to
        ``block_timeout_s`` for the first one, unless prompts that need a newer version wait.

        A blocked call keeps the version it was sent with. Were it to keep blocking while only
        prompts for a newer version wait, a replica whose weights move on meanwhile would sit
        out the rest of the block before it could lease them (up to ``block_timeout_s`` lost
        per weight version). So such a call returns at once and says why.
        """
        if not replica_id or not replica_id.isprintable():
            raise BadRequest("replica_id must be a printable, non-empty name")
        if not 1 <= max_prompts <= MAX_PROMPTS_PER_LEASE:
            raise BadRequest(f"max_prompts must be in 1..{MAX_PROMPTS_PER_LEASE}, got {max_prompts}")
        if held_version < 0:
            raise BadRequest(f"held_version must be >= 0, got {held_version}")
        if not block_timeout_s >= 0:  # also NaN, which would poison the wait's deadline
            raise BadRequest(f"block_timeout_s must be a number >= 0, got {block_timeout_s}")
        deadline = time.monotonic() + min(block_timeout_s, self._settings.max_block_timeout_s)
        while True:
            rung = self._bells.waiter(self._keys.prompt_bell)
            now = time.time()
            expires = now + self._settings.lease_timeout_s
            out = await self._lease(
                keys=self._script_keys, args=[repr(now), held_version, max_prompts, repr(expires), replica_id]
            )
            left = deadline - time.monotonic()
            if out or left <= 0:
                return LeaseOutcome([_grant(out[i], out[i + 1], out[i + 2], expires) for i in range(0, len(out), 3)])
            if await self._redis.zcount(self._keys.prompts_waiting, f"({held_version}", "+inf"):
                return LeaseOutcome([], newer_version_waiting=True)
            await wait_for_ring(rung, min(left, self._settings.poll_interval_s, await self._until_first_expiry()))

    async def _until_first_expiry(self) -> float:
        """Seconds until the earliest lease expires (and its prompt may be re-issued); inf if none."""
        first = await self._redis.zrange(self._keys.prompts_leased, 0, 0, withscores=True)
        return max(first[0][1] - time.time(), 0.0) if first else math.inf

    async def complete(self, replica_id: str, lease_ids: list[str]) -> int:
        if not replica_id:
            raise BadRequest("replica_id must be set")
        keys = [key for key, _ in _parse_lease_ids(lease_ids)]
        if not keys:
            return 0
        return int(await self._complete(keys=self._script_keys, args=keys))

    async def renew(self, replica_id: str, lease_ids: list[str]) -> tuple[list[str], float]:
        """Extends the leases ``replica_id`` still holds by ``lease_timeout_s``; (renewed ids, new expiry)."""
        if not replica_id:
            raise BadRequest("replica_id must be set")
        pairs = _parse_lease_ids(lease_ids)
        expires = time.time() + self._settings.lease_timeout_s
        if not pairs:
            return [], expires
        keys = [self._keys.prompts_leased, self._keys.prompt_deliveries, self._keys.prompt_owner]
        args: list[str] = [repr(expires), replica_id]
        for key, delivery in pairs:
            args += [key, delivery]
        renewed = await self._renew(keys=keys, args=args)
        return [r.decode() for r in renewed], expires

    async def abandon(
        self,
        replica_id: str,
        lease_ids: list[str],
        reason: str,
        min_start_version: int,
        all_held: bool = False,
        keep_lease_ids: list[str] | None = None,
    ) -> tuple[list[str], list[str]]:
        """Gives back leases ``replica_id`` still holds (with ``all_held``, all of them but
        ``keep_lease_ids``); (requeued, dropped) ids."""
        if not replica_id:
            raise BadRequest("replica_id must be set")
        if not ABANDON_REASON.match(reason):
            raise BadRequest(f"reason must be 1-32 lower-case letters or underscores, got {reason!r}")
        if min_start_version < 0:
            raise BadRequest(f"min_start_version must be >= 0, got {min_start_version}")
        if keep_lease_ids and not all_held:
            raise BadRequest("keep_lease_ids needs all_held: it names the leases all_held keeps")
        pairs = _parse_lease_ids(keep_lease_ids or []) if all_held else _parse_lease_ids(lease_ids)
        if not pairs and not all_held:
            return [], []
        args: list[str | int] = [
            replica_id,
            reason,
            min_start_version,
            self._settings.max_prompt_abandons,
            int(all_held),
        ]
        for key, delivery in pairs:
            args += [key, delivery]
        out = await self._abandon(keys=[*self._script_keys, self._keys.prompt_bell], args=args)
        ids = [item.decode() for item in out[1:]]
        return ids[: int(out[0])], ids[int(out[0]) :]

    async def stats(self) -> PromptQueueStats:
        await self._requeue(keys=self._script_keys[:4], args=[repr(time.time())])
        pipe = self._redis.pipeline(transaction=False)
        pipe.zcard(self._keys.prompts_waiting)
        pipe.zcard(self._keys.prompts_leased)
        pipe.hgetall(self._keys.prompt_stats)
        waiting, leased, counters = await pipe.execute()
        values = {k.decode(): int(v) for k, v in counters.items()}

        def by_reason(prefix: str) -> dict[str, int]:
            return {k.removeprefix(prefix): v for k, v in values.items() if k.startswith(prefix)}

        return PromptQueueStats(
            waiting=int(waiting),
            leased=int(leased),
            total_released=values.get("released", 0),
            total_completed=values.get("completed", 0),
            total_reissued=values.get("reissued", 0),
            abandoned_by_reason=by_reason("abandoned:"),
            dropped_by_reason=by_reason("dropped:"),
        )


def script_keys(k: Keys) -> list[str]:
    """KEYS[1..8] of the prompt scripts (and of :data:`COMPLETE_PROMPT_LUA`), in their order."""
    return [
        k.prompts_waiting,
        k.prompts_leased,
        k.prompt_min_start,
        k.prompt_stats,
        k.prompt_data,
        k.prompt_deliveries,
        k.prompt_owner,
        k.prompt_abandons,
    ]


def prompt_key(lease_id: str) -> str:
    """The prompt key of a lease id; empty for anything else (a group no lease produced)."""
    match = LEASE_ID.match(lease_id)
    return match.group(1) if match else ""


def _parse_lease_ids(lease_ids: list[str]) -> list[tuple[str, str]]:
    """(prompt key, delivery) of each lease id; BadRequest on anything else."""
    if len(lease_ids) > MAX_LEASE_IDS_PER_CALL:
        raise BadRequest(f"at most {MAX_LEASE_IDS_PER_CALL} lease ids per call, got {len(lease_ids)}")
    pairs = []
    for lease_id in lease_ids:
        match = LEASE_ID.match(lease_id)
        if match is None:
            raise BadRequest(f"not a lease id (want '<12 digits>.<delivery>'): {lease_id!r}")
        pairs.append((match.group(1), match.group(2)))
    return pairs


def _grant(key: bytes, delivery: int, payload: bytes, expires: float) -> LeaseGrant:
    prompt = pb.PromptGroup()
    prompt.ParseFromString(payload)
    return LeaseGrant(f"{key.decode()}.{int(delivery)}", prompt, expires, int(delivery))


def _prompt_problems(msg: pb.PromptGroup) -> list[str]:
    problems = []
    if not msg.prompt_id:
        problems.append("prompt_id is empty")
    if not msg.prompt_token_ids:
        problems.append("prompt_token_ids is empty")
    if any(t < 0 for t in msg.prompt_token_ids):
        problems.append("negative token id")
    if msg.n_samples < 1:
        problems.append(f"n_samples must be >= 1, got {msg.n_samples}")
    if msg.min_start_version < 0:
        problems.append(f"min_start_version must be >= 0, got {msg.min_start_version}")
    return problems
