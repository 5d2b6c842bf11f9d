"""The largest ZooKeeper request each RPC can send at the configured limits (issue #11 D5/D6).

For every RPC, ``worst_case_ops`` builds the one transaction that RPC sends in its worst legal
case: maximum-length (200-character) identifiers, every count at its configured maximum, the
branch with the most operations (a first write creates parents, an expired lease is replaced
with different snapshots...). Data comes from the real domain encoders; ``zk_request_size``
turns the ops into the exact request size, to compare with ``jute.maxbuffer``. A test can then
assert that every legal request fits, and a limit change shows its cost at once.

Paths. The registries' layout functions are private and are being restructured, so the path
templates are restated here (``_Layout``); each names the registry function it mirrors. When a
registry changes its layout, change the template with it (phase 2 of #11 moves both to one
place and asserts they agree).

Two sizes are unbounded by any limit today and are fixed at a stated assumption:
``pin_holders`` (leases holding one snapshot: the pin index lists them all) and
``checkpoints_per_report`` (only their bytes are capped, D7).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from snapcoord.coordinator.domain.backlog import (
    SHARD_SIZE,
    BacklogPolicy,
    JobRecord,
    ShardProgress,
    empty_shard,
)
from snapcoord.coordinator.domain.backlog_codec import encode_job_record, encode_shard
from snapcoord.coordinator.domain.codec import encode_producer_record
from snapcoord.coordinator.domain.ids import MAX_ID_LENGTH
from snapcoord.coordinator.domain.leases import Lease, LeasePolicy, SnapshotRef, encode_lease, encode_pins
from snapcoord.coordinator.domain.offsets import MAX_PARTITION, Offset
from snapcoord.coordinator.domain.producers import ProducerPolicy, ProducerRecord
from snapcoord.coordinator.domain.snapshot_codec import encode_app, encode_retention, encode_snapshot
from snapcoord.coordinator.domain.snapshot_codec import encode_task_report as encode_report
from snapcoord.coordinator.domain.snapshots import (
    MAX_LABEL_BYTES,
    MAX_LABELS,
    MAX_REASON_CHARS,
    CheckpointRef,
    RetentionPolicy,
    SnapshotPolicy,
    SnapshotRecord,
    State,
    TaskReport,
)
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Op, SetData
from snapcoord.coordinator.storage.zk_request_size import ZK_DEFAULT_MAX_REQUEST_BYTES, request_bytes

#: A far-future time (year 2039): every timestamp and minute bucket at its longest realistic width.
_NOW_MS = 2**41
_BIG_INT = 2**63 - 1
_MINUTE = 60_000


@dataclass(frozen=True)
class Limits:
    """The configured limits, plus the two sizes no limit bounds yet."""

    producers: ProducerPolicy = field(default_factory=ProducerPolicy)
    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    leases: LeasePolicy = field(default_factory=LeasePolicy)
    backlog: BacklogPolicy = field(default_factory=BacklogPolicy)
    #: Leases pinning one snapshot (D5's reproducer: two).
    pin_holders: int = 2
    #: Checkpoint entries in one report (D7: unlimited; a Spark task has a few state stores).
    checkpoints_per_report: int = 16
    #: The ZooKeeper chroot: every path is sent with it.
    chroot: str = "/" + "c" * 63


def _id(tag: str, i: int = 0) -> str:
    """A distinct identifier of the maximum length."""
    head = f"{tag}{i}-"
    return head + "x" * (MAX_ID_LENGTH - len(head))


def _uuid() -> str:
    return uuid.UUID(int=2**128 - 1).hex


class _Layout:
    """The registries' path templates (see the module docstring)."""

    @staticmethod
    def bucket(due_ms: int) -> int:
        return due_ms // _MINUTE  # expiry_index.bucket_of

    # producers.py: RECORDS, EXPIRY, _record_path, ProducerRecord.index_entry
    @staticmethod
    def producer(producer_id: str) -> str:
        return f"/producers/records/{producer_id}"

    @classmethod
    def producer_index(cls, record: ProducerRecord) -> str:
        return f"/producers/expiry/{cls.bucket(record.expires_at_ms)}/{record.index_entry}"

    # snapshots.py: APPS, DEADLINES, RETENTION, PINS, _app_path, _gens_path, _gen_path, ...
    @staticmethod
    def app(app_id: str) -> str:
        return f"/snapshots/apps/{app_id}"

    @classmethod
    def gens(cls, app_id: str) -> str:
        return f"{cls.app(app_id)}/gens"

    @classmethod
    def gen(cls, app_id: str, generation: int) -> str:
        return f"{cls.gens(app_id)}/{generation:020d}"

    @classmethod
    def tasks(cls, app_id: str, generation: int) -> str:
        return f"{cls.gen(app_id, generation)}/tasks"

    @classmethod
    def task(cls, app_id: str, generation: int, task_id: str) -> str:
        return f"{cls.tasks(app_id, generation)}/{task_id}"

    @classmethod
    def deadline(cls, due_ms: int, app_id: str, generation: int) -> str:
        return f"/snapshots/deadlines/{cls.bucket(due_ms)}/{app_id}@{generation}"

    @classmethod
    def retention_entry(cls, due_ms: int, name: str) -> str:
        return f"/snapshots/retention/{cls.bucket(due_ms)}/{name}"

    @classmethod
    def retention(cls, app_id: str) -> str:
        return f"{cls.app(app_id)}/retention"

    @staticmethod
    def pin(app_id: str, generation: int) -> str:
        return f"/snapshots/pins/{app_id}@{generation}"

    # leases.py: RECORDS, EXPIRY, _record_path
    @staticmethod
    def lease(lease_id: str) -> str:
        return f"/leases/records/{lease_id}"

    @classmethod
    def lease_index(cls, due_ms: int, lease_id: str) -> str:
        return f"/leases/expiry/{cls.bucket(due_ms)}/{lease_id}"

    # backlog.py: JOBS, _job_path, _shard_name, _marker_name
    @staticmethod
    def job(job_id: str) -> str:
        return f"/backlog/jobs/{job_id}"

    @classmethod
    def shard(cls, job_id: str, mark_id: str, shard: int) -> str:
        return f"{cls.job(job_id)}/s-{mark_id}-{shard}"

    @classmethod
    def marker(cls, job_id: str, mark_id: str, shard: int, unfinished: int) -> str:
        return f"{cls.job(job_id)}/r-{mark_id}-{shard}-{unfinished}"


