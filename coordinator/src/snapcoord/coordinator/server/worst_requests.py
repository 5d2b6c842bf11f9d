"""The largest ZooKeeper request each RPC can send at the configured limits.

For every RPC, ``worst_case_ops`` builds the largest transaction that RPC sends in its worst legal
case: maximum-length (200-character) identifiers, every count at its configured maximum or as
many as the byte budgets admit, the branch with the most operations (a first write creates
parents, an expired lease is replaced with different snapshots...). An RPC that commits in several
transactions (DeleteSnapshot: mark, batches, header) is represented by its largest one. Data comes
from the real domain encoders and paths from the registries' own layout modules;
``storage.zookeeper.request_size`` turns the ops into the exact request size, to compare with
``jute.maxbuffer``, counting on each create the ACL the store sends (``Limits.acl``: a digest ACL with
``--zk-auth-file``) and on each path the longest chroot a ``zk://`` URI may name
(``Limits.chroot``, ``MAX_CHROOT_BYTES``). A test asserts that every legal request fits;
``check_lease_requests_fit`` refuses lease limits under which one would not (the CLI and
``app.run`` call it before anything starts), and ``config`` refuses a longer chroot.

It builds real transactions from every aggregate's layout and encoders, so it sits with the
process assembly, above them, and ``config`` stays free of them.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from snapcoord.coordinator.backlog.layout import job_path, marker_path, shard_path
from snapcoord.coordinator.claims.layout import claim_path, table_path
from snapcoord.coordinator.config.settings import Config, ConfigError, zk_create_acl
from snapcoord.coordinator.domain.backlog import (
    SHARD_SIZE,
    BacklogPolicy,
    JobRecord,
    ShardProgress,
    boundaries_key,
)
from snapcoord.coordinator.domain.backlog_codec import encode_job_record, encode_shard
from snapcoord.coordinator.domain.claims import MAX_ATTEMPT_LENGTH, MAX_SEQ, CommitClaim, TableRecord
from snapcoord.coordinator.domain.claims_codec import encode_claim, encode_table
from snapcoord.coordinator.domain.ids import MAX_ID_LENGTH
from snapcoord.coordinator.domain.leases import Lease, LeasePolicy, SnapshotRef, encode_lease, encode_pins
from snapcoord.coordinator.domain.offsets import MAX_PARTITION, Offset
from snapcoord.coordinator.domain.producer_codec import encode_producer_record, inline_offsets_bytes
from snapcoord.coordinator.domain.producers import ProducerPolicy, ProducerRecord
from snapcoord.coordinator.domain.snapshot_codec import (
    encode_app,
    encode_reported,
    encode_retention,
    encode_snapshot,
)
from snapcoord.coordinator.domain.snapshot_codec import encode_task_report as encode_report
from snapcoord.coordinator.domain.snapshots import (
    MAX_LABEL_BYTES,
    MAX_LABELS,
    WIDEST_REASON,
    CheckpointRef,
    RetentionPolicy,
    SnapshotPolicy,
    SnapshotRecord,
    State,
    TaskReport,
)
from snapcoord.coordinator.kernel import intent_pool, intents
from snapcoord.coordinator.producers import layout as producers_layout
from snapcoord.coordinator.snapshots import decide as snapshots_decide
from snapcoord.coordinator.snapshots import pins
from snapcoord.coordinator.snapshots.layout import (
    app_path,
    checkpoint_key,
    deadline_entry,
    gen_path,
    gens_path,
    ref,
    retention_entry,
    retention_path,
    task_path,
    tasks_path,
)
from snapcoord.coordinator.snapshots.leases import layout as leases_layout
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Op, SetData
from snapcoord.coordinator.storage.zookeeper.request_size import (
    MAX_CHROOT_BYTES,
    OPEN_ACL_UNSAFE,
    ZK_DEFAULT_MAX_REQUEST_BYTES,
    AclEntry,
    request_bytes,
)

#: A far-future time (year 2039): every timestamp and minute bucket at its longest realistic width.
_NOW_MS = 2**41
_BIG_INT = 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """The configured limits (the policies), the chroot every path is sent with, and the ACL
    every create carries."""

    producers: ProducerPolicy = field(default_factory=ProducerPolicy)
    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    leases: LeasePolicy = field(default_factory=LeasePolicy)
    backlog: BacklogPolicy = field(default_factory=BacklogPolicy)
    #: The ZooKeeper chroot: every path is sent with it. The longest one a ``zk://`` URI may name
    #: (``MAX_CHROOT_BYTES``, refused beyond by config and the store), so the budgets hold for all.
    chroot: str = "/" + "c" * (MAX_CHROOT_BYTES - 1)
    #: The ACL the store sends with every create: kazoo's open one, or the digest ACL of the
    #: ``--zk-auth-file`` user (``storage.zookeeper.auth.digest_acl``), longer by 24 bytes plus
    #: the user name's.
    acl: tuple[AclEntry, ...] = OPEN_ACL_UNSAFE

    @property
    def pin_holders(self) -> int:
        return self.leases.max_holders

    @property
    def checkpoints_per_report(self) -> int:
        return self.snapshots.max_checkpoints_per_report


def _id(tag: str, i: int = 0) -> str:
    """A distinct identifier of the maximum length."""
    head = f"{tag}{i}-"
    return head + "x" * (MAX_ID_LENGTH - len(head))


def _uuid() -> str:
    return uuid.UUID(int=2**128 - 1).hex


def _most(upper: int, fits: Callable[[int], bool]) -> int:
    """The largest n in 0..upper with fits(n) (fits is monotone: more items, more bytes)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


