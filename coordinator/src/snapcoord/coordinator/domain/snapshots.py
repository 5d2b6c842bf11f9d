"""Generation snapshots: the rules, without I/O.

An application takes numbered snapshots. Creating one bumps the generation; every task of the
snapshot's task set reports its committed offsets and state checkpoints for that generation; the
report that completes the set completes the snapshot. Reports for any other generation are fenced.
Retention keeps the newest completed snapshots and drops old ones, never a pinned one and never
the newest completed one.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.offsets import Offset, validate_offsets
from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.errors import InvalidArgument, Reason

#: The reason the janitor gives when it aborts a snapshot that outlived its timeout.
TIMEOUT_REASON = "timeout"
MAX_LABELS = 64
MAX_LABEL_BYTES = 1024
MAX_REASON_CHARS = 1024
#: The abort reason that encodes widest, for the size budgets: stored JSON escapes a character
#: outside the BMP as a surrogate pair, 12 bytes (``\\ud83d\\ude00``), where "r" takes 1.
WIDEST_REASON = "\U0001f600" * MAX_REASON_CHARS
#: Of a transaction's bytes, what is not a header's or a report's data: paths (with a chroot),
#: op headers, the deadline and retention entries of a completion.
REQUEST_RESERVE_BYTES = 16 * 1024
#: The node data one transaction may carry on every backend (``storage.metadata.MAX_NODE_BYTES``).
TRANSACTION_DATA_BYTES = 1_000_000


class State(enum.Enum):
    EMPTY = "EMPTY"
    CREATED = "CREATED"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    #: Being deleted step by step (its task nodes in bounded batches, the header last): gone for
    #: readers, leases and retention; whoever finds it finishes the deletion.
    DELETING = "DELETING"


@dataclass(frozen=True)
class SnapshotPolicy:
    """Server-side limits and defaults, from the configuration (``config.options.OPTIONS`` names
    the option of each field; ``config.settings.FIXED`` lists the fields no option sets). A
    field's default here is its option's default: the option reads it."""

    #: A snapshot still CREATED this long after creation (timeout_ms=0) is aborted ("timeout").
    default_timeout_ms: int = 10 * 60_000
    max_timeout_ms: int = 7 * 24 * 3_600_000
    #: Longest TTL a snapshot or a retention policy may ask for (fixed: no option).
    max_ttl_ms: int = 365 * 24 * 3_600_000
    #: Most tasks in one snapshot's task set.
    max_tasks: int = 5_000
    #: Most committed offsets in one task report (fixed: no option).
    max_offsets_per_task: int = 10_000
    #: Most checkpoint bytes one ReportTaskSnapshot carries inline (``--max-inline-payload``); larger
    #: payloads stream with UploadCheckpoint. It sizes gRPC's receive limit (``memory_bounds``).
    max_report_bytes: int = 4 * 1024 * 1024
    #: Retention for apps without a SetRetentionPolicy override.
    default_keep_last_completed: int = 3
    default_completed_ttl_ms: int = 7 * 24 * 3_600_000
    #: A lease pins until its expiry plus this margin (replicas' clocks may disagree).
    max_clock_skew_ms: int = 5_000
    #: Most bytes one UploadCheckpoint may stream into the blob store.
    max_upload_bytes: int = 8 * 1024**3
    #: Most checkpoint entries (inline and uploaded) in one ReportTaskSnapshot (each is a ref in
    #: the report, and a blob put or an intent to retire).
    max_checkpoints_per_report: int = 64
    #: Most payload bytes GetSnapshot returns inline (include_checkpoints); beyond, ReadCheckpoint
    #: streams each payload.
    max_inline_read_bytes: int = 64 * 1024 * 1024
    #: Checkpoints of at most this many bytes are stored in their task's report in ZooKeeper (no
    #: blob store call); larger ones go to the blob store. The stored report, inline payloads
    #: included (base64), must still fit ``report_budget_bytes``. 0 stores every checkpoint in the
    #: blob store (the only report format earlier releases read).
    inline_checkpoint_max_bytes: int = 4096
    #: ZooKeeper's jute.maxbuffer: the header and report byte budgets derive from it.
    max_request_bytes: int = 1_048_575

    @property
    def header_budget_bytes(self) -> int:
        """Most bytes of a stored snapshot header (task set, labels, abort reason). A report
        writes its header and its own report in one transaction, so each gets half of what one
        transaction may carry: the request limit less a reserve for paths and the other ops, and
        never more than the stores' data limit per transaction (``TRANSACTION_DATA_BYTES``)."""
        return min(self.max_request_bytes - REQUEST_RESERVE_BYTES, TRANSACTION_DATA_BYTES) // 2

    @property
    def report_budget_bytes(self) -> int:
        """Most bytes of a stored task report (offsets, checkpoint refs): the other half."""
        return self.header_budget_bytes


