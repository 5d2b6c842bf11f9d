"""The rules of every backlog change, as pure functions of what was read (no I/O).

Each takes the request, the kernel's ``Reads`` and the commit still in doubt (``pending``), and
returns ``Done``, ``Commit`` or ``More`` (see ``kernel.decision``); refusals raise. ``MarkGone`` says the
mark a call was working on was reset, grown or cleared meanwhile: the caller starts again from the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from snapcoord.coordinator.backlog.layout import JOBS, job_path, marker_path, shard_path, unmarked_path
from snapcoord.coordinator.domain.backlog import (
    Boundaries,
    JobRecord,
    ShardProgress,
    add_unmarked,
    apply_positions,
    boundaries_digest,
    boundaries_key,
    carry_progress,
    empty_shard,
    remaining,
    unmarked_tag,
)
from snapcoord.coordinator.domain.backlog_codec import (
    decode_job_record,
    decode_shard,
    decode_unmarked,
    encode_job_record,
    encode_shard,
    encode_unmarked,
)
from snapcoord.coordinator.domain.documents import corrupt
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.errors import FailedPrecondition, NotFound, Reason
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.corruption import at
from snapcoord.coordinator.kernel.decision import Commit, Done, More, ReadChildren, ReadNode, Reads, landed
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, Op, SetData


class MarkGone(Exception):
    """The mark a call was working on was reset, grown or cleared meanwhile: start again from the record."""


@dataclass(frozen=True)
class StoredJob:
    record: JobRecord
    version: int


@dataclass(frozen=True)
class StoredShard:
    progress: ShardProgress
    version: int


def stored_job(job_id: str, node: Node | None) -> StoredJob | None:
    if node is None:
        return None
    with at(job_path(job_id)):
        record = decode_job_record(node.data)
        if record.job_id != job_id:
            raise corrupt("backlog job record", f"names job_id {record.job_id!r}", node.data)
    return StoredJob(record, node.version)


def stored_shard(record: JobRecord, shard: int, node: Node | None) -> StoredShard:
    if node is None:
        raise MarkGone  # nodes of a mark go only with its record
    with at(shard_path(record.job_id, record.mark_id, shard)):
        return StoredShard(decode_shard(node.data, len(record.shard_span(shard))), node.version)


def stored_unmarked(record: JobRecord, node: Node | None) -> frozenset[str]:
    """The mark's unmarked set (empty when no report named an unmarked partition)."""
    if node is None:
        return frozenset()
    with at(unmarked_path(record.job_id, record.mark_id)):
        return decode_unmarked(node.data)


def not_marked(job_id: str) -> str:
    return f"no backlog is marked for job_id {job_id!r}; call MarkBacklog first"


def marked(job_id: str, reads: Reads, pending: Commit[JobRecord] | None) -> Done[JobRecord]:
    """The job's current mark; NOT_FOUND when there is none (ReportProgress, GetBacklogStatus)."""
    current = stored_job(job_id, reads.node(job_path(job_id)))
    if current is None:
        raise NotFound(not_marked(job_id))
    return Done(current.record)


# --- MarkBacklog --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarkRequest:
    """A mark: ``boundaries`` carries this call's mark id (made once per call, so that every round
    commits the same upload) and ``payload`` their encoding."""

    boundaries: Boundaries
    payload: bytes
    reset: bool
    shard_size: int


@dataclass(frozen=True)
class Marked:
    """What a mark did: "marked" (a first mark), "reset" (replacing ``replaced``), "grown"
    (``added`` to mark ``replaced``, whose progress the new ``shards`` carry) or "existing" (the
    stored ``record`` is returned)."""

    outcome: Literal["marked", "reset", "grown", "existing"]
    record: JobRecord
    replaced: str | None = None
    added: tuple[Offset, ...] = ()
    shards: tuple[ShardProgress, ...] = ()
    #: "grown": the partitions reports named unmarked that the grown mark still lacks.
    unmarked: int = 0


