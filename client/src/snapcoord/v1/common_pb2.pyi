from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Offset(_message.Message):
    __slots__ = ("stream", "partition", "offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    partition: int
    offset: int
    def __init__(self, stream: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class SnapshotRef(_message.Message):
    __slots__ = ("app_id", "generation")
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    app_id: str
    generation: int
    def __init__(self, app_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...