@dataclass(frozen=True)
class RetentionPolicy:
    """Per-app retention; 0 in a field means "the server default"."""

    keep_last_completed: int
    completed_ttl_ms: int

    def effective(self, policy: SnapshotPolicy) -> RetentionPolicy:
        return RetentionPolicy(
            keep_last_completed=self.keep_last_completed or policy.default_keep_last_completed,
            completed_ttl_ms=self.completed_ttl_ms or policy.default_completed_ttl_ms,
        )


DEFAULT_RETENTION = RetentionPolicy(0, 0)


@dataclass(frozen=True)
class SnapshotRecord:
    """One generation's header, as the metadata store holds it (task reports are stored apart)."""

    app_id: str
    generation: int
    state: State
    task_ids: tuple[str, ...]
    reported: int
    created_at_ms: int
    completed_at_ms: int
    ended_at_ms: int
    deadline_ms: int
    ttl_ms: int
    labels: tuple[tuple[str, str], ...]
    abort_reason: str

    @property
    def is_ended(self) -> bool:
        return self.state in (State.COMPLETED, State.ABORTED)

    def expires_at_ms(self) -> int:
        """When this snapshot's own TTL ends (0: none of its own; the app's retention decides)."""
        return self.ended_at_ms + self.ttl_ms if self.is_ended and self.ttl_ms else 0


@dataclass(frozen=True)
class CheckpointRef:
    """A state store checkpoint payload: in the blob store (``object_key``), or, when small, held
    by the report itself (``inline``; ``object_key`` is then empty)."""

    store: str
    object_key: str
    size: int
    sha256: str
    inline: bytes | None = None


@dataclass(frozen=True)
class TaskReport:
    """A task's report for one generation: offsets inline, checkpoints inline or as pointers."""

    task_id: str
    committed_offsets: tuple[Offset, ...]
    checkpoints: tuple[CheckpointRef, ...]
    digest: str

    @property
    def object_keys(self) -> tuple[str, ...]:
        """The blob store objects this report references (its checkpoints that are not inline)."""
        return tuple(c.object_key for c in self.checkpoints if c.inline is None)


@dataclass(frozen=True)
class Snapshot:
    """A snapshot as callers see it; ``tasks`` holds the reports read with it."""

    record: SnapshotRecord
    tasks: tuple[TaskReport, ...]


def empty_snapshot(app_id: str, generation: int = 0) -> Snapshot:
    """What GetCurrentSnapshot answers when the app has no stored snapshot at its generation."""
    record = SnapshotRecord(app_id, generation, State.EMPTY, (), 0, 0, 0, 0, 0, 0, (), "")
    return Snapshot(record, ())


def validate_create(
    app_id: str,
    task_ids: Sequence[str],
    ttl_ms: int,
    timeout_ms: int,
    labels: Mapping[str, str],
    policy: SnapshotPolicy,
) -> tuple[tuple[str, ...], int, int, tuple[tuple[str, str], ...]]:
    """Check a CreateSnapshot request; return (task ids, ttl, effective timeout, sorted labels)."""
    require_id("app_id", app_id)
    if not task_ids:
        raise InvalidArgument("task_ids is empty: a snapshot needs at least one task")
    if len(task_ids) > policy.max_tasks:
        raise InvalidArgument(f"task_ids has {len(task_ids)} entries; the limit is {policy.max_tasks}")
    seen: dict[str, int] = {}
    for i, task_id in enumerate(task_ids):
        require_id(f"task_ids[{i}]", task_id)
        if task_id in seen:
            raise InvalidArgument(
                f"task_ids[{i}] repeats {quote_prefix(task_id)} (first at task_ids[{seen[task_id]}])"
            )
        seen[task_id] = i
    if ttl_ms < 0 or ttl_ms > policy.max_ttl_ms:
        raise InvalidArgument(
            f"ttl_ms is {ttl_ms}; use 1-{policy.max_ttl_ms}, or 0 for the app's retention policy"
        )
    if timeout_ms < 0 or timeout_ms > policy.max_timeout_ms:
        raise InvalidArgument(
            f"timeout_ms is {timeout_ms}; use 1-{policy.max_timeout_ms}, or 0 for the server default "
            f"({policy.default_timeout_ms})"
        )
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(f"labels has {len(labels)} entries; the limit is {MAX_LABELS}")
    for key, value in labels.items():
        if not key or len(key.encode()) + len(value.encode()) > MAX_LABEL_BYTES:
            raise InvalidArgument(
                f"label {quote_prefix(key)} must have a non-empty key and at most {MAX_LABEL_BYTES} bytes "
                "of key and value"
            )
    return tuple(task_ids), ttl_ms, timeout_ms or policy.default_timeout_ms, tuple(sorted(labels.items()))


