from snapcoord.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Lease(_message.Message):
    __slots__ = ("lease_id", "duration_ms", "expires_at_ms", "snapshots")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    duration_ms: int
    expires_at_ms: int
    snapshots: _containers.RepeatedCompositeFieldContainer[_common_pb2.SnapshotRef]
    def __init__(self, lease_id: _Optional[str] = ..., duration_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., snapshots: _Optional[_Iterable[_Union[_common_pb2.SnapshotRef, _Mapping]]] = ...) -> None: ...

class AcquireSnapshotsRequest(_message.Message):
    __slots__ = ("lease_id", "duration_ms", "snapshots")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    duration_ms: int
    snapshots: _containers.RepeatedCompositeFieldContainer[_common_pb2.SnapshotRef]
    def __init__(self, lease_id: _Optional[str] = ..., duration_ms: _Optional[int] = ..., snapshots: _Optional[_Iterable[_Union[_common_pb2.SnapshotRef, _Mapping]]] = ...) -> None: ...

class AcquireSnapshotsResponse(_message.Message):
    __slots__ = ("lease", "unavailable")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    unavailable: _containers.RepeatedCompositeFieldContainer[_common_pb2.SnapshotRef]
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., unavailable: _Optional[_Iterable[_Union[_common_pb2.SnapshotRef, _Mapping]]] = ...) -> None: ...

class ReleaseSnapshotsRequest(_message.Message):
    __slots__ = ("lease_id", "snapshots")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    snapshots: _containers.RepeatedCompositeFieldContainer[_common_pb2.SnapshotRef]
    def __init__(self, lease_id: _Optional[str] = ..., snapshots: _Optional[_Iterable[_Union[_common_pb2.SnapshotRef, _Mapping]]] = ...) -> None: ...

class ReleaseSnapshotsResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "duration_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    duration_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ...) -> None: ...

class DropLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class DropLeaseResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: bool
    def __init__(self, dropped: bool = ...) -> None: ...

class GetLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases", "next_page_token")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    next_page_token: str
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
