"""The rules of every snapshot change, as pure functions of what was read (no I/O).

Each takes the request, the kernel's ``Reads``, the commit still in doubt (``pending``) and the
time, and returns ``Done``, ``Commit`` or ``More`` (see ``kernel.decision``); refusals raise.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.domain.snapshot_codec import (
    decode_app,
    decode_reported,
    decode_snapshot,
    decode_task_report,
    encode_app,
    encode_reported,
    encode_retention,
    encode_snapshot,
    encode_task_report,
)
from snapcoord.coordinator.domain.snapshots import (
    CheckpointRef,
    RetentionPolicy,
    Snapshot,
    SnapshotPolicy,
    SnapshotRecord,
    State,
    TaskReport,
)
from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, NotFound, Reason, SnapcoordError
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.decision import Commit, Done, More, ReadChildren, ReadNode, Reads, landed
from snapcoord.coordinator.snapshots import pins
from snapcoord.coordinator.snapshots.layout import (
    APPS,
    DEADLINES,
    RETENTION,
    app_path,
    deadline_entry,
    gen_path,
    gens_path,
    ref,
    retention_entry,
    retention_path,
    task_path,
    tasks_path,
)
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, Op, SetData

#: The reason recorded when AbortSnapshot gives none.
DEFAULT_ABORT_REASON = "aborted by request"


@dataclass(frozen=True)
class Stored:
    record: SnapshotRecord
    version: int


def stored(node: Node | None) -> Stored | None:
    """The snapshot header at a node; None when absent or being deleted (DELETING reads as gone
    for every reader: GetSnapshot, ListSnapshots, reports, aborts, the deadline janitor)."""
    item = stored_any(node)
    return None if item is None or item.record.state is State.DELETING else item


def stored_any(node: Node | None) -> Stored | None:
    """The header whatever its state: only the deletion itself and retention look at DELETING."""
    return Stored(decode_snapshot(node.data), node.version) if node is not None else None


def current_generation(node: Node | None) -> int:
    """The app's current generation from its pointer node (0: no snapshot yet)."""
    return decode_app(node.data) if node is not None else 0


@dataclass(frozen=True)
class Outcome:
    """A snapshot, and whether this call changed its state (created, completed or aborted it)."""

    snapshot: Snapshot
    changed: bool


def ended_ops(ended: SnapshotRecord) -> list[Op]:
    """A snapshot leaving CREATED: drop its deadline, and have retention look at the app now.
    (The commit needs the retention bucket of ``ended_at_ms``.)"""
    return [
        Delete(deadline_entry(ended), None),
        Create(retention_entry(ended.ended_at_ms, ref(ended.app_id, ended.generation)), b""),
    ]


# --- CreateSnapshot ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateRequest:
    app_id: str
    task_ids: tuple[str, ...]
    ttl_ms: int
    timeout_ms: int
    labels: tuple[tuple[str, str], ...]


def create(
    request: CreateRequest, reads: Reads, pending: Commit[Outcome] | None, now: int
) -> Done[Outcome] | Commit[Outcome] | More:
    """The current snapshot if it is CREATED (a retry is safe, also after a commit in doubt),
    else generation + 1.

    The app's pointer in ``reads`` may be a process's copy of it rather than a read (the kernel's
    ``assume``). A stale copy is harmless: the pointer node is never deleted (so its versions
    never restart) and changes only here, one generation per version, so a copy at the stored
    version is exactly the stored node, and a commit from a stale one fails on the version and
    the kernel reads. A Done needs no version check: the pointer leaves generation N only by a
    commit that read N's header not CREATED, and a header never becomes CREATED again (its path
    is created once, with the pointer's move to it), so a CREATED header N means the pointer is
    at N now."""
    app_id = request.app_id
    app_node = reads.node(app_path(app_id))
    current = current_generation(app_node)
    if current:
        header_read = ReadNode(gen_path(app_id, current))
        if not reads.has(header_read):
            return More([header_read])
        header = stored(reads.node(header_read.path))
        if header is not None and header.record.state is State.CREATED:
            return Done(Outcome(Snapshot(header.record, ()), False))
    record = SnapshotRecord(
        app_id=app_id,
        generation=current + 1,
        state=State.CREATED,
        task_ids=request.task_ids,
        reported=0,
        created_at_ms=now,
        completed_at_ms=0,
        ended_at_ms=0,
        deadline_ms=now + request.timeout_ms,
        ttl_ms=request.ttl_ms,
        labels=request.labels,
        abort_reason="",
    )
    ops: list[Op] = []
    if app_node is None:
        ops += [Create(app_path(app_id), encode_app(record.generation)), Create(gens_path(app_id), b"")]
    else:
        # The version check makes concurrent creators agree: one moves the pointer, the others
        # fail here and, next round, find its snapshot CREATED and return it.
        ops.append(SetData(app_path(app_id), encode_app(record.generation), app_node.version))
    ops += [
        Create(gen_path(app_id, record.generation), encode_snapshot(record)),
        Create(tasks_path(app_id, record.generation), b""),
        Create(deadline_entry(record), b""),
    ]
    return Commit(
        ops, Outcome(Snapshot(record, ()), True), buckets=((DEADLINES, record.deadline_ms),), ensure=(APPS,)
    )


