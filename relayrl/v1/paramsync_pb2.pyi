from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "num_bytes", "checksum")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    num_bytes: int
    checksum: str
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., num_bytes: _Optional[int] = ..., checksum: _Optional[str] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("version", "tensors", "total_bytes", "checksum_algorithm", "created_at_unix_s", "trainer_step", "handles")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STEP_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    checksum_algorithm: str
    created_at_unix_s: float
    trainer_step: int
    handles: WeightHandles
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., checksum_algorithm: _Optional[str] = ..., created_at_unix_s: _Optional[float] = ..., trainer_step: _Optional[int] = ..., handles: _Optional[_Union[WeightHandles, _Mapping]] = ...) -> None: ...

class WeightHandles(_message.Message):
    __slots__ = ("host", "load_format", "buckets")
    HOST_FIELD_NUMBER: _ClassVar[int]
    LOAD_FORMAT_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    host: str
    load_format: str
    buckets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host: _Optional[str] = ..., load_format: _Optional[str] = ..., buckets: _Optional[_Iterable[str]] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("tensor_name", "offset", "data")
    TENSOR_NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    tensor_name: str
    offset: int
    data: bytes
    def __init__(self, tensor_name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorChecksums(_message.Message):
    __slots__ = ("first_tensor", "checksums", "shared", "end_byte")
    FIRST_TENSOR_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    END_BYTE_FIELD_NUMBER: _ClassVar[int]
    first_tensor: int
    checksums: _containers.RepeatedScalarFieldContainer[str]
    shared: SharedBytes
    end_byte: int
    def __init__(self, first_tensor: _Optional[int] = ..., checksums: _Optional[_Iterable[str]] = ..., shared: _Optional[_Union[SharedBytes, _Mapping]] = ..., end_byte: _Optional[int] = ...) -> None: ...

class SharedBytes(_message.Message):
    __slots__ = ("host", "pid", "fd", "offsets")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    host: str
    pid: int
    fd: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, host: _Optional[str] = ..., pid: _Optional[int] = ..., fd: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class WeightStreamMessage(_message.Message):
    __slots__ = ("manifest", "chunk", "checksums", "resume_from_bytes")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_BYTES_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    chunk: WeightChunk
    checksums: TensorChecksums
    resume_from_bytes: int
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunk, _Mapping]] = ..., checksums: _Optional[_Union[TensorChecksums, _Mapping]] = ..., resume_from_bytes: _Optional[int] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("version", "bytes_received")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    version: int
    bytes_received: int
    def __init__(self, version: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("replica_id", "version")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    version: int
    def __init__(self, replica_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("replica_id", "held_version", "engine_url")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_URL_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    held_version: int
    engine_url: str
    def __init__(self, replica_id: _Optional[str] = ..., held_version: _Optional[int] = ..., engine_url: _Optional[str] = ...) -> None: ...

class VersionAnnouncement(_message.Message):
    __slots__ = ("version", "total_bytes", "published_at_unix_s", "transport", "disk_path", "handles")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    DISK_PATH_FIELD_NUMBER: _ClassVar[int]
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    version: int
    total_bytes: int
    published_at_unix_s: float
    transport: str
    disk_path: str
    handles: WeightHandles
    def __init__(self, version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., published_at_unix_s: _Optional[float] = ..., transport: _Optional[str] = ..., disk_path: _Optional[str] = ..., handles: _Optional[_Union[WeightHandles, _Mapping]] = ...) -> None: ...

class ReportVersionRequest(_message.Message):
    __slots__ = ("replica_id", "version", "ok", "error", "sync_s")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SYNC_S_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    version: int
    ok: bool
    error: str
    sync_s: float
    def __init__(self, replica_id: _Optional[str] = ..., version: _Optional[int] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., sync_s: _Optional[float] = ...) -> None: ...

class ReportVersionResponse(_message.Message):
    __slots__ = ("latest_version",)
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    latest_version: int
    def __init__(self, latest_version: _Optional[int] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaVersion(_message.Message):
    __slots__ = ("replica_id", "version", "updated_at_unix_s", "lag_versions", "state", "consecutive_failures", "last_error", "engine_url")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LAG_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ENGINE_URL_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    version: int
    updated_at_unix_s: float
    lag_versions: int
    state: str
    consecutive_failures: int
    last_error: str
    engine_url: str
    def __init__(self, replica_id: _Optional[str] = ..., version: _Optional[int] = ..., updated_at_unix_s: _Optional[float] = ..., lag_versions: _Optional[int] = ..., state: _Optional[str] = ..., consecutive_failures: _Optional[int] = ..., last_error: _Optional[str] = ..., engine_url: _Optional[str] = ...) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("latest_version", "replicas")
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    latest_version: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaVersion]
    def __init__(self, latest_version: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaVersion, _Mapping]]] = ...) -> None: ...

class DataPlaneRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AbortUploadRequest(_message.Message):
    __slots__ = ("version", "reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    version: int
    reason: str
    def __init__(self, version: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortUploadResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: bool
    def __init__(self, aborted: _Optional[bool] = ...) -> None: ...

class DataPlaneInfo(_message.Message):
    __slots__ = ("data_port",)
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    data_port: int
    def __init__(self, data_port: _Optional[int] = ...) -> None: ...

class BulkRequest(_message.Message):
    __slots__ = ("publish", "fetch", "map", "resume_from_bytes")
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    RESUME_FROM_BYTES_FIELD_NUMBER: _ClassVar[int]
    publish: WeightManifest
    fetch: FetchRequest
    map: FetchRequest
    resume_from_bytes: int
    def __init__(self, publish: _Optional[_Union[WeightManifest, _Mapping]] = ..., fetch: _Optional[_Union[FetchRequest, _Mapping]] = ..., map: _Optional[_Union[FetchRequest, _Mapping]] = ..., resume_from_bytes: _Optional[int] = ...) -> None: ...

class BulkReply(_message.Message):
    __slots__ = ("code", "message", "manifest", "bytes_received", "shared")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    manifest: WeightManifest
    bytes_received: int
    shared: SharedVersion
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., bytes_received: _Optional[int] = ..., shared: _Optional[_Union[SharedVersion, _Mapping]] = ...) -> None: ...

class SharedVersion(_message.Message):
    __slots__ = ("pid", "fd", "host", "token", "file_bytes")
    PID_FIELD_NUMBER: _ClassVar[int]
    FD_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    fd: int
    host: str
    token: str
    file_bytes: int
    def __init__(self, pid: _Optional[int] = ..., fd: _Optional[int] = ..., host: _Optional[str] = ..., token: _Optional[str] = ..., file_bytes: _Optional[int] = ...) -> None: ...