_GEN = 10**19  # the widest generation a 20-digit path holds


# -- producers ---------------------------------------------------------------------------------


def _producer_record(limits: Limits, tag: str = "p") -> ProducerRecord:
    pid = _id(tag)
    expires = _NOW_MS + limits.producers.max_ttl_ms
    return ProducerRecord(pid, f"producers/{pid}/{_uuid()}.json", _NOW_MS, expires)


def _retire() -> Op:
    """The commit kernel retires the intent of a call's payloads in the commit that owns them."""
    return intents.commit_op(f"{intents.ROOT}/{10**12 - 1}/{_uuid()}", _BIG_INT)


def _doom(record: ProducerRecord) -> Op:
    """A commit that unreferences a payload makes an intent for it (``intents.doom``)."""
    return intents.doom([record.object_key], _BIG_INT, record.registration_id)[1]


def _inline_record(limits: Limits, pid: str) -> ProducerRecord:
    """A record holding as many offsets inline as ``inline_max_bytes`` admits (streams of 100
    characters; none when inline records are off)."""
    offsets: list[Offset] = []
    while True:
        more = (*offsets, Offset("s" * 100, MAX_PARTITION, _BIG_INT))
        if inline_offsets_bytes(more) > limits.producers.inline_max_bytes:
            break
        offsets.append(more[-1])
    expires = _NOW_MS + limits.producers.max_ttl_ms
    return ProducerRecord(pid, "", _NOW_MS, expires, inline=tuple(offsets), inline_registration=_uuid())


def register_producer_offsets(limits: Limits) -> list[Op]:
    """Replacing an expired record that has a payload object: SetData with the larger of the new
    record's two forms, the index entry moves, and the old payload's intent is made
    (producers.decide)."""
    old = _producer_record(limits)
    new = max(
        (_producer_record(limits), _inline_record(limits, old.producer_id)),
        key=lambda r: len(encode_producer_record(r)),
    )
    return [
        SetData(producers_layout.record_path(old.producer_id), encode_producer_record(new), _BIG_INT),
        Delete(producers_layout.index_path(old), None),
        Create(producers_layout.index_path(new), b""),
        _retire(),
        _doom(old),
    ]


def advance_producer_offsets(limits: Limits) -> list[Op]:
    """A delete of the previous record and the largest registration, in one transaction."""
    return [*delete_producer_offsets(limits, "q"), *register_producer_offsets(limits)]


