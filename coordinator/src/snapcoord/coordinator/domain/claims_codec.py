"""The stored formats of commit claims: the table record and one claim per log number, as
versioned JSON documents (``documents``), both format version 1."""

from __future__ import annotations

from snapcoord.coordinator.domain.claims import CommitClaim, TableRecord
from snapcoord.coordinator.domain.documents import SHAPE_ERRORS, dump, load, malformed

COMMIT_CLAIM_TABLE_VERSION = 1
COMMIT_CLAIM_VERSION = 1


def encode_table(record: TableRecord) -> bytes:
    return dump(
        {
            "version": COMMIT_CLAIM_TABLE_VERSION,
            "table_id": record.table_id,
            "fence_epoch": record.fence_epoch,
            "fence_seq": record.fence_seq,
            "fenced_at_ms": record.fenced_at_ms,
            "highest_seq": record.highest_seq,
            "floor_seq": record.floor_seq,
        }
    )


def decode_table(data: bytes) -> TableRecord:
    doc = load(data, "commit claim table", COMMIT_CLAIM_TABLE_VERSION)
    try:
        return TableRecord(
            table_id=str(doc["table_id"]),
            fence_epoch=int(doc["fence_epoch"]),
            fence_seq=int(doc["fence_seq"]),
            fenced_at_ms=int(doc["fenced_at_ms"]),
            highest_seq=int(doc["highest_seq"]),
            floor_seq=int(doc["floor_seq"]),
        )
    except SHAPE_ERRORS as e:
        raise malformed("commit claim table", e, data) from e


def encode_claim(claim: CommitClaim) -> bytes:
    return dump(
        {
            "version": COMMIT_CLAIM_VERSION,
            "seq": claim.seq,
            "epoch": claim.epoch,
            "attempt": claim.attempt,
            "claimed_at_ms": claim.claimed_at_ms,
        }
    )


def decode_claim(data: bytes) -> CommitClaim:
    doc = load(data, "commit claim", COMMIT_CLAIM_VERSION)
    try:
        return CommitClaim(
            seq=int(doc["seq"]),
            epoch=int(doc["epoch"]),
            attempt=str(doc["attempt"]),
            claimed_at_ms=int(doc["claimed_at_ms"]),
        )
    except SHAPE_ERRORS as e:
        raise malformed("commit claim", e, data) from e
