"""Stored formats of generation snapshots (versioned JSON; see ``codec`` for the conventions).

A snapshot header carries its whole task set, and every report reads and decodes it (the report
that completes the snapshot also re-encodes and writes it): at 1000 tasks that JSON work
dominated a report's CPU. So headers are memoised on both sides (``Lru``), with the bytes
unchanged: decoding bytes seen before (the header this process wrote or read last, read again by
the next report; the header a consistent read or a repeated create reads again) returns the
record made then, and encoding reuses a large task set's JSON array, spliced into the rest of the
document exactly where ``json.dumps(sort_keys=True)`` puts it.

Reports are counted in the small ``tasks`` node (``encode_reported``), not in the header, so that
a report writes a few bytes, not the task set again.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from typing import Any

from snapcoord.coordinator.domain.documents import SHAPE_ERRORS, dump, load, malformed
from snapcoord.coordinator.domain.lru import Lru
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import (
    CheckpointRef,
    RetentionPolicy,
    SnapshotRecord,
    State,
    TaskReport,
)
from snapcoord.coordinator.errors import CorruptRecord

APP_VERSION = 1
SNAPSHOT_VERSION = 1
REPORTED_VERSION = 1
TASK_REPORT_VERSION = 1
#: A report with at least one checkpoint held inline (``data``, base64, instead of ``object_key``).
#: Reports without one are written as version 1, which every release reads; a release that reads
#: only version 1 refuses a version 2 report ("newer than this snapcoord reads") instead of
#: misreading it.
INLINE_TASK_REPORT_VERSION = 2
RETENTION_VERSION = 1


def encode_app(current_generation: int) -> bytes:
    return dump({"version": APP_VERSION, "current_generation": current_generation})


def decode_app(data: bytes) -> int:
    doc = load(data, "snapshot app record", APP_VERSION)
    try:
        return int(doc["current_generation"])
    except SHAPE_ERRORS as e:
        raise malformed("snapshot app record", e, data) from e


def encode_reported(count: int) -> bytes:
    """The data of a snapshot's ``tasks`` node: how many reports it counted."""
    return dump({"version": REPORTED_VERSION, "reported": count})


def decode_reported(data: bytes) -> int:
    """``encode_reported``'s count; 0 for the empty node CreateSnapshot makes. (Servers before
    this counter counted in the header's ``reported``: a snapshot's count is the sum of both.)"""
    if not data:
        return 0
    doc = load(data, "snapshot report counter", REPORTED_VERSION)
    try:
        count = int(doc["reported"])
    except SHAPE_ERRORS as e:
        raise malformed("snapshot report counter", e, data) from e
    if count < 0:
        raise malformed("snapshot report counter", ValueError(f"negative count {count}"), data)
    return count


#: Task-set arrays smaller than this are encoded directly: that memo only pays off where the task
#: set dominates. (Headers of every size are memoised: a small one's decode costs ~10 us, a hit
#: ~1.5 us.)
MEMO_MIN_BYTES = 2048
#: What a memoised header weighs beyond twice its bytes (its record and the memo's entry), so
#: that small headers are not kept by the hundred thousand.
RECORD_OVERHEAD_BYTES = 1024
#: The most bytes a memo keeps (keys and values are about the same size): a few hundred large
#: headers, whatever their count.
MEMO_MAX_BYTES = 16 * 1024 * 1024


#: A header's key (``_record_key``) -> its bytes and its record (decoded once, or written by this
#: process).
_RECORDS: Lru[tuple[int, bytes], tuple[bytes, SnapshotRecord]] = Lru(MEMO_MAX_BYTES)
#: Bytes of a header's start in its memo key: the fields a report or an end changes (reported,
#: state, times, reason) come before the task set, unless labels push them further.
KEY_PREFIX_BYTES = 1024


def _record_key(data: bytes) -> tuple[int, bytes]:
    """The memo key of an encoded header: its length and start, not the whole bytes (hashing
    15 KB twice per report cost more than the rest of the lookup). Headers that share a key
    replace each other in the memo; a hit is always checked against the whole bytes."""
    return len(data), data[:KEY_PREFIX_BYTES]


def _remember(data: bytes, record: SnapshotRecord) -> None:
    _RECORDS.put(_record_key(data), (data, record), 2 * len(data) + RECORD_OVERHEAD_BYTES)


#: Task set -> its JSON array, as ``documents.dump`` writes it.
_TASK_ARRAYS: Lru[tuple[str, ...], bytes] = Lru(MEMO_MAX_BYTES)


def _task_array(task_ids: tuple[str, ...]) -> bytes:
    array = _TASK_ARRAYS.get(task_ids)
    if array is None:
        array = json.dumps(list(task_ids), separators=(",", ":")).encode()
        if len(array) >= MEMO_MIN_BYTES:
            _TASK_ARRAYS.put(task_ids, array, 2 * len(array))
    return array


def encode_snapshot(record: SnapshotRecord) -> bytes:
    # ``documents.dump``'s bytes: sorted keys, so the document is every key before "task_ids", then it,
    # then the keys after it ("ttl_ms", "version"); the task array is the memoised part.
    before = dump(
        {
            "abort_reason": record.abort_reason,
            "app_id": record.app_id,
            "completed_at_ms": record.completed_at_ms,
            "created_at_ms": record.created_at_ms,
            "deadline_ms": record.deadline_ms,
            "ended_at_ms": record.ended_at_ms,
            "generation": record.generation,
            "labels": dict(record.labels),
            "reported": record.reported,
            "state": record.state.value,
        }
    )
    # The keys after "task_ids" hold integers, which ``documents.dump`` writes as ``%d`` does.
    after = b'"ttl_ms":%d,"version":%d}' % (record.ttl_ms, SNAPSHOT_VERSION)
    data = b"".join((before[:-1], b',"task_ids":', _task_array(record.task_ids), b",", after))
    # The next report (here, on this replica) reads these bytes back: decoding them is then a
    # lookup. Only a record that decoding would give back equal (labels sorted, as stored).
    if list(record.labels) == sorted(record.labels):
        _remember(data, record)
    return data