def mark(
    request: MarkRequest, reads: Reads, pending: Commit[Marked] | None, now: int
) -> Done[Marked] | Commit[Marked] | More:
    """Mark the boundaries unless a mark exists (then return it), or replace it with ``reset``."""
    ours = request.boundaries
    job_id, path = ours.job_id, job_path(ours.job_id)
    current = stored_job(job_id, reads.node(path))
    if pending is not None and current is not None and current.record.mark_id == ours.mark_id:
        return landed(pending)
    if current is not None and not request.reset:
        return Done(Marked("existing", current.record))
    record = JobRecord(
        job_id, ours.mark_id, len(ours.items), request.shard_size, now, boundaries_digest(request.payload)
    )
    ops: list[Op]
    if current is None:
        ops = [Create(path, encode_job_record(record))]
    else:
        if not reads.has(ReadChildren(path)):
            return More([ReadChildren(path)])
        # One transaction: the version check fences a concurrent reset or clear, and deleting
        # every node listed now fails (NoNode) if a report renamed a marker meanwhile.
        ops = [SetData(path, encode_job_record(record), current.version)]
        ops += [Delete(f"{path}/{name}", None) for name in reads.children(path)]
    for shard in range(record.shard_count):
        span = record.shard_span(shard)
        ops.append(Create(shard_path(job_id, record.mark_id, shard), encode_shard(empty_shard(0))))
        unfinished = remaining(empty_shard(len(span)), ours.values(span))
        if unfinished:
            ops.append(Create(marker_path(job_id, record.mark_id, shard, unfinished), b""))
    if current is None:
        return Commit(
            ops,
            Marked("marked", record),
            uploads={boundaries_key(job_id, ours.mark_id): request.payload},
            ensure=(JOBS,),
        )
    # A reset makes the old mark's boundaries garbage.
    replaced = current.record.mark_id
    doomed, doom = intents.doom([boundaries_key(job_id, replaced)], now, replaced)
    return Commit(
        [*ops, doom],
        Marked("reset", record, replaced),
        uploads={boundaries_key(job_id, ours.mark_id): request.payload},
        cleanup=(boundaries_key(job_id, replaced),),
        withdraw=(doomed,),
        buckets=((intents.ROOT, now),),
        ensure=(JOBS,),
    )


@dataclass(frozen=True)
class GrowRequest:
    """Grow ``record``'s mark (``old``) to ``grown`` (a new mark id, made once per call so that
    every round commits the same upload; ``payload`` its encoding), carrying its progress over."""

    record: JobRecord
    old: Boundaries
    grown: Boundaries
    added: tuple[Offset, ...]
    payload: bytes
    #: Most bytes of carried progress the one transaction may hold (``registry.CHUNK_BYTES``).
    max_bytes: int

    def shard_reads(self) -> list[ReadNode]:
        r = self.record
        return [ReadNode(shard_path(r.job_id, r.mark_id, k)) for k in range(r.shard_count)]

    def unmarked_read(self) -> ReadNode:
        return ReadNode(unmarked_path(self.record.job_id, self.record.mark_id))