L = _Layout
_GEN = 10**19  # the widest generation a 20-digit path holds


# -- producers ---------------------------------------------------------------------------------


def _producer_record(limits: Limits) -> ProducerRecord:
    pid = _id("p")
    expires = _NOW_MS + limits.producers.max_ttl_ms
    return ProducerRecord(pid, f"producers/{pid}/{_uuid()}.json", _NOW_MS, expires)


def register_producer_offsets(limits: Limits) -> list[Op]:
    """Replacing an expired record: SetData, and the index entry moves (producers._commit)."""
    record = _producer_record(limits)
    return [
        SetData(L.producer(record.producer_id), encode_producer_record(record), _BIG_INT),
        Delete(L.producer_index(record), None),
        Create(L.producer_index(record), b""),
    ]


def delete_producer_offsets(limits: Limits) -> list[Op]:
    record = _producer_record(limits)
    return [Delete(L.producer(record.producer_id), _BIG_INT), Delete(L.producer_index(record), None)]


# -- snapshots ---------------------------------------------------------------------------------


def _header(limits: Limits, state: State, reason: str = "") -> SnapshotRecord:
    p = limits.snapshots
    labels = tuple((f"{i:04d}" + "k" * 96, "v" * (MAX_LABEL_BYTES - 100)) for i in range(MAX_LABELS))
    tasks = tuple(_id("t", i) for i in range(p.max_tasks))
    return SnapshotRecord(
        app_id=_id("a"),
        generation=_GEN,
        state=state,
        task_ids=tasks,
        reported=p.max_tasks,
        created_at_ms=_NOW_MS,
        completed_at_ms=_NOW_MS,
        ended_at_ms=_NOW_MS,
        deadline_ms=_NOW_MS + p.max_timeout_ms,
        ttl_ms=p.max_ttl_ms,
        labels=labels,
        abort_reason=reason,
    )


