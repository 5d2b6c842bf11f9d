"""The stored formats of producer offsets: the producer record (metadata) and its offsets payload,
as versioned JSON documents (``documents``).

A record whose offsets are in the blob store is written as version 1 (``object_key``), the format
every release reads; it also holds the payload's SHA-256 (``payload_sha256``), which readers
check, and which releases that predate it ignore (they read only the fields they know), so the
record stays version 1. A record with its offsets inline is version 2 (``registration_id`` and
``offsets`` instead of ``object_key``): a release that reads only version 1 refuses it with
"newer than this snapcoord reads" (``documents.load``) instead of misreading it."""

from __future__ import annotations

from snapcoord.coordinator.domain.documents import SHAPE_ERRORS, dump, load, malformed
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerRecord

#: A record pointing at its payload object.
PRODUCER_RECORD_VERSION = 1
#: A record holding its offsets inline.
INLINE_PRODUCER_RECORD_VERSION = 2
PRODUCER_OFFSETS_VERSION = 1


def _offsets_doc(offsets: tuple[Offset, ...]) -> list[dict[str, object]]:
    return [{"stream": o.stream, "partition": o.partition, "offset": o.offset} for o in offsets]


def _offsets_of(items: object) -> tuple[Offset, ...]:
    if not isinstance(items, list):
        raise TypeError(f"offsets is {type(items).__name__}, not a list")
    return tuple(
        Offset(stream=str(o["stream"]), partition=int(o["partition"]), offset=int(o["offset"])) for o in items
    )


def inline_offsets_bytes(offsets: tuple[Offset, ...]) -> int:
    """What ``offsets`` add to an inline record: the size the inline threshold is compared with."""
    return len(dump({"offsets": _offsets_doc(offsets)}))


def encode_producer_record(record: ProducerRecord) -> bytes:
    common = {
        "producer_id": record.producer_id,
        "created_at_ms": record.created_at_ms,
        "expires_at_ms": record.expires_at_ms,
    }
    if record.inline is None:
        digest = {"payload_sha256": record.payload_sha256} if record.payload_sha256 else {}
        return dump({"version": PRODUCER_RECORD_VERSION, "object_key": record.object_key, **common, **digest})
    return dump(
        {
            "version": INLINE_PRODUCER_RECORD_VERSION,
            "registration_id": record.inline_registration,
            "offsets": _offsets_doc(record.inline),
            **common,
        }
    )


def decode_producer_record(data: bytes) -> ProducerRecord:
    doc = load(data, "producer record", INLINE_PRODUCER_RECORD_VERSION)
    try:
        if doc["version"] < INLINE_PRODUCER_RECORD_VERSION:
            return ProducerRecord(
                producer_id=str(doc["producer_id"]),
                object_key=str(doc["object_key"]),
                created_at_ms=int(doc["created_at_ms"]),
                expires_at_ms=int(doc["expires_at_ms"]),
                payload_sha256=str(doc.get("payload_sha256", "")),
            )
        return ProducerRecord(
            producer_id=str(doc["producer_id"]),
            object_key="",
            created_at_ms=int(doc["created_at_ms"]),
            expires_at_ms=int(doc["expires_at_ms"]),
            inline=_offsets_of(doc["offsets"]),
            inline_registration=str(doc["registration_id"]),
        )
    except SHAPE_ERRORS as e:
        raise malformed("producer record", e, data) from e


def encode_producer_offsets(producer_id: str, offsets: tuple[Offset, ...]) -> bytes:
    return dump(
        {
            "version": PRODUCER_OFFSETS_VERSION,
            "producer_id": producer_id,
            "offsets": _offsets_doc(offsets),
        }
    )


def decode_producer_offsets(data: bytes) -> tuple[str, tuple[Offset, ...]]:
    doc = load(data, "producer offsets payload", PRODUCER_OFFSETS_VERSION)
    try:
        return str(doc["producer_id"]), _offsets_of(doc["offsets"])
    except SHAPE_ERRORS as e:
        raise malformed("producer offsets payload", e, data) from e
