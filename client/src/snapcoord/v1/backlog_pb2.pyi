from snapcoord.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PartitionBacklog(_message.Message):
    __slots__ = ("stream", "partition", "boundary", "position", "finished")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    boundary: int
    position: int
    finished: bool
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., boundary: _Optional[int] = ..., position: _Optional[int] = ..., finished: bool = ...) -> None: ...

class BacklogStatus(_message.Message):
    __slots__ = ("job_id", "processing_backlog", "partitions", "added", "unmarked_partitions")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    UNMARKED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    processing_backlog: bool
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionBacklog]
    added: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    unmarked_partitions: int
    def __init__(self, job_id: _Optional[str] = ..., processing_backlog: bool = ..., partitions: _Optional[_Iterable[_Union[PartitionBacklog, _Mapping]]] = ..., added: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., unmarked_partitions: _Optional[int] = ...) -> None: ...

class MarkBacklogRequest(_message.Message):
    __slots__ = ("job_id", "boundaries", "reset")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BOUNDARIES_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    boundaries: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    reset: bool
    def __init__(self, job_id: _Optional[str] = ..., boundaries: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., reset: bool = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("job_id", "positions", "report_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    positions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    report_id: str
    def __init__(self, job_id: _Optional[str] = ..., positions: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., report_id: _Optional[str] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("newly_finished", "status", "unmarked")
    NEWLY_FINISHED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    UNMARKED_FIELD_NUMBER: _ClassVar[int]
    newly_finished: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    status: BacklogStatus
    unmarked: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    def __init__(self, newly_finished: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., status: _Optional[_Union[BacklogStatus, _Mapping]] = ..., unmarked: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ...) -> None: ...

class GetBacklogStatusRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ClearBacklogRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ClearBacklogResponse(_message.Message):
    __slots__ = ("cleared",)
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    cleared: bool
    def __init__(self, cleared: bool = ...) -> None: ...