def _ended_ops(record: SnapshotRecord) -> list[Op]:
    """snapshots._ended_ops: drop the deadline entry, add a retention entry."""
    return [
        Delete(L.deadline(record.deadline_ms, record.app_id, record.generation), None),
        Create(L.retention_entry(record.ended_at_ms, f"{record.app_id}@{record.generation}"), b""),
    ]


def create_snapshot(limits: Limits) -> list[Op]:
    """The app's first snapshot: the app and gens nodes too (snapshots.create)."""
    record = _header(limits, State.CREATED)
    return [
        Create(L.app(record.app_id), encode_app(record.generation)),
        Create(L.gens(record.app_id), b""),
        Create(L.gen(record.app_id, record.generation), encode_snapshot(record)),
        Create(L.tasks(record.app_id, record.generation), b""),
        Create(L.deadline(record.deadline_ms, record.app_id, record.generation), b""),
    ]


def report_task_snapshot(limits: Limits) -> list[Op]:
    """The report that completes the snapshot: report node, header, ended ops (snapshots.report)."""
    p = limits.snapshots
    record = _header(limits, State.COMPLETED)
    offsets = tuple(Offset(_id("s", i), MAX_PARTITION, _BIG_INT) for i in range(p.max_offsets_per_task))
    checkpoints = tuple(
        CheckpointRef(
            _id("c", i),
            f"snapshots/{record.app_id}/{_GEN}/{_id('t')}/{_uuid()}",
            p.max_report_bytes,
            "f" * 64,
        )
        for i in range(limits.checkpoints_per_report)
    )
    report = TaskReport(_id("t"), offsets, checkpoints, "f" * 64)
    return [
        Create(L.task(record.app_id, record.generation, report.task_id), encode_report(report)),
        SetData(L.gen(record.app_id, record.generation), encode_snapshot(record), _BIG_INT),
        *_ended_ops(record),
    ]


def abort_snapshot(limits: Limits) -> list[Op]:
    record = _header(limits, State.ABORTED, "r" * MAX_REASON_CHARS)
    return [
        SetData(L.gen(record.app_id, record.generation), encode_snapshot(record), _BIG_INT),
        *_ended_ops(record),
    ]


def delete_snapshot(limits: Limits) -> list[Op]:
    """Every reported task's node, the tasks node and the header, guarded by the pin check; the
    unpinned guard is a Create + Delete of the pin path (snapshots.pin_state, _delete_snapshot)."""
    record = _header(limits, State.COMPLETED)
    app, gen = record.app_id, record.generation
    guard: list[Op] = [Create(L.pin(app, gen), b""), Delete(L.pin(app, gen), None)]
    tasks: list[Op] = [Delete(L.task(app, gen, t), None) for t in record.task_ids]
    return [*guard, *tasks, Delete(L.tasks(app, gen), None), Delete(L.gen(app, gen), _BIG_INT)]


def set_retention_policy(limits: Limits) -> list[Op]:
    """The larger of its two transactions: the policy node and its retention trigger."""
    app = _id("a")
    policy = RetentionPolicy(_BIG_INT, limits.snapshots.max_ttl_ms)
    return [
        Create(L.retention(app), encode_retention(policy)),
        Create(L.retention_entry(_NOW_MS, f"{app}@policy"), b""),
    ]


# -- leases ------------------------------------------------------------------------------------


def _refs(limits: Limits, tag: str) -> tuple[SnapshotRef, ...]:
    return tuple(SnapshotRef(_id(tag, i), _GEN) for i in range(limits.leases.max_snapshots))


def _holders(limits: Limits, lease_id: str) -> dict[str, int]:
    others = {_id("other", i): _NOW_MS for i in range(limits.pin_holders - 1)}
    return {**others, lease_id: _NOW_MS}


