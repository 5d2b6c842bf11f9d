from snapcoord.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProducerSnapshot(_message.Message):
    __slots__ = ("producer_id", "offsets", "created_at_ms", "expires_at_ms")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    offsets: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    created_at_ms: int
    expires_at_ms: int
    def __init__(self, producer_id: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., created_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ...) -> None: ...

class RegisterProducerOffsetsRequest(_message.Message):
    __slots__ = ("producer_id", "offsets", "ttl_ms")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    offsets: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    ttl_ms: int
    def __init__(self, producer_id: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class RegisterProducerOffsetsResponse(_message.Message):
    __slots__ = ("registered", "snapshot")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    registered: bool
    snapshot: ProducerSnapshot
    def __init__(self, registered: bool = ..., snapshot: _Optional[_Union[ProducerSnapshot, _Mapping]] = ...) -> None: ...

class GetProducerOffsetsRequest(_message.Message):
    __slots__ = ("producer_id",)
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    def __init__(self, producer_id: _Optional[str] = ...) -> None: ...

class DeleteProducerOffsetsRequest(_message.Message):
    __slots__ = ("producer_id",)
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    def __init__(self, producer_id: _Optional[str] = ...) -> None: ...

class DeleteProducerOffsetsResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: bool = ...) -> None: ...

class AdvanceProducerOffsetsRequest(_message.Message):
    __slots__ = ("producer_id", "offsets", "ttl_ms", "previous_producer_id")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    offsets: _containers.RepeatedCompositeFieldContainer[_common_pb2.Offset]
    ttl_ms: int
    previous_producer_id: str
    def __init__(self, producer_id: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[_common_pb2.Offset, _Mapping]]] = ..., ttl_ms: _Optional[int] = ..., previous_producer_id: _Optional[str] = ...) -> None: ...

class AdvanceProducerOffsetsResponse(_message.Message):
    __slots__ = ("registered", "snapshot", "previous_deleted")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_DELETED_FIELD_NUMBER: _ClassVar[int]
    registered: bool
    snapshot: ProducerSnapshot
    previous_deleted: bool
    def __init__(self, registered: bool = ..., snapshot: _Optional[_Union[ProducerSnapshot, _Mapping]] = ..., previous_deleted: bool = ...) -> None: ...

class ListProducerOffsetsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListProducerOffsetsResponse(_message.Message):
    __slots__ = ("snapshots", "next_page_token")
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    snapshots: _containers.RepeatedCompositeFieldContainer[ProducerSnapshot]
    next_page_token: str
    def __init__(self, snapshots: _Optional[_Iterable[_Union[ProducerSnapshot, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