def grow(
    request: GrowRequest, reads: Reads, pending: Commit[Marked] | None, now: int
) -> Done[Marked] | Commit[Marked] | More:
    """Replace the mark by the grown one in one transaction: the record by version, the old
    mark's shards deleted by version (a report that wrote one meanwhile fails the commit, which
    then reads and carries its position over: no progress is lost), its other nodes deleted, the
    new mark's shards created with the carried progress and their markers. ``MarkGone`` when the
    record no longer names the mark grown (reset, cleared, or grown by another call)."""
    old_record, grown = request.record, request.grown
    job_id, path = old_record.job_id, job_path(old_record.job_id)
    current = stored_job(job_id, reads.node(path))
    if pending is not None and current is not None and current.record.mark_id == grown.mark_id:
        return landed(pending)
    if current is None or current.record.mark_id != old_record.mark_id:
        raise MarkGone
    wanted: list[ReadChildren | ReadNode] = [ReadChildren(path), request.unmarked_read()]
    wanted += request.shard_reads()
    if not all(map(reads.has, wanted)):
        return More(wanted)
    old_shards = {
        k: stored_shard(old_record, k, reads.node(read.path)) for k, read in enumerate(request.shard_reads())
    }
    shards = carry_progress(
        request.old,
        {k: s.progress for k, s in old_shards.items()},
        old_record.shard_size,
        grown,
        old_record.shard_size,
    )
    record = JobRecord(
        job_id,
        grown.mark_id,
        len(grown.items),
        old_record.shard_size,
        old_record.marked_at_ms,
        boundaries_digest(request.payload),
    )
    versions = {read.path: old_shards[k].version for k, read in enumerate(request.shard_reads())}
    # The partitions reports named unmarked stay counted, less the ones this grow adds.
    unmarked_node = reads.node(request.unmarked_read().path)
    if unmarked_node is not None:
        versions[request.unmarked_read().path] = unmarked_node.version
    added = {unmarked_tag(o.stream, o.partition) for o in request.added}
    unmarked = stored_unmarked(old_record, unmarked_node) - added
    encoded = [encode_shard(progress) for progress in shards]
    size = sum(map(len, encoded))
    if size > request.max_bytes:
        # Only past the default --backlog-max-partitions: 10,000 partitions carry at most ~460 KB.
        raise FailedPrecondition(
            f"the progress of job_id {job_id!r} ({len(grown.items)} partitions once grown) takes "
            f"{size} bytes, more than one ZooKeeper transaction carries ({request.max_bytes}); a "
            "mark this large cannot grow: mark again with reset=true naming every partition",
            reason=Reason.TOO_LARGE,
            metadata={"field": "boundaries", "limit": request.max_bytes, "size": size},
        )
    ops: list[Op] = [SetData(path, encode_job_record(record), current.version)]
    for name in reads.children(path):
        child = f"{path}/{name}"
        ops.append(Delete(child, versions.get(child)))
    for shard, (progress, data) in enumerate(zip(shards, encoded, strict=True)):
        ops.append(Create(shard_path(job_id, record.mark_id, shard), data))
        unfinished = remaining(progress, grown.values(record.shard_span(shard)))
        if unfinished:
            ops.append(Create(marker_path(job_id, record.mark_id, shard, unfinished), b""))
    if unmarked:
        ops.append(Create(unmarked_path(job_id, record.mark_id), encode_unmarked(unmarked)))
    replaced = old_record.mark_id
    doomed, doom = intents.doom([boundaries_key(job_id, replaced)], now, replaced)
    return Commit(
        [*ops, doom],
        Marked("grown", record, replaced, request.added, shards, len(unmarked)),
        uploads={boundaries_key(job_id, grown.mark_id): request.payload},
        cleanup=(boundaries_key(job_id, replaced),),
        withdraw=(doomed,),
        buckets=((intents.ROOT, now),),
    )


# --- ReportProgress: the unmarked set --------------------------------------------------------


@dataclass(frozen=True)
class UnmarkedRequest:
    """Add ``tags`` (``unmarked_tag``) to the unmarked set of ``record``'s mark, up to ``limit``."""

    record: JobRecord
    tags: frozenset[str]
    limit: int

    def reads(self) -> list[ReadNode]:
        r = self.record
        return [ReadNode(shard_path(r.job_id, r.mark_id, 0)), ReadNode(unmarked_path(r.job_id, r.mark_id))]


def count_unmarked(
    request: UnmarkedRequest, reads: Reads, pending: Commit[frozenset[str]] | None
) -> Done[frozenset[str]] | Commit[frozenset[str]]:
    """The set as stored with ``tags`` added; the write checks the mark's first shard, so it never
    lands on a mark that is gone (``MarkGone`` when it is). Idempotent: a set holding the tags (a
    commit in doubt that landed, another report's write) is the answer."""
    first, path = (read.path for read in request.reads())
    shard = reads.node(first)
    if shard is None:
        raise MarkGone
    node = reads.node(path)
    stored = stored_unmarked(request.record, node)
    merged = add_unmarked(stored, request.tags, request.limit)
    if merged == stored:
        return Done(stored)
    data = encode_unmarked(merged)
    write: Op = Create(path, data) if node is None else SetData(path, data, node.version)
    return Commit([write, Check(first, shard.version)], merged)


# --- ClearBacklog -------------------------------------------------------------------------------


def clear(
    job_id: str, reads: Reads, pending: Commit[str | None] | None, now: int
) -> Done[str | None] | Commit[str | None] | More:
    """Delete the mark's nodes and record in one version-checked transaction (the boundaries after
    it, announced by an intent the transaction makes: ``intents.doom``); the result is the mark id
    cleared, None when there was none."""
    path = job_path(job_id)
    current = stored_job(job_id, reads.node(path))
    if pending is not None and (current is None or current.record.mark_id != pending.result):
        return landed(pending)
    if current is None:
        return Done(None)
    if not reads.has(ReadChildren(path)):
        return More([ReadChildren(path)])
    ops: list[Op] = [Delete(f"{path}/{name}", None) for name in reads.children(path)]
    ops.append(Delete(path, current.version))
    mark_id = current.record.mark_id
    doomed, doom = intents.doom([boundaries_key(job_id, mark_id)], now, mark_id)
    ops.append(doom)
    return Commit(
        ops,
        mark_id,
        cleanup=(boundaries_key(job_id, mark_id),),
        withdraw=(doomed,),
        buckets=((intents.ROOT, now),),
    )


