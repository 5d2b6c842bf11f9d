from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CommitClaim(_message.Message):
    __slots__ = ("seq", "epoch", "attempt", "claimed_at_ms")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    epoch: int
    attempt: str
    claimed_at_ms: int
    def __init__(self, seq: _Optional[int] = ..., epoch: _Optional[int] = ..., attempt: _Optional[str] = ..., claimed_at_ms: _Optional[int] = ...) -> None: ...

class FenceTableRequest(_message.Message):
    __slots__ = ("table_id", "epoch", "seq")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    epoch: int
    seq: int
    def __init__(self, table_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class FenceTableResponse(_message.Message):
    __slots__ = ("fence_epoch", "from_seq")
    FENCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    fence_epoch: int
    from_seq: int
    def __init__(self, fence_epoch: _Optional[int] = ..., from_seq: _Optional[int] = ...) -> None: ...

class ClaimCommitRequest(_message.Message):
    __slots__ = ("table_id", "seq", "epoch", "attempt")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    seq: int
    epoch: int
    attempt: str
    def __init__(self, table_id: _Optional[str] = ..., seq: _Optional[int] = ..., epoch: _Optional[int] = ..., attempt: _Optional[str] = ...) -> None: ...

class ClaimCommitResponse(_message.Message):
    __slots__ = ("granted", "holder", "fence_epoch")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    FENCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    holder: CommitClaim
    fence_epoch: int
    def __init__(self, granted: bool = ..., holder: _Optional[_Union[CommitClaim, _Mapping]] = ..., fence_epoch: _Optional[int] = ...) -> None: ...

class GetCommitClaimsRequest(_message.Message):
    __slots__ = ("table_id", "from_seq", "limit")
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    table_id: str
    from_seq: int
    limit: int
    def __init__(self, table_id: _Optional[str] = ..., from_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetCommitClaimsResponse(_message.Message):
    __slots__ = ("fence_epoch", "claims", "next_seq")
    FENCE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    fence_epoch: int
    claims: _containers.RepeatedCompositeFieldContainer[CommitClaim]
    next_seq: int
    def __init__(self, fence_epoch: _Optional[int] = ..., claims: _Optional[_Iterable[_Union[CommitClaim, _Mapping]]] = ..., next_seq: _Optional[int] = ...) -> None: ...
