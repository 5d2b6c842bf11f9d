from snapcoord.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskSnapshot(_message.Message):
    __slots__ = ("task_id", "committed_offsets", "checkpoints", "uploaded_checkpoints")
    class CheckpointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    class UploadedCheckpointsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    committed_offsets: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    checkpoints: _containers.ScalarMap[str, bytes]
    uploaded_checkpoints: _containers.ScalarMap[str, str]
    def __init__(self, task_id: _Optional[str] = ..., committed_offsets: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., checkpoints: _Optional[_Mapping[str, bytes]] = ..., uploaded_checkpoints: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("app_id", "generation", "state", "task_ids", "tasks", "created_at_ms", "completed_at_ms", "expires_at_ms", "labels", "abort_reason")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Snapshot.State]
        EMPTY: _ClassVar[Snapshot.State]
        CREATED: _ClassVar[Snapshot.State]
        COMPLETED: _ClassVar[Snapshot.State]
        ABORTED: _ClassVar[Snapshot.State]
    STATE_UNSPECIFIED: Snapshot.State
    EMPTY: Snapshot.State
    CREATED: Snapshot.State
    COMPLETED: Snapshot.State
    ABORTED: Snapshot.State
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ABORT_REASON_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    state: Snapshot.State
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSnapshot]
    created_at_ms: int
    completed_at_ms: int
    expires_at_ms: int
    labels: _containers.ScalarMap[str, str]
    abort_reason: str
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ..., state: _Optional[_Union[Snapshot.State, str]] = ..., task_ids: _Optional[_Iterable[str]] = ..., tasks: _Optional[_Iterable[_Union[TaskSnapshot, _Mapping]]] = ..., created_at_ms: _Optional[int] = ..., completed_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., abort_reason: _Optional[str] = ...) -> None: ...

class CreateSnapshotRequest(_message.Message):
    __slots__ = ("app_id", "task_ids", "ttl_ms", "timeout_ms", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    ttl_ms: int
    timeout_ms: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, app_id: _Optional[str] = ..., task_ids: _Optional[_Iterable[str]] = ..., ttl_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetCurrentSnapshotRequest(_message.Message):
    __slots__ = ("app_id", "consistent")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    CONSISTENT_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    consistent: bool
    def __init__(self, app_id: _Optional[str] = ..., consistent: bool = ...) -> None: ...

class ReadCheckpointRequest(_message.Message):
    __slots__ = ("app_id", "generation", "task_id", "store")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    task_id: str
    store: str
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ..., task_id: _Optional[str] = ..., store: _Optional[str] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("data", "offset", "total_size", "sha256")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    total_size: int
    sha256: str
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., total_size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class UploadCheckpointRequest(_message.Message):
    __slots__ = ("app_id", "generation", "task_id", "store", "data")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    task_id: str
    store: str
    data: bytes
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ..., task_id: _Optional[str] = ..., store: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class CheckpointUpload(_message.Message):
    __slots__ = ("upload_id", "size", "sha256")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    size: int
    sha256: str
    def __init__(self, upload_id: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ("app_id", "generation", "include_checkpoints")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    include_checkpoints: bool
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ..., include_checkpoints: bool = ...) -> None: ...

class ListSnapshotsRequest(_message.Message):
    __slots__ = ("app_id", "page_size", "page_token")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    page_size: int
    page_token: str
    def __init__(self, app_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSnapshotsResponse(_message.Message):
    __slots__ = ("snapshots", "next_page_token")
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[Snapshot]
    next_page_token: str
    def __init__(self, snapshots: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReportTaskSnapshotRequest(_message.Message):
    __slots__ = ("app_id", "generation", "task")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    task: TaskSnapshot
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ..., task: _Optional[_Union[TaskSnapshot, _Mapping]] = ...) -> None: ...

class AbortSnapshotRequest(_message.Message):
    __slots__ = ("app_id", "generation", "reason")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    reason: str
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DeleteSnapshotRequest(_message.Message):
    __slots__ = ("app_id", "generation")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class DeleteSnapshotResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: bool = ...) -> None: ...

class SetRetentionPolicyRequest(_message.Message):
    __slots__ = ("app_id", "keep_last_completed", "completed_ttl_ms")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    keep_last_completed: int
    completed_ttl_ms: int
    def __init__(self, app_id: _Optional[str] = ..., keep_last_completed: _Optional[int] = ..., completed_ttl_ms: _Optional[int] = ...) -> None: ...

class RetentionPolicy(_message.Message):
    __slots__ = ("app_id", "keep_last_completed", "completed_ttl_ms")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    keep_last_completed: int
    completed_ttl_ms: int
    def __init__(self, app_id: _Optional[str] = ..., keep_last_completed: _Optional[int] = ..., completed_ttl_ms: _Optional[int] = ...) -> None: ...