# --- ReportProgress: one transaction of shards --------------------------------------------------


@dataclass(frozen=True)
class ChunkRequest:
    """Write the merged positions of the shards in ``todo``, as many as fit one transaction.

    ``known`` holds the shards as last read or written (the first round decides on them; after a
    lost compare-and-set the kernel re-reads ``todo`` and ``reads`` has them). Those in ``unread``
    are this process's copies, not read by this call: only a commit that writes them checks them,
    so one this transaction would not write is read first (``write_chunk``)."""

    record: JobRecord
    boundaries: Boundaries
    updates: Mapping[int, Mapping[int, int]]
    report_id: str
    todo: tuple[int, ...]
    known: Mapping[int, StoredShard]
    chunk_bytes: int
    unread: frozenset[int] = frozenset()

    def path(self, shard: int) -> str:
        return shard_path(self.record.job_id, self.record.mark_id, shard)


@dataclass(frozen=True)
class Written:
    """The shards as stored after the commit (or as read), and those left for the next chunk.

    ``remaining`` counts the unfinished partitions of the shards this commit wrote (known from
    their markers): derived from ``shards``, so the caller need not count them over again."""

    shards: Mapping[int, StoredShard]
    rest: tuple[int, ...]
    remaining: Mapping[int, int] = field(default_factory=dict, compare=False)


def write_chunk(
    request: ChunkRequest, reads: Reads, pending: Commit[Written] | None
) -> Done[Written] | Commit[Written] | More:
    """The next transaction of a report: at most ``chunk_bytes`` of shard data, each shard its own
    unit of atomicity, so a report split over several transactions is still exactly-once per
    partition. After a lost or doubtful commit the re-read shards merge again: partitions a landed
    write of ours finished carry our tag, so they are neither finished twice nor lost.

    A copy (``unread``) this transaction would not write is read first (``More``): nothing would
    check it, and the answer (what is finished, whether the mark still exists) must come from
    what is stored."""
    record = request.record
    ops: list[Op] = []
    shards: dict[int, StoredShard] = {}
    counts: dict[int, int] = {}
    unchecked: list[int] = []  # copies this transaction would not write
    chunk = 0
    size = 0
    rest: list[int] = []
    for shard in request.todo:
        path = request.path(shard)
        read = path in reads.nodes
        stored = stored_shard(record, shard, reads.node(path)) if read else request.known[shard]
        copy = not read and shard in request.unread
        shards[shard] = stored
        if size >= request.chunk_bytes:
            rest.append(shard)
            if copy:
                unchecked.append(shard)
            continue
        values = request.boundaries.values(record.shard_span(shard))
        merged = apply_positions(stored.progress, values, dict(request.updates[shard]), request.report_id)
        if merged is None:
            if copy:
                unchecked.append(shard)
            continue  # nothing new: equal or later positions are stored already
        data = encode_shard(merged)
        if chunk and size + len(data) > request.chunk_bytes:
            rest.append(shard)
            if copy:
                unchecked.append(shard)
            continue
        size += len(data)
        chunk += 1
        shards[shard] = StoredShard(merged, stored.version + 1)
        ops.append(SetData(path, data, stored.version))
        # Only this merge's flips change the count: each adds one tag.
        before = remaining(stored.progress, values)
        after = before - (len(merged.finished_by) - len(stored.progress.finished_by))
        counts[shard] = after
        if after != before:  # renamed with the shard: the marker always matches its shard
            ops.append(Delete(marker_path(record.job_id, record.mark_id, shard, before), None))
            if after:
                ops.append(Create(marker_path(record.job_id, record.mark_id, shard, after), b""))
    if unchecked:
        return More([ReadNode(request.path(shard)) for shard in unchecked])
    if not chunk:
        return Done(Written(shards, ()))
    return Commit(ops, Written(shards, tuple(rest), counts))