# --- ReportTaskSnapshot -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportRequest:
    """One task's report; ``refs`` name this call's uploads (made once per call, so that every
    round commits the same objects) and ``payloads`` holds their bytes by key."""

    app_id: str
    generation: int
    task_id: str
    offsets: tuple[Offset, ...]
    digest: str
    refs: tuple[CheckpointRef, ...]
    payloads: Mapping[str, bytes] = field(default_factory=dict)
    #: Uploaded checkpoints: (store, upload_id, intent path), by store name.
    uploads: tuple[tuple[str, str, str], ...] = ()
    #: The stored report's bytes when the caller encoded it already (``refs`` all its refs).
    encoded: bytes | None = None

    def reads(self) -> list[ReadNode]:
        """The header, the report counter, the task's node and the intents of the uploads it
        references, read together. (The app's pointer only names the current generation in a
        refusal: read then.)"""
        return [
            ReadNode(gen_path(self.app_id, self.generation)),
            self.counter_read(),
            self.task_read(),
            *(ReadNode(path) for _, _, path in self.uploads),
        ]

    def counter_read(self) -> ReadNode:
        """The snapshot's ``tasks`` node, which counts its reports (``encode_reported``)."""
        return ReadNode(tasks_path(self.app_id, self.generation))

    def task_read(self) -> ReadNode:
        """The task's node: absent until the task reports, which the commit's ``Create`` checks;
        so the first round may leave it out (``run(defer=...)``) and ``report`` copes."""
        return ReadNode(task_path(self.app_id, self.generation, self.task_id))


