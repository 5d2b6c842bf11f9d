"""ReadCheckpoint's messages encoded by hand: one copy of each payload piece instead of three.

Through protobuf, a 1 MiB piece is copied into the message, again by ``SerializeToString``, and
again by gRPC into its own buffer; each copy lands in a freshly mmapped block (``malloc_tuning``),
so it also pays a page fault per 4 KiB. Profiled, building and serialising the messages was
about 40% of the sending thread's time. ``encode_chunk`` writes the same wire bytes with a single
join, and ``PreEncodedChunks`` registers a serializer for ReadCheckpoint that passes such bytes
through (and still serialises a ``CheckpointChunk``, so either may be yielded); likewise for the
methods answering a ``Snapshot``, whose task set ``snapshot_frames`` encodes once.

The bytes are what protobuf itself writes for the message (fields in number order, proto3
defaults left out), so any client parses them as an ordinary ``CheckpointChunk``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc

from snapcoord.v1 import snapshot_pb2

READ_CHECKPOINT = "snapcoord.v1.SnapshotService/ReadCheckpoint"
#: Every method whose responses may be pre-encoded bytes (``serialize_chunk`` passes them through).
_ANSWER_SNAPSHOTS = (
    "CreateSnapshot",
    "GetCurrentSnapshot",
    "GetSnapshot",
    "ReportTaskSnapshot",
    "AbortSnapshot",
)
PRE_ENCODED = frozenset({READ_CHECKPOINT} | {f"snapcoord.v1.SnapshotService/{n}" for n in _ANSWER_SNAPSHOTS})
#: Field 1 (``data``), wire type 2 (length-delimited).
_DATA_TAG = b"\x0a"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_chunk(data: bytes, offset: int, total_size: int, sha256: str) -> bytes:
    """The serialized ``CheckpointChunk(data=data, offset=..., total_size=..., sha256=...)``."""
    rest = snapshot_pb2.CheckpointChunk(
        offset=offset, total_size=total_size, sha256=sha256
    ).SerializeToString()
    if not data:  # proto3 leaves an empty bytes field out
        return rest
    return b"".join((_DATA_TAG, _varint(len(data)), data, rest))


def serialize_chunk(message: bytes | snapshot_pb2.CheckpointChunk | snapshot_pb2.Snapshot) -> bytes:
    """The ``PRE_ENCODED`` methods' response serializer: pre-encoded bytes as they are, a message
    serialized."""
    if isinstance(message, bytes):
        return message
    return message.SerializeToString()


def _with_chunk_serializer(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            handler.unary_unary, handler.request_deserializer, serialize_chunk
        )
    return grpc.unary_stream_rpc_method_handler(
        handler.unary_stream, handler.request_deserializer, serialize_chunk
    )


class _GenericHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is not None and str(handler_call_details.method).lstrip("/") in PRE_ENCODED:
            return _with_chunk_serializer(handler)
        return handler


class PreEncodedChunks:
    """Pass to ``add_SnapshotServiceServicer_to_server`` in place of the server (or of another
    such stand-in): registers the ``PRE_ENCODED`` methods with ``serialize_chunk``, every other
    method as is."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GenericHandler(h) for h in handlers))

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        replaced = {
            name: _with_chunk_serializer(h) if f"{service_name}/{name}" in PRE_ENCODED else h
            for name, h in method_handlers.items()
        }
        self._server.add_registered_method_handlers(service_name, replaced)