def _lease(limits: Limits, refs: Sequence[SnapshotRef]) -> Lease:
    return Lease(_id("l"), limits.leases.max_duration_ms, _NOW_MS, tuple(sorted(refs)))


def _record_move(limits: Limits, lease: Lease) -> list[Op]:
    """leases._record_ops for an existing lease whose expiry bucket moves."""
    due = lease.expires_at_ms + limits.leases.max_clock_skew_ms
    return [
        SetData(L.lease(lease.lease_id), encode_lease(lease), _BIG_INT),
        Delete(L.lease_index(due, lease.lease_id), None),
        Create(L.lease_index(due, lease.lease_id), b""),
    ]


def _triggers(refs: Sequence[SnapshotRef]) -> list[Op]:
    """snapshots.retention_triggers: one entry per distinct app."""
    apps = sorted({r.app_id for r in refs})
    return [Create(L.retention_entry(_NOW_MS, f"{a}@unpinned-{'u' * 12}"), b"") for a in apps]


def acquire_snapshots(limits: Limits) -> list[Op]:
    """An expired lease re-acquired on as many other snapshots: check and pin every new one,
    unpin every old one, rewrite the record, trigger retention for the old apps (leases.acquire)."""
    new, old = _refs(limits, "n"), _refs(limits, "o")
    lease = _lease(limits, new)
    pins = encode_pins(_holders(limits, lease.lease_id))
    leftover = encode_pins(_holders(limits, "gone")) if limits.pin_holders > 1 else b""
    ops: list[Op] = [Check(L.gen(r.app_id, r.generation), _BIG_INT) for r in new]
    ops += [SetData(L.pin(r.app_id, r.generation), pins, _BIG_INT) for r in new]
    ops += [
        SetData(L.pin(r.app_id, r.generation), leftover, _BIG_INT)
        if leftover
        else Delete(L.pin(r.app_id, r.generation), _BIG_INT)
        for r in old
    ]
    return ops + _record_move(limits, lease) + _triggers(old)


def release_snapshots(limits: Limits) -> list[Op]:
    refs = _refs(limits, "o")
    lease = _lease(limits, ())
    leftover = encode_pins(_holders(limits, "gone")) if limits.pin_holders > 1 else b""
    ops: list[Op] = [
        SetData(L.pin(r.app_id, r.generation), leftover, _BIG_INT)
        if leftover
        else Delete(L.pin(r.app_id, r.generation), _BIG_INT)
        for r in refs
    ]
    return ops + _record_move(limits, lease) + _triggers(refs)


def renew_lease(limits: Limits) -> list[Op]:
    """The new expiry goes into every pin index too (leases.renew)."""
    lease = _lease(limits, _refs(limits, "n"))
    pins = encode_pins(_holders(limits, lease.lease_id))
    ops: list[Op] = [SetData(L.pin(r.app_id, r.generation), pins, _BIG_INT) for r in lease.snapshots]
    return ops + _record_move(limits, lease)


def drop_lease(limits: Limits) -> list[Op]:
    refs = _refs(limits, "o")
    lease = _lease(limits, refs)
    leftover = encode_pins(_holders(limits, "gone")) if limits.pin_holders > 1 else b""
    ops: list[Op] = [
        SetData(L.pin(r.app_id, r.generation), leftover, _BIG_INT)
        if leftover
        else Delete(L.pin(r.app_id, r.generation), _BIG_INT)
        for r in refs
    ]
    due = lease.expires_at_ms + limits.leases.max_clock_skew_ms
    ops += [Delete(L.lease(lease.lease_id), _BIG_INT), Delete(L.lease_index(due, lease.lease_id), None)]
    return ops + _triggers(refs)


# -- backlog -----------------------------------------------------------------------------------


def _job(limits: Limits) -> JobRecord:
    return JobRecord(_id("j"), _uuid(), limits.backlog.max_partitions, SHARD_SIZE, _NOW_MS)


def _old_children(job: JobRecord, mark_id: str) -> list[Op]:
    ops: list[Op] = []
    for shard in range(job.shard_count):
        ops.append(Delete(L.shard(job.job_id, mark_id, shard), None))
        ops.append(Delete(L.marker(job.job_id, mark_id, shard, SHARD_SIZE), None))
    return ops