def report(
    request: ReportRequest, reads: Reads, pending: Commit[Outcome] | None, now: int
) -> Done[Outcome] | Commit[Outcome] | More:
    """Record one task's report; the report that completes the task set completes the snapshot.

    The same report again is idempotent (also after completion, and after a commit in doubt:
    the stored report then carries this call's checkpoint refs, which it keeps).
    """
    app_id, generation, task_id = request.app_id, request.generation, request.task_id
    header = stored(reads.node(gen_path(app_id, generation)))
    open_header = header is not None and header.record.state is State.CREATED
    task_read = request.task_read()
    if not reads.has(task_read) and not open_header:
        # The task's node was not read (deferred): a repeat after completion is answered from
        # it, and a refusal names the current generation from the pointer.
        return More([task_read, ReadNode(app_path(app_id))])
    # Not read: assumed absent (the first report of the task); the commit's Create checks that,
    # and a lost commit re-reads it.
    task_node = reads.node(task_read.path) if reads.has(task_read) else None
    existing = decode_task_report(task_node.data) if task_node is not None else None
    if header is not None and existing is not None and existing.digest == request.digest:
        # This call's inline payloads that the stored report references (after a commit in doubt
        # that landed: all of them, beside its uploads' refs); another call's report references
        # its own objects, so ours are orphans.
        stored_refs = set(existing.checkpoints)
        keep = frozenset(r.object_key for r in request.refs if r in stored_refs and r.inline is None)
        return Done(Outcome(Snapshot(header.record, (existing,)), False), keep=keep)
    if not open_header:
        # Refused: the pointer names the current generation in the error.
        pointer = ReadNode(app_path(app_id))
        if not reads.has(pointer):
            return More([pointer])
        fence(app_id, generation, header, current_generation(reads.node(pointer.path)))
    assert header is not None
    if existing is not None:
        raise FailedPrecondition(
            f"task {task_id!r} already reported a different snapshot for generation "
            f"{generation} of app {app_id!r}; a report cannot be changed",
            reason=Reason.REPORT_CONFLICT,
            metadata={"app_id": app_id, "generation": generation, "task_id": task_id},
        )
    try:
        if task_id not in header.record.task_ids:
            raise InvalidArgument(
                f"task {task_id!r} is not in the task set of app {app_id!r} generation {generation} "
                f"({len(header.record.task_ids)} tasks)"
            )
        uploaded, retire = claim_uploads(request, reads)
    except SnapcoordError:
        if not reads.has(task_read):
            # Refused only once the task's node is read: a stored report of the task answers
            # first (the same report: idempotent, though its uploads' intents are gone; another
            # one: REPORT_CONFLICT).
            return More([task_read])
        raise
    counter_read = request.counter_read()
    if not reads.has(counter_read):
        return More([counter_read])
    counter = reads.node(counter_read.path)
    # None without that node (it goes only with the header): the header counts, as before it.
    counted = decode_reported(counter.data) if counter is not None else None
    refs = tuple(sorted((*request.refs, *uploaded), key=lambda r: r.store))
    task_report = TaskReport(task_id, request.offsets, refs, request.digest)
    data = request.encoded if request.encoded is not None and refs == request.refs else None
    ops: list[Op] = [
        Create(
            task_path(app_id, generation, task_id),
            data if data is not None else encode_task_report(task_report),
        ),
        # One more report counted in a few bytes, whose version check also orders concurrent
        # reports (each must see the others' count), not in the header with its whole task set.
        *(
            [SetData(counter_read.path, encode_reported(counted + 1), counter.version)]
            if counter is not None and counted is not None
            else []
        ),
        *retire,
    ]
    after = after_report(header.record, counted, now)
    if after is header.record:
        # Not written, but checked: abort, timeout and deletion all change the header.
        ops.append(Check(gen_path(app_id, generation), header.version))
    else:
        ops.append(SetData(gen_path(app_id, generation), encode_snapshot(after), header.version))
    completed = after.state is State.COMPLETED
    if completed:
        ops += ended_ops(after)
    return Commit(
        ops,
        Outcome(Snapshot(after, (task_report,)), completed),
        uploads=request.payloads,
        buckets=((RETENTION, after.ended_at_ms),) if completed else (),
    )


def claim_uploads(request: ReportRequest, reads: Reads) -> tuple[list[CheckpointRef], list[Op]]:
    """The refs of the uploads a report names, and the ops that retire their intents in the
    report's commit (version-checked: an intent the orphan sweep claimed meanwhile fails the
    commit, so no report ever points at an object the sweep deletes)."""
    refs: list[CheckpointRef] = []
    ops: list[Op] = []
    for store, upload_id, path in request.uploads:
        node = reads.node(path)
        intent = intents.decode(node.data) if node is not None else None
        field_name = f"task.uploaded_checkpoints[{quote_prefix(store)}]"
        # upload_id is quoted whole: intents.path_of accepted it, so it is at most 45 characters.
        if node is None or intent is None or intent.swept or intent.upload is None:
            raise NotFound(
                f"{field_name}: upload {upload_id!r} does not exist (never made, already used "
                "by another report, or collected by the janitor): upload the checkpoint again",
                metadata={"field": "task.uploaded_checkpoints", "store": store, "upload_id": upload_id},
            )
        u = intent.upload
        target = (request.app_id, request.generation, request.task_id, store)
        if (u.app_id, u.generation, u.task_id, u.store) != target:
            raise InvalidArgument(
                f"{field_name}: upload {upload_id!r} was made for app {quote_prefix(u.app_id)} "
                f"generation {u.generation} task {quote_prefix(u.task_id)} store {quote_prefix(u.store)}, "
                "not for this report's task and store",
                metadata={"field": "task.uploaded_checkpoints", "store": store, "upload_id": upload_id},
            )
        if not u.complete:
            raise FailedPrecondition(
                f"{field_name}: upload {upload_id!r} has not finished: report after "
                "UploadCheckpoint answered",
                metadata={"field": "task.uploaded_checkpoints", "store": store, "upload_id": upload_id},
            )
        refs.append(CheckpointRef(store, intent.keys[0], u.size, u.sha256))
        ops.append(intents.commit_op(path, node.version))
    return refs, ops