def intent_pool_refill(limits: Limits) -> list[Op]:
    """A registration that finds the intent pool empty first refills it (intent_pool): the largest
    batch of intents, and the deletes of as many that aged unused."""
    bucket = f"{intents.ROOT}/{10**12 - 1}"
    created = [
        Create(
            f"{bucket}/{_uuid()}",
            intents.encode(intents.Intent((f"{producers_layout.OBJECT_PREFIX}{_uuid()}.json",), _BIG_INT)),
        )
        for _ in range(intent_pool.MAX_BATCH)
    ]
    aged = [intents.commit_op(f"{bucket}/{_uuid()}", _BIG_INT) for _ in range(intent_pool.MAX_BATCH)]
    return [*created, *aged]


def _register_largest(limits: Limits) -> list[Op]:
    """RegisterProducerOffsets sends a refill of the intent pool, then its commit: the larger."""
    return _larger(register_producer_offsets(limits), intent_pool_refill(limits), limits)


def _advance_largest(limits: Limits) -> list[Op]:
    """AdvanceProducerOffsets, like the register, may refill the intent pool first."""
    return _larger(advance_producer_offsets(limits), intent_pool_refill(limits), limits)


def _larger(a: list[Op], b: list[Op], limits: Limits) -> list[Op]:
    return max(a, b, key=lambda ops: transaction_bytes(ops, limits))


def delete_producer_offsets(limits: Limits, tag: str = "p") -> list[Op]:
    record = _producer_record(limits, tag)
    return [
        Delete(producers_layout.record_path(record.producer_id), _BIG_INT),
        Delete(producers_layout.index_path(record), None),
        _doom(record),
    ]


# -- snapshots ---------------------------------------------------------------------------------


def _record(limits: Limits, tasks: int, state: State, reason: str) -> SnapshotRecord:
    p = limits.snapshots
    labels = tuple((f"{i:04d}" + "k" * 96, "v" * (MAX_LABEL_BYTES - 100)) for i in range(MAX_LABELS))
    return SnapshotRecord(
        app_id=_id("a"),
        generation=_GEN,
        state=state,
        task_ids=tuple(_id("t", i) for i in range(tasks)),
        reported=tasks,
        created_at_ms=_NOW_MS,
        completed_at_ms=_NOW_MS,
        ended_at_ms=_NOW_MS,
        deadline_ms=_NOW_MS + p.max_timeout_ms,
        ttl_ms=p.max_ttl_ms,
        labels=labels,
        abort_reason=reason,
    )


@functools.lru_cache(maxsize=64)
def _legal_tasks(limits: Limits) -> int:
    """The most maximum-length task ids a CreateSnapshot may name: ``max_tasks``, or fewer when
    the header budget admits fewer (``SnapshotRegistry._check_header_size``)."""
    budget = limits.snapshots.header_budget_bytes
    widest = replace(_record(limits, 0, State.ABORTED, WIDEST_REASON), generation=_BIG_INT)
    return _most(
        limits.snapshots.max_tasks,
        lambda n: (
            len(encode_snapshot(replace(widest, task_ids=tuple(_id("t", i) for i in range(n))))) <= budget
        ),
    )


def _header(limits: Limits, state: State, reason: str = "") -> SnapshotRecord:
    return _record(limits, _legal_tasks(limits), state, reason)


def _ended_ops(record: SnapshotRecord) -> list[Op]:
    """snapshots.decide.ended_ops: drop the deadline entry, add a retention entry."""
    return [
        Delete(deadline_entry(record), None),
        Create(retention_entry(record.ended_at_ms, ref(record.app_id, record.generation)), b""),
    ]


def create_snapshot(limits: Limits) -> list[Op]:
    """The app's first snapshot: the app and gens nodes too (snapshots.decide.create)."""
    record = _header(limits, State.CREATED)
    app, gen = record.app_id, record.generation
    return [
        Create(app_path(app), encode_app(gen)),
        Create(gens_path(app), b""),
        Create(gen_path(app, gen), encode_snapshot(record)),
        Create(tasks_path(app, gen), b""),
        Create(deadline_entry(record), b""),
    ]


