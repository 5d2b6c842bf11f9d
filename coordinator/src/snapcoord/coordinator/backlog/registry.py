"""Backlog tracking: the BacklogService logic on the commit kernel.

The layout and why it is so are in ``layout``, the rules of each change in ``decide``, the
boundaries cache in ``cache``, the janitor's steps in ``janitor``. ReportProgress is the one
operation of several commits: its shards go in transactions of at most ``chunk_bytes`` (a
transaction is bounded by ZooKeeper's request size), each one kernel run of ``decide.write_chunk``,
all inside one kernel run that starts again from the record if the mark changed meanwhile.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from snapcoord.coordinator.backlog import decide
from snapcoord.coordinator.backlog.cache import SHARD_PARTITIONS, BoundariesCache, JobCopies, ShardCopies
from snapcoord.coordinator.backlog.decide import MarkGone, StoredShard
from snapcoord.coordinator.backlog.janitor import BacklogJanitor
from snapcoord.coordinator.backlog.layout import job_path, shard_name, shard_path, unmarked_path
from snapcoord.coordinator.domain.backlog import (
    SHARD_SIZE,
    BacklogPolicy,
    BacklogStatus,
    Boundaries,
    Growth,
    JobRecord,
    PartitionBacklog,
    Positions,
    Progress,
    boundaries_digest,
    boundaries_key,
    check_growth,
    empty_shard,
    grow,
    new_mark_id,
    partition_backlog,
    remaining,
    report_tag,
    unmarked_tag,
    validate_mark,
    validate_report,
    validate_report_id,
)
from snapcoord.coordinator.domain.backlog_codec import decode_boundaries, encode_boundaries
from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.documents import corrupt
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.lru import Lru
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.errors import BlobNotFound, CorruptRecord
from snapcoord.coordinator.kernel.commit import CommitKernel, Reread
from snapcoord.coordinator.kernel.corruption import at
from snapcoord.coordinator.kernel.decision import ReadChildren, ReadNode, Reads
from snapcoord.coordinator.kernel.keyed_locks import KeyedLocks
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore

_log = logging.getLogger(__name__)

T = TypeVar("T")

#: Data per progress transaction: half of ZooKeeper's 1 MB request bound, leaving room for paths.
CHUNK_BYTES = 500_000


class BacklogRegistry:
    """Mark, report, read and clear job backlogs; sweep orphans and compute gauges for the janitor.

    ``shard_size`` and ``chunk_bytes`` are the layout constants; tests shrink them to exercise many
    shards and transactions with few partitions. ``gauges_stale_after_ms`` is how long the values
    of the last gauge pass stay exported (a replica that stopped leading then exports 0).
    """

    def __init__(
        self,
        metadata: MetadataStore,
        blobs: BlobStore,
        clock: Clock,
        policy: BacklogPolicy,
        metrics: CoordinatorMetrics,
        *,
        gauges_stale_after_ms: int = 180_000,
        shard_size: int = SHARD_SIZE,
        chunk_bytes: int = CHUNK_BYTES,
        kernel: CommitKernel | None = None,
    ) -> None:
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._shard_size = shard_size
        self._chunk_bytes = chunk_bytes
        self._kernel = kernel or CommitKernel(metadata, blobs, metrics, now_ms=clock.now_ms)
        self._cache = BoundariesCache()
        self._jobs = JobCopies()
        self._shards = ShardCopies()
        #: Reports of one job in this process take turns (``keyed_locks`` says why).
        self._reporting = KeyedLocks()
        #: unmarked set path -> the set as last read or written (a report naming only partitions
        #: it holds writes nothing); counted in tags.
        self._unmarked: Lru[str, frozenset[str]] = Lru(SHARD_PARTITIONS)
        self._janitor = BacklogJanitor(
            self._kernel, metadata, blobs, clock, metrics, gauges_stale_after_ms=gauges_stale_after_ms
        )

    # --- the API ----------------------------------------------------------------------------

    def mark(self, job_id: str, boundaries: Iterable[Offset], reset: bool) -> BacklogStatus:
        """Mark the boundaries unless a mark exists, or replace it with ``reset``. A stored mark
        lacking some of the partitions named grows by them (``_grow``); one naming them all is
        returned as it is."""
        items = validate_mark(job_id, boundaries, self._policy)
        ours = Boundaries(job_id, new_mark_id(), items)
        request = decide.MarkRequest(ours, encode_boundaries(ours), reset, self._shard_size)

        def present(marked: decide.Marked) -> tuple[decide.Marked, BacklogStatus]:
            if marked.outcome == "existing":
                try:
                    stored = self._boundaries(marked.record)
                    growth = grow(stored, items, new_mark_id())
                    if growth is not None:
                        check_growth(job_id, len(stored.items), len(growth.added), self._policy)
                        return self._grow(marked.record, stored, growth)
                    status = self._full_status(marked.record)
                except MarkGone:
                    raise Reread from None  # reset, grown or cleared between our reads: decide again
                self._jobs.remember(marked.record)
                return marked, status
            self._cache.remember(ours)
            self._jobs.remember(marked.record)
            # The shards this commit created, empty at version 0: the first report reads none.
            record = marked.record
            self._remember_shards(
                record,
                {
                    k: StoredShard(empty_shard(len(record.shard_span(k))), 0)
                    for k in range(record.shard_count)
                },
            )
            if marked.replaced is not None:
                self._cache.forget(marked.replaced)
            partitions = tuple(partition_backlog(b, None) for b in items)
            return marked, BacklogStatus(job_id, any(not p.finished for p in partitions), partitions)

        marked, status = self._kernel.run(
            "backlog_mark",
            {"job_id": job_id},
            [ReadNode(job_path(job_id))],
            lambda reads, pending: decide.mark(request, reads, pending, self._clock.now_ms()),
            finish=present,
            # A reset always uploads: its intent rides with the first read. A plain mark usually
            # finds the mark of an earlier run (a restarted job) and uploads nothing; announcing
            # it up front would cost that call a withdrawal round trip, so it announces at commit.
            announce=(boundaries_key(job_id, ours.mark_id),) if reset else (),
        )
        self._metrics.backlog_marks.labels(marked.outcome).inc()
        if marked.outcome == "grown":
            self._metrics.backlog_partitions_added.inc(len(marked.added))
            _log.info(
                "backlog of %s grown by %d partitions to %d (mark %s replaces %s)",
                job_id,
                len(marked.added),
                marked.record.partition_count,
                marked.record.mark_id,
                marked.replaced,
            )
        elif marked.outcome != "existing":
            _log.info(
                "backlog of %s marked: %d partitions (mark %s)", job_id, len(items), marked.record.mark_id
            )
        return status

    def _grow(
        self, record: JobRecord, stored: Boundaries, growth: Growth
    ) -> tuple[decide.Marked, BacklogStatus]:
        """Commit ``growth`` of ``record``'s mark (``decide.grow``) and present the grown mark with
        the partitions added; ``MarkGone`` when the mark changed meanwhile (the caller decides
        again on the record then stored)."""
        grown = growth.boundaries
        request = decide.GrowRequest(
            record, stored, grown, growth.added, encode_boundaries(grown), self._chunk_bytes
        )
        path = job_path(record.job_id)
        marked = self._kernel.run(
            "backlog_grow",
            {"job_id": record.job_id},
            [ReadNode(path), ReadChildren(path), request.unmarked_read(), *request.shard_reads()],
            lambda reads, pending: decide.grow(request, reads, pending, self._clock.now_ms()),
        )
        new = marked.record
        self._cache.remember(grown)
        self._cache.forget(record.mark_id)
        self._jobs.remember(new)
        # The shards this commit created, at version 0.
        self._remember_shards(new, {k: StoredShard(p, 0) for k, p in enumerate(marked.shards)})
        partitions: list[PartitionBacklog] = []
        for shard, progress in enumerate(marked.shards):
            span = new.shard_span(shard)
            positions = progress.positions
            partitions += [partition_backlog(grown.items[i], positions[i - span.start]) for i in span]
        processing = any(not p.finished for p in partitions)
        status = BacklogStatus(record.job_id, processing, tuple(partitions), growth.added, marked.unmarked)
        return marked, status

    def report(self, job_id: str, positions: Positions | Iterable[Offset], report_id: str = "") -> Progress:
        """Record positions (each only forward) and return the partitions this report finished.

        A retry with the same ``report_id`` (after a lost reply) returns the same partitions: they
        carry the report's tag. Without one, the tag is fresh and a retry lists nothing."""
        if not isinstance(positions, Positions):
            positions = Positions.of(positions)
        items = validate_report(job_id, positions, self._policy)
        report_id = report_tag(validate_report_id(report_id))

        with self._reporting.hold(job_id):
            progress = self._on_mark(
                "backlog_report", job_id, lambda record: self._report_on(record, items, report_id)
            )
        if progress.newly_finished:
            self._metrics.backlog_partitions_finished.inc(len(progress.newly_finished))
        if progress.unmarked:
            self._metrics.backlog_unmarked_positions.inc(len(progress.unmarked))
        return progress

    def status(self, job_id: str) -> BacklogStatus:
        """Every marked partition with its boundary and position; NOT_FOUND when never marked."""
        require_id("job_id", job_id)

        return self._on_mark("backlog_status", job_id, self._full_status)

    def clear(self, job_id: str) -> bool:
        """Remove the mark and its progress (metadata first, then the boundaries); True when one
        was removed, False when there was none (idempotent)."""
        require_id("job_id", job_id)
        path = job_path(job_id)
        cleared = self._kernel.run(
            "backlog_clear",
            {"job_id": job_id},
            [ReadNode(path), ReadChildren(path)],
            lambda reads, pending: decide.clear(job_id, reads, pending, self._clock.now_ms()),
        )
        self._jobs.forget(job_id)
        if cleared is None:
            return False
        self._cache.forget(cleared)
        _log.info("backlog of %s cleared (mark %s)", job_id, cleared)
        return True

    # --- the janitor's steps (janitor.py) -------------------------------------------------------

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` unreferenced boundaries objects older than ``grace_ms``."""
        return self._janitor.sweep_orphans(grace_ms, limit)

    def refresh_gauges(self) -> int:
        """Count jobs still processing backlog and their unfinished partitions; returns 0."""
        return self._janitor.refresh_gauges()

    # --- internals ------------------------------------------------------------------------------

    def _on_mark(self, operation: str, job_id: str, use: Callable[[JobRecord], T]) -> T:
        """``use(record)`` on the job's current mark: first on this process's copy of the record
        (no read: ``use`` reads the mark's shards, which proves the copy current, or raises
        ``MarkGone`` for a stale one), else on the record read, again after a reset or clear
        between reads."""
        copy = self._jobs.get(job_id)
        if copy is not None:
            try:
                return use(copy)
            except MarkGone:
                self._jobs.forget(job_id, copy.mark_id)  # reset, grown or cleared since: read the record

        def on_record(record: JobRecord) -> T:
            try:
                result = use(record)
            except MarkGone:
                raise Reread from None  # reset, grown or cleared meanwhile: apply to what is there now
            self._jobs.remember(record)
            return result

        return self._kernel.run(
            operation,
            {"job_id": job_id},
            [ReadNode(job_path(job_id))],
            lambda reads, pending: decide.marked(job_id, reads, None),
            finish=on_record,
        )

    def _boundaries(self, record: JobRecord) -> Boundaries:
        cached = self._cache.get(record.mark_id)
        if cached is not None:
            return cached
        try:
            payload = self._blobs.get(record.object_key)
        except BlobNotFound:
            # Deletes remove the record first, so a missing object means the mark is gone too by
            # now, unless the invariant broke. Synced: a server that has not applied the delete
            # yet would still show the mark, and a lag would read as a broken invariant.
            path = job_path(record.job_id)
            after = decide.stored_job(record.job_id, self._metadata.synced_get_many(path, [path])[path])
            if after is None or after.record.mark_id != record.mark_id:
                raise MarkGone from None
            raise CorruptRecord(
                f"the backlog boundaries payload of job_id {record.job_id!r} is missing",
                kind="backlog_boundaries_payload",
                path=record.object_key,
            ) from None
        with at(record.object_key):
            if record.boundaries_digest and boundaries_digest(payload) != record.boundaries_digest:
                raise corrupt(
                    "backlog boundaries payload",
                    "does not match the SHA-256 its job record holds (the object was changed)",
                    payload,
                )
            boundaries = decode_boundaries(payload)
            if (boundaries.job_id, boundaries.mark_id, len(boundaries.items)) != (
                record.job_id,
                record.mark_id,
                record.partition_count,
            ):
                raise corrupt("backlog boundaries payload", "does not match its job record", payload)
        self._cache.remember(boundaries)
        return boundaries

    def _read_shards(self, record: JobRecord, shards: Iterable[int]) -> dict[int, StoredShard]:
        """The shards, read together; ``MarkGone`` if one is missing."""
        wanted = {shard: shard_path(record.job_id, record.mark_id, shard) for shard in shards}
        nodes = self._metadata.get_many(list(wanted.values()))
        return {shard: decide.stored_shard(record, shard, nodes[path]) for shard, path in wanted.items()}

    def _read_shards_and_unmarked(self, record: JobRecord) -> tuple[dict[int, StoredShard], frozenset[str]]:
        """Every shard of the mark and its unmarked set, read together; ``MarkGone`` if a shard is
        missing."""
        job_id, mark_id = record.job_id, record.mark_id
        wanted = {shard: shard_path(job_id, mark_id, shard) for shard in range(record.shard_count)}
        upath = unmarked_path(record.job_id, record.mark_id)
        nodes = self._metadata.get_many([*wanted.values(), upath])
        shards = {shard: decide.stored_shard(record, shard, nodes[path]) for shard, path in wanted.items()}
        return shards, decide.stored_unmarked(record, nodes[upath])

    def _remember_shards(self, record: JobRecord, shards: Mapping[int, StoredShard]) -> None:
        for shard, stored in shards.items():
            self._shards.remember(shard_path(record.job_id, record.mark_id, shard), stored)

    def _full_status(self, record: JobRecord) -> BacklogStatus:
        boundaries = self._boundaries(record)
        shards, unmarked = self._read_shards_and_unmarked(record)
        self._remember_shards(record, shards)
        self._unmarked.put(unmarked_path(record.job_id, record.mark_id), unmarked, max(1, len(unmarked)))
        partitions: list[PartitionBacklog] = []
        for shard in range(record.shard_count):
            progress = shards[shard].progress
            span = record.shard_span(shard)
            partitions += [
                partition_backlog(boundaries.items[i], progress.positions[i - span.start]) for i in span
            ]
        return BacklogStatus(
            record.job_id,
            processing_backlog=any(not p.finished for p in partitions),
            partitions=tuple(partitions),
            unmarked_partitions=len(unmarked),
        )

    def _report_on(self, record: JobRecord, items: Positions, report_id: str) -> Progress:
        boundaries = self._boundaries(record)
        updates = boundaries.by_shard(items, record.shard_size)
        placed = sum(map(len, updates.values()))
        unmarked = boundaries.unmarked(items) if placed < len(items) else ()
        todo = tuple(sorted(updates))
        # The shards this process holds copies of are not read: the commit checks them (its
        # compare-and-set), and ``write_chunk`` reads those it would not write.
        shards: dict[int, StoredShard] = {}
        for shard in todo:
            copy = self._shards.get(shard_path(record.job_id, record.mark_id, shard))
            if copy is not None:
                shards[shard] = copy
        unread = frozenset(shards)
        if len(shards) < len(todo):
            shards.update(self._read_shards(record, [k for k in todo if k not in unread]))
        counts: dict[int, int] = {}  # unfinished partitions of the shards written
        # Chunk after chunk (not a retry loop: each chunk's retries are the kernel's).
        while todo:
            request = decide.ChunkRequest(
                record, boundaries, updates, report_id, todo, dict(shards), self._chunk_bytes, unread
            )
            written = self._kernel.run(
                "backlog_report",
                {"job_id": record.job_id},
                [ReadNode(request.path(shard)) for shard in todo],
                functools.partial(decide.write_chunk, request),
                assume=Reads(),  # the first round decides on the shards just read or written
            )
            shards.update(written.shards)
            counts.update(written.remaining)
            todo = written.rest
            unread = frozenset()  # the rest was read (``write_chunk``) or is a written shard
        self._remember_shards(record, shards)
        # What this report finished is what carries its tag in the committed shards, whichever
        # attempt's write landed, this call's or an earlier call's with the same report id. The
        # tag was set by a write of this report's own position, which is the one listed: a later
        # report may have moved the stored one on since, and a retry must answer the same.
        newly: list[Offset] = []
        for shard, stored in sorted(shards.items()):
            progress, start = stored.progress, shard * record.shard_size
            for local in sorted(k for k, tag in progress.finished_by.items() if tag == report_id):
                b = boundaries.items[start + local]
                position = updates.get(shard, {}).get(local, progress.positions[local])
                assert position is not None  # a tag is only set with the position that finished it
                newly.append(Offset(b.stream, b.partition, position))
        # The shards we hold tell "still processing" without a round trip unless all are done.
        processing = any(
            counts[k] if k in counts else remaining(s.progress, boundaries.values(record.shard_span(k)))
            for k, s in shards.items()
        ) or self._has_markers(record)
        if unmarked:
            self._count_unmarked(record, unmarked)
        return Progress(record.job_id, tuple(newly), processing, unmarked)

    def _count_unmarked(self, record: JobRecord, unmarked: tuple[Offset, ...]) -> None:
        """Add the partitions to the mark's unmarked set unless this process knows it holds them
        (or it is full); ``MarkGone`` when the mark is gone."""
        path = unmarked_path(record.job_id, record.mark_id)
        tags = frozenset(unmarked_tag(o.stream, o.partition) for o in unmarked)
        known = self._unmarked.get(path)
        if known is not None and (tags <= known or len(known) >= self._policy.max_partitions):
            return
        request = decide.UnmarkedRequest(record, tags, self._policy.max_partitions)
        stored = self._kernel.run(
            "backlog_unmarked",
            {"job_id": record.job_id},
            request.reads(),
            functools.partial(decide.count_unmarked, request),
        )
        self._unmarked.put(path, stored, max(1, len(stored)))

    def _has_markers(self, record: JobRecord) -> bool:
        """Whether a remaining marker of the mark is listed; ``MarkGone`` when its first shard is
        not (the listing then shows another mark, or none: its record may be a stale copy)."""
        names = self._metadata.children(job_path(record.job_id))
        if shard_name(record.mark_id, 0) not in names:
            raise MarkGone
        prefix = f"r-{record.mark_id}-"
        return any(name.startswith(prefix) for name in names)