def fence(app_id: str, generation: int, header: Stored | None, current: int) -> None:
    """Refuse a report unless the snapshot is CREATED (only the current generation can be)."""
    if header is not None and header.record.state is State.CREATED:
        return
    where = {"app_id": app_id, "generation": generation, "current_generation": current}
    if header is None or generation != current:
        if generation > current:
            raise FailedPrecondition(
                f"generation {generation} of app {app_id!r} does not exist; "
                f"the current generation is {current}",
                reason=Reason.SNAPSHOT_FENCED,
                metadata=where,
            )
        raise FailedPrecondition(
            f"generation {generation} of app {app_id!r} is fenced: the current generation is {current}",
            reason=Reason.SNAPSHOT_FENCED,
            metadata=where,
        )
    raise FailedPrecondition(
        f"generation {generation} of app {app_id!r} is {header.record.state.value}, no longer accepting "
        f"reports; the current generation is {current}",
        reason=Reason.SNAPSHOT_NOT_CREATED,
        metadata={**where, "state": header.record.state.value},
    )


def after_report(record: SnapshotRecord, counted: int | None, now: int) -> SnapshotRecord:
    """The header after one more report: COMPLETED once every task reported, else unchanged
    (the same object: the counter node counts, ``counted`` so far) or, without a counter node
    (``counted`` None), with its own count raised.

    Reports are counted in the counter node and, for reports committed by releases without the
    counter node, in the header's ``reported``: each report raises exactly one of them, and a
    report through either kind of server changes the header or checks its version, so the sum is
    the count."""
    if counted is None:
        reported = record.reported + 1
        if reported < len(record.task_ids):
            return replace(record, reported=reported)
    elif record.reported + counted + 1 < len(record.task_ids):
        return record
    return replace(
        record, reported=len(record.task_ids), state=State.COMPLETED, completed_at_ms=now, ended_at_ms=now
    )


# --- AbortSnapshot ------------------------------------------------------------------------------


def abort(
    app_id: str, generation: int, reason: str, reads: Reads, pending: Commit[Outcome] | None, now: int
) -> Done[Outcome] | Commit[Outcome]:
    """CREATED -> ABORTED; aborting an ABORTED snapshot again is a no-op."""
    header = stored(reads.node(gen_path(app_id, generation))) if generation > 0 else None
    if header is None:
        raise NotFound(f"app {app_id!r} has no snapshot at generation {generation}")
    if header.record.state is State.ABORTED:
        return Done(Outcome(Snapshot(header.record, ()), False))
    if header.record.state is State.COMPLETED:
        raise FailedPrecondition(
            f"app {app_id!r} generation {generation} is COMPLETED; only a CREATED snapshot can be aborted",
            reason=Reason.SNAPSHOT_NOT_CREATED,
            metadata={"app_id": app_id, "generation": generation, "state": "COMPLETED"},
        )
    after = replace(
        header.record, state=State.ABORTED, ended_at_ms=now, abort_reason=reason or DEFAULT_ABORT_REASON
    )
    ops: list[Op] = [
        SetData(gen_path(app_id, generation), encode_snapshot(after), header.version),
        *ended_ops(after),
    ]
    return Commit(ops, Outcome(Snapshot(after, ()), True), buckets=((RETENTION, after.ended_at_ms),))


# --- DeleteSnapshot (and retention) -------------------------------------------------------------


def deleting_trigger(app_id: str, generation: int, now: int) -> str:
    """The retention trigger a deletion leaves until it is finished: if its caller dies midway, the
    janitor's retention pass finds the DELETING header and finishes it."""
    return retention_entry(now, f"{app_id}@deleting-{generation}")