def _report(limits: Limits, app_id: str, *, uploaded: bool = True) -> TaskReport:
    """The largest legal report: every checkpoint entry, then as many maximum-length offsets as
    the report budget admits (``SnapshotRegistry.report``); ``uploaded``: every entry an upload,
    whose intent the report retires (which the budget counts)."""
    p = limits.snapshots
    checkpoints = tuple(
        CheckpointRef(
            _id("c", i), f"snapshots/{app_id}/{_GEN}/{_id('t')}/{_uuid()}", p.max_report_bytes, "f" * 64
        )
        for i in range(limits.checkpoints_per_report)
    )

    def report(n: int) -> TaskReport:
        offsets = tuple(Offset(_id("s", i), MAX_PARTITION, _BIG_INT) for i in range(n))
        return TaskReport(_id("t"), offsets, checkpoints, "f" * 64)

    retire = len(checkpoints) * intents.RETIRE_OP_BYTES if uploaded else 0
    n = _most(
        p.max_offsets_per_task, lambda n: len(encode_report(report(n))) + retire <= p.report_budget_bytes
    )
    return report(n)


def report_task_snapshot(limits: Limits) -> list[Op]:
    """The report that completes the snapshot: report node, counter, header, ended ops
    (decide.report)."""
    record = _header(limits, State.COMPLETED)
    report = _report(limits, record.app_id)
    return [
        Create(task_path(record.app_id, record.generation, report.task_id), encode_report(report)),
        SetData(tasks_path(record.app_id, record.generation), encode_reported(record.reported), _BIG_INT),
        SetData(gen_path(record.app_id, record.generation), encode_snapshot(record), _BIG_INT),
        *_ended_ops(record),
        # Every checkpoint an upload: its intent retired in the same transaction (and the inline
        # payloads' intent, if there were any: one more).
        *(_retire() for _ in range(len(report.checkpoints) + 1)),
    ]


def upload_checkpoint(limits: Limits) -> list[Op]:
    """The upload's intent (made before the data; later rewritten complete, no larger than this)."""
    app, task, store = _id("a"), _id("t"), _id("c")
    info = intents.UploadInfo(app, _GEN, task, store, _BIG_INT, "f" * 64)
    key = f"snapshots/{app}/{_GEN}/{task}/{_uuid()}"
    path = f"{intents.ROOT}/{10**12 - 1}/{_uuid()}"
    return [Create(path, intents.encode(intents.Intent((key,), _BIG_INT, info)))]


def abort_snapshot(limits: Limits) -> list[Op]:
    record = _header(limits, State.ABORTED, WIDEST_REASON)
    return [
        SetData(gen_path(record.app_id, record.generation), encode_snapshot(record), _BIG_INT),
        *_ended_ops(record),
    ]


def delete_snapshot(limits: Limits) -> list[Op]:
    """The largest of a deletion's transactions (decide.delete_mark, decide.delete_step): the
    mark (pin guard: the index checked and the record of each of the most holders it may list, all
    found dead and holding the most snapshots, rewritten; the header rewritten DELETING, a trigger;
    for retention, the newer completed header checked)
    or a batch of task deletes with the intent of
    their objects (the batch's budget counts both: many tasks of one key each, or one task of
    many keys)."""
    record = _header(limits, State.DELETING, WIDEST_REASON)
    app, gen = record.app_id, record.generation
    mark: list[Op] = [
        Check(pins.pin_path(app, gen), _BIG_INT),
        *[
            SetData(leases_layout.record_path(h), encode_lease(_lease(limits, _refs(limits, h))), _BIG_INT)
            for h in _holders(limits, _id("l"))
        ],
        SetData(gen_path(app, gen), encode_snapshot(record), _BIG_INT),
        Create(snapshots_decide.deleting_trigger(app, gen, _NOW_MS), b""),
        Check(gen_path(app, gen + 1), _BIG_INT),  # retention: the newer completed one stays
    ]
    budget = limits.snapshots.max_request_bytes // 2

    def batch(keys_per_task: int) -> list[Op]:
        deletes: list[Op] = []
        keys: list[str] = []
        size = 0
        for task in record.task_ids:
            mine = [checkpoint_key(app, gen, task, _uuid()) for _ in range(keys_per_task)]
            cost = len(task_path(app, gen, task).encode()) + snapshots_decide.DELETE_OP_OVERHEAD
            cost += sum(len(k.encode()) + snapshots_decide.INTENT_KEY_OVERHEAD for k in mine)
            if deletes and size + cost > budget:
                break
            deletes.append(Delete(task_path(app, gen, task), None))
            keys += mine
            size += cost
        doom = intents.doom(keys, _BIG_INT, _uuid())[1]
        return [Check(gen_path(app, gen), _BIG_INT), *deletes, doom]

    # One task's keys are in its stored report, each in a ref with a 64-digit SHA-256 at least.
    most_keys = limits.snapshots.report_budget_bytes // (
        len(checkpoint_key(app, gen, _id("t"), _uuid())) + 64
    )
    candidates = [mark, batch(1), batch(most_keys)]
    return max(candidates, key=lambda ops: transaction_bytes(ops, limits))