def decode_snapshot(data: bytes) -> SnapshotRecord:
    known = _RECORDS.get(_record_key(data))
    if known is not None and known[0] == data:
        return known[1]
    record = _decode_snapshot(data)
    _remember(data, record)
    return record


def _decode_snapshot(data: bytes) -> SnapshotRecord:
    doc = load(data, "snapshot record", SNAPSHOT_VERSION)
    try:
        return SnapshotRecord(
            app_id=str(doc["app_id"]),
            generation=int(doc["generation"]),
            state=State(doc["state"]),
            task_ids=tuple(str(t) for t in doc["task_ids"]),
            reported=int(doc["reported"]),
            created_at_ms=int(doc["created_at_ms"]),
            completed_at_ms=int(doc["completed_at_ms"]),
            ended_at_ms=int(doc["ended_at_ms"]),
            deadline_ms=int(doc["deadline_ms"]),
            ttl_ms=int(doc["ttl_ms"]),
            labels=tuple(sorted((str(k), str(v)) for k, v in doc["labels"].items())),
            abort_reason=str(doc["abort_reason"]),
        )
    except SHAPE_ERRORS as e:
        raise malformed("snapshot record", e, data) from e


def _checkpoint_doc(c: CheckpointRef) -> dict[str, Any]:
    if c.inline is None:
        return {"object_key": c.object_key, "size": c.size, "sha256": c.sha256}
    return {"data": base64.b64encode(c.inline).decode("ascii"), "size": c.size, "sha256": c.sha256}


def _checkpoint_of(store: str, doc: dict[str, Any]) -> CheckpointRef:
    if "data" not in doc:
        return CheckpointRef(store, str(doc["object_key"]), int(doc["size"]), str(doc["sha256"]))
    data = base64.b64decode(str(doc["data"]), validate=True)
    if len(data) != int(doc["size"]):
        raise ValueError(f"checkpoint {store!r} holds {len(data)} bytes, its size says {doc['size']}")
    return CheckpointRef(store, "", len(data), str(doc["sha256"]), inline=data)


def encode_task_report(report: TaskReport) -> bytes:
    inline = any(c.inline is not None for c in report.checkpoints)
    return dump(
        {
            "version": INLINE_TASK_REPORT_VERSION if inline else TASK_REPORT_VERSION,
            "task_id": report.task_id,
            "digest": report.digest,
            "committed_offsets": [[o.stream, o.partition, o.offset] for o in report.committed_offsets],
            "checkpoints": {c.store: _checkpoint_doc(c) for c in report.checkpoints},
        }
    )


def decode_task_report(data: bytes) -> TaskReport:
    doc = load(data, "task report", INLINE_TASK_REPORT_VERSION)
    try:
        return TaskReport(
            task_id=str(doc["task_id"]),
            committed_offsets=tuple(Offset(str(s), int(p), int(o)) for s, p, o in doc["committed_offsets"]),
            checkpoints=tuple(_checkpoint_of(str(k), v) for k, v in sorted(doc["checkpoints"].items())),
            digest=str(doc["digest"]),
        )
    except SHAPE_ERRORS as e:  # binascii.Error (bad base64) is a ValueError
        raise malformed("task report", e, data) from e


def encode_retention(policy: RetentionPolicy) -> bytes:
    return dump(
        {
            "version": RETENTION_VERSION,
            "keep_last_completed": policy.keep_last_completed,
            "completed_ttl_ms": policy.completed_ttl_ms,
        }
    )


def decode_retention(data: bytes) -> RetentionPolicy:
    doc = load(data, "retention policy", RETENTION_VERSION)
    try:
        return RetentionPolicy(int(doc["keep_last_completed"]), int(doc["completed_ttl_ms"]))
    except SHAPE_ERRORS as e:
        raise malformed("retention policy", e, data) from e


#: The ``kind`` of a checkpoint payload that is missing or does not match its report.
CHECKPOINT_PAYLOAD = "checkpoint_payload"


def _payload_mismatch(ref: CheckpointRef, size: int, sha256: str) -> CorruptRecord | None:
    if size != ref.size:
        detail = f"holds {size} bytes, its report says {ref.size}"
    elif sha256 != ref.sha256:
        detail = f"has SHA-256 {sha256}, its report says {ref.sha256}"
    else:
        return None
    where = ref.object_key or "inline"
    return CorruptRecord(
        f"checkpoint payload of store {ref.store!r} ({where}) {detail}",
        kind=CHECKPOINT_PAYLOAD,
        path=ref.object_key,
    )


def checked_payload(ref: CheckpointRef, data: bytes) -> bytes:
    """``data``, the payload of ``ref``, once its size and SHA-256 match the report's: a
    truncated or garbled object is refused, never served."""
    error = _payload_mismatch(ref, len(data), hashlib.sha256(data).hexdigest())
    if error is not None:
        raise error
    return data


def checked_pieces(ref: CheckpointRef, pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The pieces of ``ref``'s payload as they come, checked like ``checked_payload`` when the last
    has passed: a stream of a truncated or garbled object ends with ``CorruptRecord`` instead of
    completing (the caller's own check of size and hash would refuse it too)."""
    digest = hashlib.sha256()
    size = 0
    for piece in pieces:
        digest.update(piece)
        size += len(piece)
        yield piece
    error = _payload_mismatch(ref, size, digest.hexdigest())
    if error is not None:
        raise error
