"""Where one trajectory-queue entry is: ``GET /control/entries/{entry_id}`` (bearer token).

- ``queued``: still in the stream (waiting, or delivered to the trainer and not yet acknowledged:
  the trainer acknowledges what it trained only after a durable checkpoint);
- ``dropped``: the queue dropped it with ``reason`` and ``detail`` (stale at the consumer's
  version, malformed, delivered too often), found in the ``stale`` / ``dead_letter`` streams
  (each capped at ``dead_letter_maxlen``);
- ``gone``: acknowledged by the trainer, which trained it or dropped it itself: its
  ``GET /control/groups/{group_id}`` says which.

``relayrl ctl group`` asks this after the rollout that pushed the group and before the trainer.
"""

from __future__ import annotations

from typing import Annotated, Any

import redis.asyncio as aioredis
from fastapi import APIRouter, Path
from pydantic import AfterValidator

from services.queue.keys import ENTRY_ID_PATTERN, Keys, is_entry_id


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def entry_status(redis: aioredis.Redis, keys: Keys, entry_id: str, scan: int) -> dict[str, Any]:
    if await redis.xrange(keys.trajectories, entry_id, entry_id, count=1):
        return {"entry_id": entry_id, "status": "queued"}
    for stream in (keys.stale, keys.dead_letter):
        for _, fields in await redis.xrevrange(stream, count=scan):
            if _text(fields.get(b"source_entry_id", b"")) == entry_id:
                reason, detail = _text(fields.get(b"reason", b"")), _text(fields.get(b"detail", b""))
                return {"entry_id": entry_id, "status": "dropped", "reason": reason, "detail": detail}
    return {"entry_id": entry_id, "status": "gone"}


def _stream_id(text: str) -> str:
    if not is_entry_id(text):
        raise ValueError("not a stream entry id: want '<ms>-<seq>', each part a number below 2**64")
    return text


def entries_router(redis: aioredis.Redis, keys: Keys, scan: int) -> APIRouter:
    router = APIRouter()

    # A Redis stream id, so anything else is a 422 rather than Redis's error as a 500.
    @router.get("/entries/{entry_id}")
    async def entry(
        entry_id: Annotated[str, Path(pattern=f"^{ENTRY_ID_PATTERN}$"), AfterValidator(_stream_id)],
    ) -> dict[str, Any]:
        """Whether the entry is queued, dropped by the queue (with the reason) or gone (acknowledged)."""
        return await entry_status(redis, keys, entry_id, scan)

    return router