def set_retention_policy(limits: Limits) -> list[Op]:
    """The larger of its two transactions: the policy node and its retention trigger."""
    app = _id("a")
    policy = RetentionPolicy(_BIG_INT, limits.snapshots.max_ttl_ms)
    return [
        Create(retention_path(app), encode_retention(policy)),
        Create(snapshots_decide.retention_trigger(app, _NOW_MS), b""),
    ]


# -- leases ------------------------------------------------------------------------------------


def _refs(limits: Limits, tag: str) -> tuple[SnapshotRef, ...]:
    return tuple(SnapshotRef(_id(tag, i), _GEN) for i in range(limits.leases.max_snapshots))


def _holders(limits: Limits, lease_id: str) -> dict[str, int]:
    others = {_id("other", i): _NOW_MS for i in range(limits.pin_holders - 1)}
    return {**others, lease_id: _NOW_MS}


def _lease(limits: Limits, refs: Sequence[SnapshotRef]) -> Lease:
    return Lease(_id("l"), limits.leases.max_duration_ms, _NOW_MS, tuple(sorted(refs)), "i" * 12)


def _record_move(limits: Limits, lease: Lease) -> list[Op]:
    """leases.decide.record_ops for an existing lease whose expiry bucket moves."""
    index = leases_layout.index_path(lease, limits.leases.max_clock_skew_ms)
    return [
        Check(leases_layout.incarnation_path(lease), _BIG_INT),
        SetData(leases_layout.record_path(lease.lease_id), encode_lease(lease), _BIG_INT),
        Delete(index, None),
        Create(index, b""),
    ]


def _triggers(refs: Sequence[SnapshotRef]) -> list[Op]:
    """pins.unpinned_triggers: one entry per distinct app."""
    return pins.unpinned_triggers([r.app_id for r in refs], _NOW_MS, "u" * 12)


def _unpins(limits: Limits, refs: Sequence[SnapshotRef]) -> list[Op]:
    leftover = encode_pins(_holders(limits, "gone")) if limits.pin_holders > 1 else b""
    return [
        SetData(pins.pin_path(r.app_id, r.generation), leftover, _BIG_INT)
        if leftover
        else Delete(pins.pin_path(r.app_id, r.generation), _BIG_INT)
        for r in refs
    ]


def acquire_snapshots(limits: Limits) -> list[Op]:
    """An expired lease re-acquired on as many other snapshots, each already held by the most
    other leases: check and pin every new one, unpin every old one, rewrite the record, trigger
    retention for the old apps (leases.decide.acquire)."""
    new, old = _refs(limits, "n"), _refs(limits, "o")
    lease = _lease(limits, new)
    held = encode_pins(_holders(limits, lease.lease_id))
    ops: list[Op] = [Check(pins.snapshot_path(r.app_id, r.generation), _BIG_INT) for r in new]
    ops += [SetData(pins.pin_path(r.app_id, r.generation), held, _BIG_INT) for r in new]
    ops += _unpins(limits, old)
    return ops + _record_move(limits, lease) + _triggers(old)


