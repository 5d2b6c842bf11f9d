"""ReadCheckpoint's hand-encoded messages are exactly what protobuf writes for the same
CheckpointChunk, at every length where the data field's length prefix changes size."""

from __future__ import annotations

import hashlib

import pytest

from snapcoord.coordinator.api.chunk_frames import encode_chunk, serialize_chunk
from snapcoord.v1 import snapshot_pb2

MiB = 1024 * 1024
SHA = hashlib.sha256(b"x").hexdigest()


@pytest.mark.parametrize(
    "size", [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, MiB - 1, MiB, MiB + 1]
)
def test_an_encoded_chunk_is_protobufs_own_encoding(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = snapshot_pb2.CheckpointChunk(data=data, offset=7 * MiB, total_size=9 * MiB, sha256=SHA)
    encoded = encode_chunk(data, 7 * MiB, 9 * MiB, SHA)
    assert encoded == expected.SerializeToString()
    parsed = snapshot_pb2.CheckpointChunk.FromString(encoded)
    assert (parsed.data, parsed.offset, parsed.total_size, parsed.sha256) == (data, 7 * MiB, 9 * MiB, SHA)


def test_an_empty_payloads_only_chunk_carries_size_and_hash() -> None:
    encoded = encode_chunk(b"", 0, 0, hashlib.sha256(b"").hexdigest())
    parsed = snapshot_pb2.CheckpointChunk.FromString(encoded)
    assert parsed.data == b"" and parsed.total_size == 0 and parsed.sha256 == hashlib.sha256(b"").hexdigest()


def test_the_serializer_passes_encoded_bytes_through_and_serializes_messages() -> None:
    encoded = encode_chunk(b"abc", 3, 6, SHA)
    assert serialize_chunk(encoded) is encoded
    message = snapshot_pb2.CheckpointChunk(data=b"abc", offset=3, total_size=6, sha256=SHA)
    assert serialize_chunk(message) == encoded