def delete_reads(app_id: str, generation: int, now: int, newer: int = 0) -> list[ReadNode | ReadChildren]:
    return [
        ReadNode(gen_path(app_id, generation)),
        ReadNode(pins.pin_path(app_id, generation)),
        ReadNode(deleting_trigger(app_id, generation, now)),
        *([ReadNode(gen_path(app_id, newer))] if newer else []),
    ]


def delete_mark(
    app_id: str,
    generation: int,
    reads: Reads,
    pending: Commit[bool] | None,
    now: int,
    policy: SnapshotPolicy,
    newer: int = 0,
) -> Done[bool] | Commit[bool] | More:
    """Step 1 of a deletion: an ended, unpinned snapshot becomes DELETING, in one transaction
    checked against its pins and the records of the holders found dead (so of a pin or a renewal
    and this mark racing, exactly one commits), with a retention trigger that outlives a crash.
    True when the snapshot is (now) DELETING, False when there was none. A DELETING snapshot
    cannot be pinned any more (``pins.pinnable``).

    ``newer`` (retention): the newer completed generation that lets retention delete this one (it
    never deletes the newest completed); refused unless that one is still COMPLETED, and checked
    in the same transaction, so a deletion of it racing this mark (DeleteSnapshot) fails one of
    the two instead of leaving the app without a completed snapshot."""
    header = stored_any(reads.node(gen_path(app_id, generation))) if generation > 0 else None
    if header is None:
        return landed(pending) if pending is not None else Done(False)
    if header.record.state is State.DELETING:
        return Done(True)
    if header.record.state is State.CREATED:
        raise FailedPrecondition(
            f"app {app_id!r} generation {generation} is still CREATED: abort it before deleting it",
            reason=Reason.SNAPSHOT_IN_PROGRESS,
            metadata={"app_id": app_id, "generation": generation},
        )
    pin_node = reads.node(pins.pin_path(app_id, generation))
    confirm = [ReadNode(p) for p in pins.to_confirm(pin_node, now, policy.max_clock_skew_ms)]
    missing = [r for r in confirm if not reads.has(r)]
    if missing:
        return More(missing)  # holders listed as expired: did they renew since they pinned?
    if pins.pinned(app_id, generation, pin_node, reads.nodes, now, policy.max_clock_skew_ms):
        raise FailedPrecondition(
            f"app {app_id!r} generation {generation} is held by a lease; release the lease first",
            reason=Reason.LEASE_HELD,
            metadata={"app_id": app_id, "generation": generation},
        )
    marked = replace(header.record, state=State.DELETING)
    ops: list[Op] = pins.guard(app_id, generation, pin_node, reads.nodes)
    if newer:
        kept = stored_any(reads.node(gen_path(app_id, newer)))
        if kept is None or kept.record.state is not State.COMPLETED:
            raise FailedPrecondition(
                f"app {app_id!r} generation {newer}, the newer completed snapshot that let retention "
                f"delete generation {generation}, is no longer there; retention decides again",
                metadata={"app_id": app_id, "generation": generation},
            )
        ops.append(Check(gen_path(app_id, newer), kept.version))
    ops.append(SetData(gen_path(app_id, generation), encode_snapshot(marked), header.version))
    trigger = deleting_trigger(app_id, generation, now)
    if reads.node(trigger) is None:
        ops.append(Create(trigger, b""))
    return Commit(ops, True, buckets=((RETENTION, now),), ensure=(pins.PINS,) if pin_node is None else ())


def delete_step_reads(app_id: str, generation: int) -> list[ReadNode | ReadChildren]:
    return [ReadNode(gen_path(app_id, generation)), ReadChildren(tasks_path(app_id, generation))]


#: Bytes per Delete op beyond its path: op header, version, multi framing, and a chroot of up to
#: ``zk_request_size.MAX_CHROOT_BYTES`` (64; every path is sent with it, and a longer chroot is
#: refused). Conservative: the store checks the exact size.
DELETE_OP_OVERHEAD = 96


class Step(enum.Enum):
    MORE = "more"  # a batch of task nodes went; call again
    FINISHED = "finished"  # this call removed the header: the snapshot is gone
    GONE = "gone"  # someone else finished it (or it was never marked)


#: What one key adds to an intent's JSON list (its quotes and comma).
INTENT_KEY_OVERHEAD = 3