def release_snapshots(limits: Limits) -> list[Op]:
    refs = _refs(limits, "o")
    return _unpins(limits, refs) + _record_move(limits, _lease(limits, ())) + _triggers(refs)


def renew_lease(limits: Limits) -> list[Op]:
    """The record only: the pin indexes keep the expiry each snapshot was pinned with
    (leases.decide.renew)."""
    return _record_move(limits, _lease(limits, _refs(limits, "n")))


def drop_lease(limits: Limits) -> list[Op]:
    refs = _refs(limits, "o")
    lease = _lease(limits, refs)
    ops = _unpins(limits, refs)
    ops += [
        Delete(leases_layout.incarnation_path(lease), _BIG_INT),
        Delete(leases_layout.record_path(lease.lease_id), _BIG_INT),
        Delete(leases_layout.index_path(lease, limits.leases.max_clock_skew_ms), None),
    ]
    return ops + _triggers(refs)


# -- backlog -----------------------------------------------------------------------------------


def _job(limits: Limits) -> JobRecord:
    return JobRecord(_id("j"), _uuid(), limits.backlog.max_partitions, SHARD_SIZE, _NOW_MS, "f" * 64)


def _old_children(job: JobRecord, mark_id: str) -> list[Op]:
    ops: list[Op] = []
    for shard in range(job.shard_count):
        ops.append(Delete(shard_path(job.job_id, mark_id, shard), None))
        ops.append(Delete(marker_path(job.job_id, mark_id, shard, SHARD_SIZE), None))
    return ops


def _doom_boundaries(job: JobRecord, mark_id: str) -> Op:
    """A commit that unreferences a mark's boundaries makes an intent for them (``intents.doom``)."""
    return intents.doom([boundaries_key(job.job_id, mark_id)], _BIG_INT, mark_id)[1]


def mark_backlog(limits: Limits) -> list[Op]:
    """A grow (``backlog.decide.grow``), the largest mark: the record rewritten, the old mark's
    nodes deleted (and its boundaries' intent made), the new ones created with the progress
    carried over, here every partition's (the largest a shard gets: each finished, with its tag);
    a reset creates the same nodes empty."""
    job = _job(limits)
    old = "0" * 32
    ops: list[Op] = [SetData(job_path(job.job_id), encode_job_record(job), _BIG_INT)]
    ops += _old_children(job, old)
    for shard in range(job.shard_count):
        ops.append(Create(shard_path(job.job_id, job.mark_id, shard), encode_shard(_full_shard(job, shard))))
        ops.append(Create(marker_path(job.job_id, job.mark_id, shard, SHARD_SIZE), b""))
    return [*ops, _retire(), _doom_boundaries(job, old)]


def _full_shard(job: JobRecord, shard: int) -> ShardProgress:
    """A shard at its largest: every partition at the longest position, finished with a tag."""
    span = job.shard_span(shard)
    return ShardProgress(tuple([_BIG_INT] * len(span)), {i: "f" * 16 for i in range(len(span))})


def report_progress(limits: Limits) -> list[Op]:
    """Every shard rewritten with every partition finished by this report, and its marker
    removed. The registry splits a report into transactions of about CHUNK_BYTES of shard data
    (backlog.registry); this is the unsplit size, an upper bound of each part."""
    job = _job(limits)
    ops: list[Op] = []
    for shard in range(job.shard_count):
        span = job.shard_span(shard)
        full = _full_shard(job, shard)
        ops.append(SetData(shard_path(job.job_id, job.mark_id, shard), encode_shard(full), _BIG_INT))
        ops.append(Delete(marker_path(job.job_id, job.mark_id, shard, len(span)), None))
    return ops


def clear_backlog(limits: Limits) -> list[Op]:
    job = _job(limits)
    return [
        *_old_children(job, job.mark_id),
        Delete(job_path(job.job_id), _BIG_INT),
        _doom_boundaries(job, job.mark_id),
    ]


