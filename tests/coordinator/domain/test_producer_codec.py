"""The stored byte formats are pinned: today's writer produces exactly the golden bytes, and
every golden file (each format version ever written) stays readable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producer_codec import (
    decode_producer_offsets,
    decode_producer_record,
    encode_producer_offsets,
    encode_producer_record,
)
from snapcoord.coordinator.domain.producers import ProducerRecord
from snapcoord.coordinator.errors import CorruptRecord

GOLDEN = Path(__file__).parent / "golden"
RECORD = ProducerRecord(
    producer_id="orders-sink",
    object_key="producers/orders-sink/0f8e7a6b5c4d4e3f9a1b2c3d4e5f6a7b.json",
    created_at_ms=1_700_000_000_000,
    expires_at_ms=1_700_086_400_000,
)
OFFSETS = (Offset("orders", 0, 42), Offset("orders", 1, -1), Offset("payments:eu", 0, 7))
INLINE_RECORD = ProducerRecord(
    producer_id="orders-sink",
    object_key="",
    created_at_ms=1_700_000_000_000,
    expires_at_ms=1_700_086_400_000,
    inline=OFFSETS,
    inline_registration="0f8e7a6b5c4d4e3f9a1b2c3d4e5f6a7b",
)


def test_producer_record_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "producer_record_v1.json").read_bytes()
    assert encode_producer_record(RECORD) == golden
    assert decode_producer_record(golden) == RECORD


def test_a_v1_record_carries_its_payload_digest_and_reads_without_one() -> None:
    """The digest is one more field of version 1: a reader that predates it reads only the fields
    it knows, and a record written before it (the golden file) reads with an empty digest."""
    with_digest = replace(RECORD, payload_sha256="ab" * 32)
    data = encode_producer_record(with_digest)
    assert b'"version":1' in data and b'"payload_sha256":"' + b"ab" * 32 + b'"' in data
    assert decode_producer_record(data) == with_digest
    assert decode_producer_record((GOLDEN / "producer_record_v1.json").read_bytes()).payload_sha256 == ""


def test_producer_record_v2_with_inline_offsets_bytes_are_pinned() -> None:
    golden = (GOLDEN / "producer_record_v2.json").read_bytes()
    assert encode_producer_record(INLINE_RECORD) == golden
    assert decode_producer_record(golden) == INLINE_RECORD
    assert INLINE_RECORD.objects == () and INLINE_RECORD.registration_id == "0f8e7a6b5c4d4e3f9a1b2c3d4e5f6a7b"
    assert RECORD.objects == (RECORD.object_key,)


def test_producer_offsets_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "producer_offsets_v1.json").read_bytes()
    assert encode_producer_offsets("orders-sink", OFFSETS) == golden
    assert decode_producer_offsets(golden) == ("orders-sink", OFFSETS)


def test_version_1_stays_readable_with_fields_added_later() -> None:
    # A later writer may add fields; a v1 reader ignores what it does not know.
    data = (
        b'{"version":1,"producer_id":"p","object_key":"producers/p/a.json",'
        b'"created_at_ms":1,"expires_at_ms":2,"new":[]}'
    )
    assert decode_producer_record(data).expires_at_ms == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"version":3,"producer_id":"p"}', "format version 3, newer than this snapcoord reads"),
        (b'{"version":2,"producer_id":"p","created_at_ms":1,"expires_at_ms":2}', "malformed"),
        (b"not json", "not JSON"),
        (b'{"producer_id":"p"}', "no version field"),
        (b'{"version":1,"producer_id":"p"}', "malformed"),
    ],
)
def test_unreadable_records_fail_loudly(data: bytes, message: str) -> None:
    with pytest.raises(CorruptRecord, match=message):
        decode_producer_record(data)
