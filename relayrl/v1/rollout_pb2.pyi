from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
    PAUSE_MODE_RETRACT: _ClassVar[PauseMode]
    PAUSE_MODE_IN_PLACE: _ClassVar[PauseMode]
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_ABORT: PauseMode
PAUSE_MODE_RETRACT: PauseMode
PAUSE_MODE_IN_PLACE: PauseMode

class PauseRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: PauseMode
    def __init__(self, mode: _Optional[_Union[PauseMode, str]] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("replica_id", "weight_version", "paused", "in_flight", "tokens_per_s", "samples_per_s", "total_generated_samples", "generation_errors", "engine_ready", "leases_held", "pause_mode", "latest_version")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GENERATED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_READY_FIELD_NUMBER: _ClassVar[int]
    LEASES_HELD_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MODE_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    weight_version: int
    paused: bool
    in_flight: int
    tokens_per_s: float
    samples_per_s: float
    total_generated_samples: int
    generation_errors: int
    engine_ready: bool
    leases_held: int
    pause_mode: str
    latest_version: int
    def __init__(self, replica_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., paused: _Optional[bool] = ..., in_flight: _Optional[int] = ..., tokens_per_s: _Optional[float] = ..., samples_per_s: _Optional[float] = ..., total_generated_samples: _Optional[int] = ..., generation_errors: _Optional[int] = ..., engine_ready: _Optional[bool] = ..., leases_held: _Optional[int] = ..., pause_mode: _Optional[str] = ..., latest_version: _Optional[int] = ...) -> None: ...
