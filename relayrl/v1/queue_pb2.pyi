from relayrl.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PushRequest(_message.Message):
    __slots__ = ("groups", "timeout_s")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.TrajectoryGroup]
    timeout_s: float
    def __init__(self, groups: _Optional[_Iterable[_Union[_trajectory_pb2.TrajectoryGroup, _Mapping]]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("entry_ids",)
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("consumer", "current_version", "max_staleness", "max_groups", "block_timeout_s", "session_id", "held")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    current_version: int
    max_staleness: int
    max_groups: int
    block_timeout_s: float
    session_id: str
    held: HeldEntries
    def __init__(self, consumer: _Optional[str] = ..., current_version: _Optional[int] = ..., max_staleness: _Optional[int] = ..., max_groups: _Optional[int] = ..., block_timeout_s: _Optional[float] = ..., session_id: _Optional[str] = ..., held: _Optional[_Union[HeldEntries, _Mapping]] = ...) -> None: ...

class HeldEntries(_message.Message):
    __slots__ = ("entry_ids",)
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeliveredGroup(_message.Message):
    __slots__ = ("entry_id", "group", "delivery_count", "age_versions")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    AGE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    group: _trajectory_pb2.TrajectoryGroup
    delivery_count: int
    age_versions: int
    def __init__(self, entry_id: _Optional[str] = ..., group: _Optional[_Union[_trajectory_pb2.TrajectoryGroup, _Mapping]] = ..., delivery_count: _Optional[int] = ..., age_versions: _Optional[int] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("groups", "dropped_stale")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[DeliveredGroup]
    dropped_stale: int
    def __init__(self, groups: _Optional[_Iterable[_Union[DeliveredGroup, _Mapping]]] = ..., dropped_stale: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("consumer", "entry_ids")
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, consumer: _Optional[str] = ..., entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("checkpoint_version", "resumed_version")
    CHECKPOINT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESUMED_VERSION_FIELD_NUMBER: _ClassVar[int]
    checkpoint_version: int
    resumed_version: int
    def __init__(self, checkpoint_version: _Optional[int] = ..., resumed_version: _Optional[int] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("readmitted_prompts",)
    READMITTED_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    readmitted_prompts: int
    def __init__(self, readmitted_prompts: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("queue_size", "total_produced", "total_consumed", "dropped_by_reason", "pending", "capacity", "avg_sample_age_versions", "max_sample_age_versions", "avg_sample_age_s", "max_sample_age_s", "stale_samples_ratio", "consumer_lag", "generated_long_threshold_tokens", "generated_long_token_share", "duplicate_groups")
    class DroppedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CONSUMED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    AVG_SAMPLE_AGE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLE_AGE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    AVG_SAMPLE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    STALE_SAMPLES_RATIO_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_LAG_FIELD_NUMBER: _ClassVar[int]
    GENERATED_LONG_THRESHOLD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_LONG_TOKEN_SHARE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    queue_size: int
    total_produced: int
    total_consumed: int
    dropped_by_reason: _containers.ScalarMap[str, int]
    pending: int
    capacity: int
    avg_sample_age_versions: float
    max_sample_age_versions: float
    avg_sample_age_s: float
    max_sample_age_s: float
    stale_samples_ratio: float
    consumer_lag: int
    generated_long_threshold_tokens: float
    generated_long_token_share: float
    duplicate_groups: int
    def __init__(self, queue_size: _Optional[int] = ..., total_produced: _Optional[int] = ..., total_consumed: _Optional[int] = ..., dropped_by_reason: _Optional[_Mapping[str, int]] = ..., pending: _Optional[int] = ..., capacity: _Optional[int] = ..., avg_sample_age_versions: _Optional[float] = ..., max_sample_age_versions: _Optional[float] = ..., avg_sample_age_s: _Optional[float] = ..., max_sample_age_s: _Optional[float] = ..., stale_samples_ratio: _Optional[float] = ..., consumer_lag: _Optional[int] = ..., generated_long_threshold_tokens: _Optional[float] = ..., generated_long_token_share: _Optional[float] = ..., duplicate_groups: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("prompts", "release_id")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.PromptGroup]
    release_id: str
    def __init__(self, prompts: _Optional[_Iterable[_Union[_trajectory_pb2.PromptGroup, _Mapping]]] = ..., release_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("replica_id", "max_prompts", "held_version", "block_timeout_s")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSION_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    max_prompts: int
    held_version: int
    block_timeout_s: float
    def __init__(self, replica_id: _Optional[str] = ..., max_prompts: _Optional[int] = ..., held_version: _Optional[int] = ..., block_timeout_s: _Optional[float] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "prompt", "expires_at_unix_s", "delivery_count")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompt: _trajectory_pb2.PromptGroup
    expires_at_unix_s: float
    delivery_count: int
    def __init__(self, lease_id: _Optional[str] = ..., prompt: _Optional[_Union[_trajectory_pb2.PromptGroup, _Mapping]] = ..., expires_at_unix_s: _Optional[float] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("leases", "newer_version_waiting")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NEWER_VERSION_WAITING_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    newer_version_waiting: bool
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., newer_version_waiting: _Optional[bool] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("replica_id", "lease_ids")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("completed",)
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    completed: int
    def __init__(self, completed: _Optional[int] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("replica_id", "lease_ids")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("renewed", "expires_at_unix_s")
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    renewed: _containers.RepeatedScalarFieldContainer[str]
    expires_at_unix_s: float
    def __init__(self, renewed: _Optional[_Iterable[str]] = ..., expires_at_unix_s: _Optional[float] = ...) -> None: ...

class AbandonRequest(_message.Message):
    __slots__ = ("replica_id", "lease_ids", "reason", "min_start_version", "all_held", "keep_lease_ids")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MIN_START_VERSION_FIELD_NUMBER: _ClassVar[int]
    ALL_HELD_FIELD_NUMBER: _ClassVar[int]
    KEEP_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    min_start_version: int
    all_held: bool
    keep_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., min_start_version: _Optional[int] = ..., all_held: _Optional[bool] = ..., keep_lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AbandonResponse(_message.Message):
    __slots__ = ("requeued", "dropped")
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    requeued: _containers.RepeatedScalarFieldContainer[str]
    dropped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, requeued: _Optional[_Iterable[str]] = ..., dropped: _Optional[_Iterable[str]] = ...) -> None: ...

class PromptStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PromptQueueStats(_message.Message):
    __slots__ = ("waiting", "leased", "total_released", "total_completed", "total_reissued", "abandoned_by_reason", "dropped_by_reason")
    class AbandonedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DroppedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WAITING_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RELEASED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REISSUED_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    waiting: int
    leased: int
    total_released: int
    total_completed: int
    total_reissued: int
    abandoned_by_reason: _containers.ScalarMap[str, int]
    dropped_by_reason: _containers.ScalarMap[str, int]
    def __init__(self, waiting: _Optional[int] = ..., leased: _Optional[int] = ..., total_released: _Optional[int] = ..., total_completed: _Optional[int] = ..., total_reissued: _Optional[int] = ..., abandoned_by_reason: _Optional[_Mapping[str, int]] = ..., dropped_by_reason: _Optional[_Mapping[str, int]] = ...) -> None: ...
