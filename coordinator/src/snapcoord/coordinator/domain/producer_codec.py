"""The stored formats of producer offsets: the producer record (metadata) and its offsets payload,
as versioned JSON documents (``documents``)."""

from __future__ import annotations

from snapcoord.coordinator.domain.documents import dump, load
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerRecord
from snapcoord.coordinator.errors import Internal

PRODUCER_RECORD_VERSION = 1
PRODUCER_OFFSETS_VERSION = 1


def encode_producer_record(record: ProducerRecord) -> bytes:
    return dump(
        {
            "version": PRODUCER_RECORD_VERSION,
            "producer_id": record.producer_id,
            "object_key": record.object_key,
            "created_at_ms": record.created_at_ms,
            "expires_at_ms": record.expires_at_ms,
        }
    )


def decode_producer_record(data: bytes) -> ProducerRecord:
    doc = load(data, "producer record", PRODUCER_RECORD_VERSION)
    try:  # version 1 is the only one so far
        return ProducerRecord(
            producer_id=str(doc["producer_id"]),
            object_key=str(doc["object_key"]),
            created_at_ms=int(doc["created_at_ms"]),
            expires_at_ms=int(doc["expires_at_ms"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise Internal(f"stored producer record is malformed: {e!r}") from e


def encode_producer_offsets(producer_id: str, offsets: tuple[Offset, ...]) -> bytes:
    return dump(
        {
            "version": PRODUCER_OFFSETS_VERSION,
            "producer_id": producer_id,
            "offsets": [{"stream": o.stream, "partition": o.partition, "offset": o.offset} for o in offsets],
        }
    )


def decode_producer_offsets(data: bytes) -> tuple[str, tuple[Offset, ...]]:
    doc = load(data, "producer offsets payload", PRODUCER_OFFSETS_VERSION)
    try:
        offsets = tuple(
            Offset(stream=str(o["stream"]), partition=int(o["partition"]), offset=int(o["offset"]))
            for o in doc["offsets"]
        )
        return str(doc["producer_id"]), offsets
    except (KeyError, TypeError, ValueError) as e:
        raise Internal(f"stored producer offsets payload is malformed: {e!r}") from e
