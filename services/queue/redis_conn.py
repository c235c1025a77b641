"""Building the asyncio Redis client from settings: URL, ACL user/password, TLS, persistence."""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from services.queue.config import QueueSettings

log = logging.getLogger(__name__)


def connect(settings: QueueSettings) -> aioredis.Redis:
    """A client for binary payloads (no response decoding); connections open lazily."""
    url = settings.redis_url
    if settings.redis_tls and url.startswith("redis://"):
        url = "rediss://" + url.removeprefix("redis://")
    kwargs: dict[str, Any] = {"decode_responses": False, "socket_connect_timeout": settings.redis_connect_timeout_s}
    if settings.redis_username:
        kwargs["username"] = settings.redis_username
    if settings.redis_password.get_secret_value():
        kwargs["password"] = settings.redis_password.get_secret_value()
    if url.startswith("rediss://"):
        if settings.redis_tls_ca_file:
            kwargs["ssl_ca_certs"] = settings.redis_tls_ca_file
        if settings.redis_tls_cert_file:
            kwargs["ssl_certfile"] = settings.redis_tls_cert_file
            kwargs["ssl_keyfile"] = settings.redis_tls_key_file or None
    return aioredis.Redis.from_url(url, **kwargs)


async def apply_persistence(client: aioredis.Redis, appendfsync: str) -> None:
    """Turns on AOF with ``appendfsync`` when asked; managed Redis may refuse CONFIG, which we log."""
    if not appendfsync:
        return
    try:
        await client.config_set("appendonly", "yes")
        await client.config_set("appendfsync", appendfsync)
    except ResponseError as err:
        log.warning("could not set appendfsync=%s on Redis (%s); configure persistence on the server", appendfsync, err)
    else:
        log.info("Redis AOF on with appendfsync=%s", appendfsync)


async def redis_reachable(client: aioredis.Redis) -> bool:
    try:
        return bool(await client.ping())
    except Exception:
        return False
