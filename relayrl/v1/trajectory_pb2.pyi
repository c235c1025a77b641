from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason

class SampleTimings(_message.Message):
    __slots__ = ("started_at_unix_s", "finished_at_unix_s", "generation_s", "reward_s")
    STARTED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_S_FIELD_NUMBER: _ClassVar[int]
    REWARD_S_FIELD_NUMBER: _ClassVar[int]
    started_at_unix_s: float
    finished_at_unix_s: float
    generation_s: float
    reward_s: float
    def __init__(self, started_at_unix_s: _Optional[float] = ..., finished_at_unix_s: _Optional[float] = ..., generation_s: _Optional[float] = ..., reward_s: _Optional[float] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("prompt_token_ids", "response_token_ids", "behavior_logprobs", "policy_versions", "reward", "token_rewards", "finish_reason", "replica_id", "timings", "response_text", "reward_extra", "reward_error", "loss_mask", "turn_ends")
    class RewardExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOR_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TOKEN_REWARDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    REWARD_EXTRA_FIELD_NUMBER: _ClassVar[int]
    REWARD_ERROR_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    TURN_ENDS_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    behavior_logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    reward: float
    token_rewards: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    replica_id: str
    timings: SampleTimings
    response_text: str
    reward_extra: _containers.ScalarMap[str, float]
    reward_error: bool
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    turn_ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., behavior_logprobs: _Optional[_Iterable[float]] = ..., policy_versions: _Optional[_Iterable[int]] = ..., reward: _Optional[float] = ..., token_rewards: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., replica_id: _Optional[str] = ..., timings: _Optional[_Union[SampleTimings, _Mapping]] = ..., response_text: _Optional[str] = ..., reward_extra: _Optional[_Mapping[str, float]] = ..., reward_error: _Optional[bool] = ..., loss_mask: _Optional[_Iterable[int]] = ..., turn_ends: _Optional[_Iterable[int]] = ...) -> None: ...

class TrajectoryGroup(_message.Message):
    __slots__ = ("group_id", "prompt_id", "trajectories", "data_source", "ground_truth", "extra_info_json", "min_policy_version", "max_policy_version", "lease_id", "created_at_unix_s", "is_eval", "max_staleness")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    EXTRA_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    IS_EVAL_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    prompt_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    data_source: str
    ground_truth: str
    extra_info_json: str
    min_policy_version: int
    max_policy_version: int
    lease_id: str
    created_at_unix_s: float
    is_eval: bool
    max_staleness: int
    def __init__(self, group_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ..., data_source: _Optional[str] = ..., ground_truth: _Optional[str] = ..., extra_info_json: _Optional[str] = ..., min_policy_version: _Optional[int] = ..., max_policy_version: _Optional[int] = ..., lease_id: _Optional[str] = ..., created_at_unix_s: _Optional[float] = ..., is_eval: _Optional[bool] = ..., max_staleness: _Optional[int] = ...) -> None: ...

class SamplingOverrides(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class PromptGroup(_message.Message):
    __slots__ = ("prompt_id", "prompt_token_ids", "n_samples", "data_source", "ground_truth", "extra_info_json", "min_start_version", "released_at_version", "released_at_unix_s", "sampling", "is_eval", "max_staleness")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    N_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    EXTRA_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    MIN_START_VERSION_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    IS_EVAL_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    n_samples: int
    data_source: str
    ground_truth: str
    extra_info_json: str
    min_start_version: int
    released_at_version: int
    released_at_unix_s: float
    sampling: SamplingOverrides
    is_eval: bool
    max_staleness: int
    def __init__(self, prompt_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., n_samples: _Optional[int] = ..., data_source: _Optional[str] = ..., ground_truth: _Optional[str] = ..., extra_info_json: _Optional[str] = ..., min_start_version: _Optional[int] = ..., released_at_version: _Optional[int] = ..., released_at_unix_s: _Optional[float] = ..., sampling: _Optional[_Union[SamplingOverrides, _Mapping]] = ..., is_eval: _Optional[bool] = ..., max_staleness: _Optional[int] = ...) -> None: ...
