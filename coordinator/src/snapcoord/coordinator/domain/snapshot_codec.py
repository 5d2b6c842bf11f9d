"""Stored formats of generation snapshots (versioned JSON; see ``codec`` for the conventions)."""

from __future__ import annotations

from typing import Any

from snapcoord.coordinator.domain.codec import _dump, _load
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import (
    CheckpointRef,
    RetentionPolicy,
    SnapshotRecord,
    State,
    TaskReport,
)
from snapcoord.coordinator.errors import Internal

APP_VERSION = 1
SNAPSHOT_VERSION = 1
TASK_REPORT_VERSION = 1
RETENTION_VERSION = 1


def _malformed(what: str, e: Exception) -> Internal:
    return Internal(f"stored {what} is malformed: {e!r}")


def encode_app(current_generation: int) -> bytes:
    return _dump({"version": APP_VERSION, "current_generation": current_generation})


def decode_app(data: bytes) -> int:
    doc = _load(data, "snapshot app record", APP_VERSION)
    try:
        return int(doc["current_generation"])
    except (KeyError, TypeError, ValueError) as e:
        raise _malformed("snapshot app record", e) from e


def encode_snapshot(record: SnapshotRecord) -> bytes:
    return _dump(
        {
            "version": SNAPSHOT_VERSION,
            "app_id": record.app_id,
            "generation": record.generation,
            "state": record.state.value,
            "task_ids": list(record.task_ids),
            "reported": record.reported,
            "created_at_ms": record.created_at_ms,
            "completed_at_ms": record.completed_at_ms,
            "ended_at_ms": record.ended_at_ms,
            "deadline_ms": record.deadline_ms,
            "ttl_ms": record.ttl_ms,
            "labels": dict(record.labels),
            "abort_reason": record.abort_reason,
        }
    )


def decode_snapshot(data: bytes) -> SnapshotRecord:
    doc = _load(data, "snapshot record", SNAPSHOT_VERSION)
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
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _malformed("snapshot record", e) from e


def encode_task_report(report: TaskReport) -> bytes:
    checkpoints: dict[str, Any] = {
        c.store: {"object_key": c.object_key, "size": c.size, "sha256": c.sha256} for c in report.checkpoints
    }
    return _dump(
        {
            "version": TASK_REPORT_VERSION,
            "task_id": report.task_id,
            "digest": report.digest,
            "committed_offsets": [[o.stream, o.partition, o.offset] for o in report.committed_offsets],
            "checkpoints": checkpoints,
        }
    )


def decode_task_report(data: bytes) -> TaskReport:
    doc = _load(data, "task report", TASK_REPORT_VERSION)
    try:
        return TaskReport(
            task_id=str(doc["task_id"]),
            committed_offsets=tuple(Offset(str(s), int(p), int(o)) for s, p, o in doc["committed_offsets"]),
            checkpoints=tuple(
                CheckpointRef(
                    store=str(k),
                    object_key=str(v["object_key"]),
                    size=int(v["size"]),
                    sha256=str(v["sha256"]),
                )
                for k, v in sorted(doc["checkpoints"].items())
            ),
            digest=str(doc["digest"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _malformed("task report", e) from e


def encode_retention(policy: RetentionPolicy) -> bytes:
    return _dump(
        {
            "version": RETENTION_VERSION,
            "keep_last_completed": policy.keep_last_completed,
            "completed_ttl_ms": policy.completed_ttl_ms,
        }
    )


def decode_retention(data: bytes) -> RetentionPolicy:
    doc = _load(data, "retention policy", RETENTION_VERSION)
    try:
        return RetentionPolicy(int(doc["keep_last_completed"]), int(doc["completed_ttl_ms"]))
    except (KeyError, TypeError, ValueError) as e:
        raise _malformed("retention policy", e) from e
