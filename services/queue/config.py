"""Settings of the queue service, read from ``RELAYRL_QUEUE_*`` (and the shared ``RELAYRL_*``).

verl's fully-async ``max_queue_size`` is :attr:`QueueSettings.capacity`. Capacity counts
queued *and* delivered-but-unacknowledged groups; because the trainer acknowledges only
after the checkpoint that covers a step is durable, it must exceed
``batch_size × checkpoint interval (steps)`` or the trainer starves itself.

Persistence is Redis's own: run Redis with ``appendonly yes``. With ``appendfsync everysec``
(the default) a Redis crash loses at most about one second of accepted pushes; with
``appendfsync always`` an accepted push is on disk before the service answers it.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from relayrl.config import ServiceSettings, shared_field


class QueueSettings(ServiceSettings):
    service_name: ClassVar[str] = "queue"

    redis_url: str = shared_field(
        "redis_url",
        "redis://127.0.0.1:6379/0",
        "Redis URL (redis:// or rediss:// for TLS); may carry user and password.",
    )
    redis_username: str = Field("", description="Redis ACL user; empty uses the URL's or the default user.")
    redis_password: SecretStr = Field(
        SecretStr(""), description="Redis password (requirepass or the ACL user's); empty uses the URL's."
    )
    redis_tls: bool = Field(False, description="Connect to Redis over TLS (same as a rediss:// URL).")
    redis_tls_ca_file: str = Field("", description="CA bundle that signs the Redis server certificate.")
    redis_tls_cert_file: str = Field("", description="Client certificate for mutual TLS; empty: none.")
    redis_tls_key_file: str = Field("", description="Private key of redis_tls_cert_file.")
    redis_connect_timeout_s: float = Field(
        5.0, gt=0, description="Longest wait to open a Redis connection, seconds (readyz answers within it)."
    )
    redis_appendfsync: str = Field(
        "",
        pattern="^(|everysec|always|no)$",
        description="If set, the service turns on AOF with this fsync policy at start-up (CONFIG SET);"
        " empty leaves the Redis server's own persistence settings alone (managed Redis).",
    )
    capacity: int = Field(
        4096,
        ge=1,
        description="Most trajectory groups held (queued + delivered-not-acked); verl's max_queue_size."
        " Must exceed batch_size × checkpoint interval.",
    )
    push_timeout_s: float = Field(
        30.0, gt=0, description="Default wait for capacity when a Push gives timeout_s = 0, seconds."
    )
    max_push_timeout_s: float = Field(300.0, gt=0, description="Upper bound on a Push's timeout_s, seconds.")
    max_block_timeout_s: float = Field(
        60.0, gt=0, description="Upper bound on block_timeout_s of Pull and Lease, seconds."
    )
    consumer_idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A consumer that has not pulled or acked for this long is dead: its pending entries"
        " are re-delivered to other consumers.",
    )
    max_deliveries: int = Field(
        5, ge=1, description="Deliveries of one entry before it is dead-lettered as 'max_deliveries'."
    )
    max_groups_per_pull: int = Field(1024, ge=1, description="Upper bound on a Pull's max_groups.")
    dead_letter_maxlen: int = Field(
        100_000, ge=1, description="Approximate length cap of the dead-letter and stale streams (terminal data)."
    )
    lease_timeout_s: float = Field(
        600.0, gt=0, description="A prompt lease not completed within this many seconds is re-issued."
    )
    max_prompt_abandons: int = Field(
        8,
        ge=1,
        description="Times a prompt's lease may be given back (a stale drop or a failed generation) before the"
        " prompt is dropped and counted as dropped:<reason>; the trainer then releases a replacement.",
    )
    poll_interval_s: float = Field(
        1.0,
        gt=0,
        le=5,
        description="A blocked Push or Lease wakes when a release, give-back, ack or drop is published;"
        " this is only its fallback re-check, seconds, for a wake-up missed while Redis reconnected.",
    )
    age_window: int = Field(1000, ge=1, description="Deliveries averaged in the sample-age statistics.")
    length_window: int = Field(
        4096, ge=1, description="Samples pushed whose response lengths define the long answers (length bias)."
    )
    stats_refresh_s: float = Field(2.0, gt=0, description="Period of refreshing the Prometheus gauges, seconds.")