def delete_step(
    app_id: str, generation: int, reads: Reads, pending: Commit[Step] | None, batch_bytes: int, now: int
) -> Done[Step] | Commit[Step] | More:
    """Steps 2..n of a deletion: remove a batch of at most ``batch_bytes`` of task nodes (and their
    objects, after the commit, announced by an intent the commit makes: ``intents.doom``), or,
    when none are left, the tasks node and the header last. Every step checks the DELETING
    header's version, so it never touches a snapshot someone recreated."""
    header = stored_any(reads.node(gen_path(app_id, generation)))
    if header is None or header.record.state is not State.DELETING:
        return landed(pending) if pending is not None else Done(Step.GONE)
    listed = reads.children(tasks_path(app_id, generation))
    if pending is not None and pending.result is Step.MORE:
        # A batch in doubt landed if none of its tasks is listed any more: delete its objects
        # now (and withdraw its intent) rather than leave them to the sweep.
        batch_paths = {op.path for op in pending.ops if isinstance(op, Delete)}
        if batch_paths.isdisjoint(task_path(app_id, generation, name) for name in listed):
            return landed(pending)
    guard = Check(gen_path(app_id, generation), header.version)
    batch: list[str] = []
    size = 0
    for name in sorted(listed):
        cost = len(task_path(app_id, generation, name).encode()) + DELETE_OP_OVERHEAD
        if batch and size + cost > batch_bytes:
            break
        batch.append(name)
        size += cost
    if not batch:
        ops: list[Op] = [
            Delete(tasks_path(app_id, generation), None),
            Delete(gen_path(app_id, generation), header.version),
        ]
        return Commit(ops, Step.FINISHED)
    task_reads = [ReadNode(task_path(app_id, generation, t)) for t in batch]
    missing = [r for r in task_reads if not reads.has(r)]
    if missing:
        return More(missing)
    # The batch again, now with each task's object keys, which its intent lists: at least one
    # task (a report's refs fit in half a request), more while within ``batch_bytes``.
    deletes: list[Op] = []
    keys: list[str] = []
    size = 0
    for path, node in ((r.path, reads.node(r.path)) for r in task_reads):
        if node is None:
            continue
        mine = list(decode_task_report(node.data).object_keys)
        cost = (
            len(path.encode()) + DELETE_OP_OVERHEAD + sum(len(k.encode()) + INTENT_KEY_OVERHEAD for k in mine)
        )
        if deletes and size + cost > batch_bytes:
            break
        deletes.append(Delete(path, None))  # no version: a task node never changes once written
        keys += mine
        size += cost
    if not keys:
        return Commit([guard, *deletes], Step.MORE)
    # Named after this header and batch: every attempt of the step names the same intent.
    unique = hashlib.sha256(f"{header.record.created_at_ms}/{deletes[0].path}".encode()).hexdigest()[:32]
    doomed, doom = intents.doom(keys, now, unique)
    return Commit(
        [guard, *deletes, doom],
        Step.MORE,
        cleanup=tuple(keys),
        withdraw=(doomed,),
        buckets=((intents.ROOT, now),),
    )


# --- SetRetentionPolicy -------------------------------------------------------------------------


def retention_trigger(app_id: str, now: int) -> str:
    return retention_entry(now, f"{app_id}@policy")


def set_retention(
    app_id: str, policy: RetentionPolicy, reads: Reads, pending: Commit[RetentionPolicy] | None, now: int
) -> Commit[RetentionPolicy]:
    """Store the app's override (creating the app: it may get its policy before its first
    snapshot) and have retention look at the app now. Writing it again is harmless."""
    app_node = reads.node(app_path(app_id))
    node = reads.node(retention_path(app_id))
    ops: list[Op] = []
    if app_node is None:
        ops += [Create(app_path(app_id), encode_app(0)), Create(gens_path(app_id), b"")]
    data = encode_retention(policy)
    ops.append(
        Create(retention_path(app_id), data)
        if node is None
        else SetData(retention_path(app_id), data, node.version)
    )
    if reads.node(retention_trigger(app_id, now)) is None:
        ops.append(Create(retention_trigger(app_id, now), b""))
    return Commit(ops, policy, buckets=((RETENTION, now),), ensure=(APPS,))