def claim_commit(limits: Limits) -> list[Op]:
    """The table record set (a new highest number) and the claim created, every number at its
    widest; FenceTable sends the same two operations with a shorter attempt ("fence")."""
    table_id = _id("table")
    record = TableRecord(table_id, _BIG_INT, MAX_SEQ, _NOW_MS, MAX_SEQ, MAX_SEQ)
    claim = CommitClaim(MAX_SEQ, _BIG_INT, "a" * MAX_ATTEMPT_LENGTH, _NOW_MS)
    return [
        SetData(table_path(table_id), encode_table(record), _BIG_INT),
        Create(claim_path(table_id, MAX_SEQ), encode_claim(claim)),
    ]


def _reads_only(limits: Limits) -> list[Op]:
    return []


#: Every RPC of snapcoord.v1 -> its worst-case transaction (read-only RPCs send none).
WORST_CASE: dict[str, Callable[[Limits], list[Op]]] = {
    "ProducerOffsetService/RegisterProducerOffsets": _register_largest,
    "ProducerOffsetService/GetProducerOffsets": _reads_only,
    "ProducerOffsetService/DeleteProducerOffsets": delete_producer_offsets,
    "ProducerOffsetService/AdvanceProducerOffsets": _advance_largest,
    "ProducerOffsetService/ListProducerOffsets": _reads_only,
    "SnapshotService/CreateSnapshot": create_snapshot,
    "SnapshotService/GetCurrentSnapshot": _reads_only,
    "SnapshotService/GetSnapshot": _reads_only,
    "SnapshotService/ListSnapshots": _reads_only,
    "SnapshotService/ReadCheckpoint": _reads_only,
    "SnapshotService/ReportTaskSnapshot": report_task_snapshot,
    "SnapshotService/UploadCheckpoint": upload_checkpoint,
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
    "CommitClaimService/FenceTable": claim_commit,
    "CommitClaimService/ClaimCommit": claim_commit,
    "CommitClaimService/GetCommitClaims": _reads_only,
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


def transaction_bytes(ops: Sequence[Op], limits: Limits) -> int:
    """The exact size of the request that sends ``ops`` under ``limits.chroot`` and ``limits.acl``."""
    return request_bytes(list(ops), chroot=limits.chroot, acl=limits.acl) if ops else 0


def worst_case_table(
    limits: Limits | None = None, max_request_bytes: int = ZK_DEFAULT_MAX_REQUEST_BYTES
) -> list[Row]:
    """One row per RPC: its worst-case transaction's op count and exact request size."""
    limits = limits or Limits()
    rows = []
    for rpc, build in WORST_CASE.items():
        ops = build(limits)
        rows.append(Row(rpc, len(ops), transaction_bytes(ops, limits), max_request_bytes))
    return rows


def check_lease_requests_fit(cfg: Config) -> None:
    """Refuse lease limits under which a legal lease call would not fit one ZooKeeper request,
    counting the ACL each of its creates carries, with ``ConfigError`` naming the two limits.
    The other RPCs need no check at start: snapshot sizes are bounded by byte budgets derived from
    the request limit, producer and backlog transactions are small or split
    (``tests/coordinator/server/test_worst_requests.py`` checks every RPC)."""
    acl = zk_create_acl(cfg.storage)
    row = _worst_lease_request(cfg.leases, acl)
    if not row.fits:
        with_acl = " (each create with the digest ACL of --zk-auth-file)" if acl != OPEN_ACL_UNSAFE else ""
        raise ConfigError(
            f"with --lease-max-snapshots={cfg.leases.max_snapshots} and --lease-max-holders="
            f"{cfg.leases.max_holders}, {row.rpc} may send a {row.request_bytes}-byte ZooKeeper request"
            f"{with_acl}; --zk-max-request-bytes is {row.limit}: lower one of the two lease limits"
        )


@functools.lru_cache(maxsize=32)
def _worst_lease_request(leases: LeasePolicy, acl: tuple[AclEntry, ...]) -> Row:
    limits = Limits(leases=leases, acl=acl)
    rows = [
        Row(rpc, len(ops), transaction_bytes(ops, limits), leases.max_request_bytes)
        for rpc, build in WORST_CASE.items()
        if rpc.startswith("LeaseService/") and (ops := build(limits))
    ]
    return max(rows, key=lambda r: r.request_bytes)