def validate_retention(
    app_id: str, keep_last_completed: int, completed_ttl_ms: int, policy: SnapshotPolicy
) -> None:
    require_id("app_id", app_id)
    if keep_last_completed < 0:
        raise InvalidArgument(
            f"keep_last_completed is {keep_last_completed}; use 1 or more, or 0 for the server default "
            f"({policy.default_keep_last_completed})"
        )
    if completed_ttl_ms < 0 or completed_ttl_ms > policy.max_ttl_ms:
        raise InvalidArgument(
            f"completed_ttl_ms is {completed_ttl_ms}; use 1-{policy.max_ttl_ms}, or 0 for the server default"
        )


def validate_report(
    app_id: str,
    generation: int,
    task_id: str,
    offsets: Iterable[Offset],
    checkpoints: Mapping[str, bytes],
    policy: SnapshotPolicy,
    uploads: Mapping[str, str] | None = None,
) -> tuple[Offset, ...]:
    """Check a ReportTaskSnapshot request (everything that needs no stored state); ``uploads``
    maps store names to UploadCheckpoint ids (their format is the registry's to check)."""
    uploads = uploads or {}
    require_id("app_id", app_id)
    if generation <= 0:
        raise InvalidArgument(f"generation is {generation}; generations start at 1")
    require_id("task.task_id", task_id)
    items = tuple(offsets)
    if items:
        items = validate_offsets(items, field="task.committed_offsets", max_count=policy.max_offsets_per_task)
    entries = len(checkpoints) + len(uploads)
    if entries > policy.max_checkpoints_per_report:
        where = (
            "task.checkpoints has" if not uploads else "task.checkpoints and task.uploaded_checkpoints have"
        )
        raise InvalidArgument(
            f"{where} {entries} entries; the limit per report is "
            f"{policy.max_checkpoints_per_report} (--snapshot-max-checkpoints)",
            reason=Reason.TOO_LARGE,
            metadata={"field": "task.checkpoints", "limit": policy.max_checkpoints_per_report},
        )
    total = 0
    for store, payload in checkpoints.items():
        # The field name quotes only a prefix: the key itself may be megabytes long.
        require_id(f"task.checkpoints key {quote_prefix(store)}", store)
        total += len(payload)
    for store in uploads:
        require_id(f"task.uploaded_checkpoints key {quote_prefix(store)}", store)
        if store in checkpoints:
            raise InvalidArgument(
                f"store {quote_prefix(store)} is in both task.checkpoints and task.uploaded_checkpoints; "
                "a store's checkpoint is either inline or uploaded"
            )
    if total > policy.max_report_bytes:
        raise InvalidArgument(
            f"task.checkpoints hold {total} bytes inline; the limit per report is "
            f"{policy.max_report_bytes} (--max-inline-payload): stream larger payloads with "
            "UploadCheckpoint (CoordinatorClient.upload_checkpoint) and name them in "
            "task.uploaded_checkpoints",
            reason=Reason.TOO_LARGE,
            metadata={"field": "task.checkpoints", "limit": policy.max_report_bytes, "size": total},
        )
    return items


def report_digest(offsets: Sequence[Offset], checkpoints: Mapping[str, bytes]) -> str:
    """A fingerprint of a report's content, so a retry is recognised as the same report.

    Offsets are compared as a set of (stream, partition, offset); checkpoints by store name and
    payload hash, so neither the order of fields nor of entries matters.
    """
    return report_digest_of(offsets, {k: hashlib.sha256(v).hexdigest() for k, v in checkpoints.items()})


def report_digest_of(offsets: Sequence[Offset], checkpoint_sha256: Mapping[str, str]) -> str:
    """``report_digest`` from the payloads' hashes (a caller that hashed them once already)."""
    doc = {
        "offsets": sorted([o.stream, o.partition, o.offset] for o in offsets),
        "checkpoints": sorted([k, sha] for k, sha in checkpoint_sha256.items()),
    }
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Retained:
    """What retention needs to know about one stored snapshot."""

    generation: int
    state: State
    ended_at_ms: int
    ttl_ms: int


def retention_victims(
    snapshots: Iterable[Retained],
    retention: RetentionPolicy,
    now_ms: int,
    is_pinned: Iterable[int] = (),
) -> list[int]:
    """The generations retention deletes now, oldest first.

    Completed: beyond the newest ``keep_last_completed``, or past their TTL (their own, else the
    app's). Aborted: past the TTL. Never a CREATED snapshot, a pinned one, or the newest completed
    one (the one a restore needs).
    """
    pinned = set(is_pinned)
    items = sorted(snapshots, key=lambda s: s.generation, reverse=True)
    completed = [s for s in items if s.state is State.COMPLETED]
    newest_completed = completed[0].generation if completed else None
    keep = {s.generation for s in completed[: retention.keep_last_completed]}
    victims = []
    for s in items:
        if (
            s.generation in pinned
            or s.generation == newest_completed
            or s.state not in (State.COMPLETED, State.ABORTED)
        ):
            continue
        expired = now_ms >= s.ended_at_ms + (s.ttl_ms or retention.completed_ttl_ms)
        if expired or (s.state is State.COMPLETED and s.generation not in keep):
            victims.append(s.generation)
    return sorted(victims)