def mark_backlog(limits: Limits) -> list[Op]:
    """A reset: the record rewritten, the old mark's nodes deleted, the new ones created."""
    job = _job(limits)
    ops: list[Op] = [SetData(L.job(job.job_id), encode_job_record(job), _BIG_INT)]
    ops += _old_children(job, "0" * 32)
    for shard in range(job.shard_count):
        ops.append(Create(L.shard(job.job_id, job.mark_id, shard), encode_shard(empty_shard(0))))
        ops.append(Create(L.marker(job.job_id, job.mark_id, shard, SHARD_SIZE), b""))
    return ops


def report_progress(limits: Limits) -> list[Op]:
    """Every shard rewritten with every partition finished by this report, and its marker
    removed. The registry splits a report into transactions of about CHUNK_BYTES of shard data
    (backlog._write_progress); this is the unsplit size, an upper bound of each part."""
    job = _job(limits)
    ops: list[Op] = []
    for shard in range(job.shard_count):
        span = job.shard_span(shard)
        full = ShardProgress(tuple([_BIG_INT] * len(span)), {i: "f" * 16 for i in range(len(span))})
        ops.append(SetData(L.shard(job.job_id, job.mark_id, shard), encode_shard(full), _BIG_INT))
        ops.append(Delete(L.marker(job.job_id, job.mark_id, shard, len(span)), None))
    return ops


def clear_backlog(limits: Limits) -> list[Op]:
    job = _job(limits)
    return [*_old_children(job, job.mark_id), Delete(L.job(job.job_id), _BIG_INT)]


def _reads_only(limits: Limits) -> list[Op]:
    return []


#: Every RPC of snapcoord.v1 -> its worst-case transaction (read-only RPCs send none).
WORST_CASE: dict[str, Callable[[Limits], list[Op]]] = {
    "ProducerOffsetService/RegisterProducerOffsets": register_producer_offsets,
    "ProducerOffsetService/GetProducerOffsets": _reads_only,
    "ProducerOffsetService/DeleteProducerOffsets": delete_producer_offsets,
    "ProducerOffsetService/ListProducerOffsets": _reads_only,
    "SnapshotService/CreateSnapshot": create_snapshot,
    "SnapshotService/GetCurrentSnapshot": _reads_only,
    "SnapshotService/GetSnapshot": _reads_only,
    "SnapshotService/ListSnapshots": _reads_only,
    "SnapshotService/ReportTaskSnapshot": report_task_snapshot,
    "SnapshotService/AbortSnapshot": abort_snapshot,
    "SnapshotService/DeleteSnapshot": delete_snapshot,
    "SnapshotService/SetRetentionPolicy": set_retention_policy,
    "LeaseService/AcquireSnapshots": acquire_snapshots,
    "LeaseService/ReleaseSnapshots": release_snapshots,
    "LeaseService/RenewLease": renew_lease,
    "LeaseService/DropLease": drop_lease,
    "LeaseService/GetLease": _reads_only,
    "LeaseService/ListLeases": _reads_only,
    "BacklogService/MarkBacklog": mark_backlog,
    "BacklogService/ReportProgress": report_progress,
    "BacklogService/GetBacklogStatus": _reads_only,
    "BacklogService/ClearBacklog": clear_backlog,
}


@dataclass(frozen=True)
class Row:
    rpc: str
    ops: int
    request_bytes: int
    limit: int

    @property
    def fits(self) -> bool:
        return self.request_bytes <= self.limit


def worst_case_table(
    limits: Limits | None = None, max_request_bytes: int = ZK_DEFAULT_MAX_REQUEST_BYTES
) -> list[Row]:
    """One row per RPC: its worst-case transaction's op count and exact request size."""
    limits = limits or Limits()
    rows = []
    for rpc, build in WORST_CASE.items():
        ops = build(limits)
        size = request_bytes(ops, chroot=limits.chroot) if ops else 0
        rows.append(Row(rpc, len(ops), size, max_request_bytes))
    return rows
