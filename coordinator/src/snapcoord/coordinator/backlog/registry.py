"""Backlog tracking on the metadata and blob stores: the BacklogService logic and the janitor's
two backlog steps (orphan sweep, gauges). The rules are in ``domain.backlog``.

Layout. A job of 10,000 partitions does not fit one znode (200-character stream names alone make
2 MB), nor one transaction of all its pieces (ZooKeeper's 1 MB bound covers a whole multi), so:

- **Boundaries go to S3**, immutable, at ``backlog/<job_id>/<mark_id>.json``: versioned JSON,
  grouped by stream, in (stream, partition) order, which numbers the partitions 0..N-1. For 10,000
  partitions of one stream that is ~160 KB; at worst (10,000 streams of 200 characters) ~2.6 MB.
  Replicas cache them in memory by mark id (they never change), so a report reads no S3.
- **The job record** ``/backlog/jobs/<job_id>`` (ZooKeeper, at most ~350 bytes) names the mark (a
  UUID, also the object's name), its partition count and shard size.
- **Progress shards** ``/backlog/jobs/<job_id>/s-<mark_id>-<k>`` hold the positions of partitions
  ``k*1024 .. k*1024+1023`` by index, plus the tag of the report that finished each one: no stream
  names, so ~11 KB with 10-digit offsets, ~37 KB once all are finished, ~46 KB at worst. 10,000
  partitions make 10 shards: 110-460 KB in ZooKeeper, which also fits one progress transaction.
  Every update is a compare-and-set on the shard's version, so reports on different shards never
  contend and each partition flips to finished in exactly one committed write, whose writer's tag
  it keeps (``domain.backlog``: that is how ``newly_finished`` is exactly once).
- **Remaining markers** ``/backlog/jobs/<job_id>/r-<mark_id>-<k>-<n>`` (no data) exist while shard
  ``k`` has ``n > 0`` unfinished partitions. The write that finishes partitions of a shard renames
  its marker in the same transaction, so one ``children`` call tells whether the job is still
  processing backlog and how many partitions remain, without reading any shard.

Every progress node carries the mark id in its name, so a reporter that read an older mark can
never write into a newer one (its shard path no longer exists), whatever the versions say.

Operations. MarkBacklog uploads the boundaries, then commits record, shards and markers in one
transaction that fails if a record exists (first mark wins; losers delete their upload and return
the stored status); ``reset`` instead replaces the record by version and deletes the old mark's
nodes in the same transaction, then the old object. ReportProgress reads the record and the shards
it touches (the boundaries come from the cache), merges, and commits the changed shards with their
markers in transactions of at most ``chunk_bytes`` of data (one for 10,000 partitions; the bound
matters from ~11,000 on); a lost compare-and-set re-reads only the shards of that transaction.
Steady state: 1 + ceil(n/1024) reads and one multi for a report of n partitions, plus one
``children`` call once every shard it touched is done.
ClearBacklog deletes the nodes and the record in one version-checked transaction, then the object.
An object whose record is gone (a crash between upload and commit, or a failed delete) is swept by
the janitor once older than the grace period.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from snapcoord.coordinator.domain.backlog import (
    OBJECT_PREFIX,
    SHARD_SIZE,
    BacklogPolicy,
    BacklogStatus,
    Boundaries,
    JobRecord,
    PartitionBacklog,
    Progress,
    ShardProgress,
    apply_positions,
    boundaries_key,
    empty_shard,
    job_of_object,
    new_mark_id,
    new_report_id,
    partition_backlog,
    remaining,
    validate_mark,
    validate_report,
)
from snapcoord.coordinator.domain.backlog_codec import (
    decode_boundaries,
    decode_job_record,
    decode_shard,
    encode_boundaries,
    encode_job_record,
    encode_shard,
)
from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.errors import (
    Aborted,
    BlobNotFound,
    CommitOutcomeUnknown,
    Internal,
    NotFound,
    StoreUnavailable,
    TransactionFailed,
)
from snapcoord.coordinator.metrics import CoordinatorMetrics
from snapcoord.coordinator.orphans import sweep_unreferenced
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import Create, Delete, MetadataStore, Op, SetData

_log = logging.getLogger(__name__)

JOBS = "/backlog/jobs"

#: Rounds of read-decide-commit before a contended call gives up with ABORTED. Every lost round
#: means another caller committed; 20 reporters on one shard need up to 20 rounds.
MAX_ATTEMPTS = 64
#: Data per progress transaction: half of ZooKeeper's 1 MB request bound, leaving room for paths.
CHUNK_BYTES = 500_000
#: Boundaries kept in memory, counted in partitions (~200 bytes each with the index).
CACHE_PARTITIONS = 200_000


@dataclass(frozen=True)
class _StoredJob:
    record: JobRecord
    version: int


@dataclass(frozen=True)
class _StoredShard:
    progress: ShardProgress
    version: int


class _MarkGone(Exception):
    """The mark a call was working on was reset or cleared meanwhile: start again from the record."""


def _job_path(job_id: str) -> str:
    return f"{JOBS}/{job_id}"


def _shard_name(mark_id: str, shard: int) -> str:
    return f"s-{mark_id}-{shard}"


def _marker_name(mark_id: str, shard: int, unfinished: int) -> str:
    return f"r-{mark_id}-{shard}-{unfinished}"


def _parse_marker(name: str) -> tuple[str, int, int] | None:
    """``r-<mark>-<shard>-<n>`` -> (mark_id, shard, n); None for other names."""
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "r" or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    return parts[1], int(parts[2]), int(parts[3])


def _not_marked(job_id: str) -> str:
    return f"no backlog is marked for job_id {job_id!r}; call MarkBacklog first"


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
    ) -> None:
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._shard_size = shard_size
        self._chunk_bytes = chunk_bytes
        self._layout_ready = False  # created on the first mark, so building a server does no I/O
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[str, Boundaries] = OrderedDict()  # mark id -> boundaries, LRU
        self._cached_partitions = 0
        self._gauges_stale_after_ms = gauges_stale_after_ms
        self._gauges: tuple[int, int, int] | None = None  # (jobs, partitions, computed at ms)
        metrics.backlog_jobs_processing.set_function(lambda: self._gauge(0))
        metrics.backlog_partitions_remaining.set_function(lambda: self._gauge(1))

    # --- the API ----------------------------------------------------------------------------

    def mark(self, job_id: str, boundaries: Iterable[Offset], reset: bool) -> BacklogStatus:
        """Mark the boundaries unless a mark exists (then return it), or replace it with ``reset``."""
        items = validate_mark(job_id, boundaries, self._policy)
        uploaded: Boundaries | None = None
        outcome_unknown = False
        try:
            for _ in range(MAX_ATTEMPTS):
                current = self._read_job(job_id)
                if current is not None and not reset:
                    try:
                        status = self._full_status(current.record)
                    except _MarkGone:
                        continue  # reset or cleared between our reads: decide again
                    if uploaded is not None:  # an earlier round of ours lost the race
                        self._delete_object(uploaded.job_id, uploaded.mark_id)
                        uploaded = None
                    self._metrics.backlog_marks.labels("existing").inc()
                    return status
                if uploaded is None:
                    uploaded = Boundaries(job_id, new_mark_id(), items)
                    # Payload first: once the record commits, its object must already exist.
                    self._blobs.put(boundaries_key(job_id, uploaded.mark_id), encode_boundaries(uploaded))
                record = JobRecord(
                    job_id, uploaded.mark_id, len(items), self._shard_size, self._clock.now_ms()
                )
                outcome_unknown = False
                try:
                    self._commit_mark(record, uploaded, current)
                except TransactionFailed:
                    continue  # another mark, reset or clear won: read again and decide
                except CommitOutcomeUnknown:
                    outcome_unknown = True
                    after = self._read_job(job_id)  # may raise: then the object must stay
                    outcome_unknown = False
                    if after is None or after.record.mark_id != record.mark_id:
                        continue  # ours did not land (or was replaced already): decide again
                    record = after.record
                self._remember(uploaded)
                uploaded = None  # committed: the record owns the object now
                if current is not None:  # reset: the old mark's boundaries are garbage now
                    self._forget(current.record.mark_id)
                    self._delete_object(job_id, current.record.mark_id)
                self._metrics.backlog_marks.labels("reset" if current is not None else "marked").inc()
                _log.info("backlog of %s marked: %d partitions (mark %s)", job_id, len(items), record.mark_id)
                partitions = tuple(partition_backlog(b, None) for b in items)
                return BacklogStatus(job_id, any(not p.finished for p in partitions), partitions)
            raise Aborted(f"job_id {job_id!r} is heavily contended; retry the mark")
        except Exception:
            # Our upload is unreferenced unless a commit may have landed; remove it now rather than
            # leave it to the orphan sweep. (A crash skips this: the sweep is the backstop.)
            if uploaded is not None and not outcome_unknown:
                self._delete_object(job_id, uploaded.mark_id)
            raise

    def report(self, job_id: str, positions: Iterable[Offset]) -> Progress:
        """Record positions (each only forward) and return the partitions this call finished."""
        items = validate_report(job_id, positions, self._policy)
        report_id = new_report_id()
        for _ in range(MAX_ATTEMPTS):
            current = self._read_job(job_id)
            if current is None:
                raise NotFound(_not_marked(job_id))
            try:
                progress = self._report_on(current.record, items, report_id)
            except _MarkGone:
                continue  # reset or cleared meanwhile: the report applies to what is there now
            if progress.newly_finished:
                self._metrics.backlog_partitions_finished.inc(len(progress.newly_finished))
            return progress
        raise Aborted(f"job_id {job_id!r} is heavily contended; retry the report")

    def status(self, job_id: str) -> BacklogStatus:
        """Every marked partition with its boundary and position; NOT_FOUND when never marked."""
        require_id("job_id", job_id)
        for _ in range(MAX_ATTEMPTS):
            current = self._read_job(job_id)
            if current is None:
                raise NotFound(_not_marked(job_id))
            try:
                return self._full_status(current.record)
            except _MarkGone:
                continue
        raise Aborted(f"job_id {job_id!r} is heavily contended; retry")

    def clear(self, job_id: str) -> bool:
        """Remove the mark and its progress (metadata first, then the boundaries); True when one
        was removed, False when there was none (idempotent)."""
        require_id("job_id", job_id)
        for _ in range(MAX_ATTEMPTS):
            current = self._read_job(job_id)
            if current is None:
                return False
            path = _job_path(job_id)
            ops: list[Op] = [Delete(f"{path}/{name}", None) for name in self._metadata.children(path)]
            ops.append(Delete(path, current.version))
            try:
                self._metadata.transaction(ops)
            except TransactionFailed:
                continue  # a marker was renamed, or the mark replaced, meanwhile: look again
            except CommitOutcomeUnknown:
                after = self._read_job(job_id)
                if after is not None and after.record.mark_id == current.record.mark_id:
                    continue  # it did not land
            self._forget(current.record.mark_id)
            self._delete_object(job_id, current.record.mark_id)
            _log.info("backlog of %s cleared (mark %s)", job_id, current.record.mark_id)
            return True
        raise Aborted(f"job_id {job_id!r} is heavily contended; retry the clear")

    # --- the janitor's steps ----------------------------------------------------------------

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` boundaries objects that no job record references and that are
        older than ``grace_ms`` (younger ones may belong to a mark still in flight)."""

        def referenced_by(job_id: str) -> set[str]:
            current = self._read_job(job_id)
            return {current.record.object_key} if current else set()

        deleted = sweep_unreferenced(
            self._blobs,
            OBJECT_PREFIX,
            modified_before_ms=self._clock.now_ms() - grace_ms,
            limit=limit,
            owner_of=job_of_object,
            referenced_by=referenced_by,
        )
        if deleted:
            self._metrics.orphans_deleted.labels("backlog").inc(deleted)
        return deleted

    def refresh_gauges(self) -> int:
        """Count jobs still processing backlog and their unfinished partitions: one ``children``
        call per job (the remaining markers), none per partition. Removes nothing: returns 0."""
        jobs = partitions = 0
        for job_id in self._metadata.children(JOBS):
            counts = [m[2] for m in map(_parse_marker, self._metadata.children(_job_path(job_id))) if m]
            if counts:
                jobs += 1
                partitions += sum(counts)
        self._gauges = (jobs, partitions, self._clock.now_ms())
        return 0

    # --- internals ------------------------------------------------------------------------------

    def _gauge(self, which: int) -> float:
        gauges = self._gauges
        if gauges is None or self._clock.now_ms() - gauges[2] > self._gauges_stale_after_ms:
            return 0.0
        return float(gauges[which])

    def _read_job(self, job_id: str) -> _StoredJob | None:
        node = self._metadata.get(_job_path(job_id))
        if node is None:
            return None
        record = decode_job_record(node.data)
        if record.job_id != job_id:
            raise Internal(f"the backlog record at {_job_path(job_id)} names job_id {record.job_id!r}")
        return _StoredJob(record, node.version)

    def _read_shard(self, record: JobRecord, shard: int) -> _StoredShard:
        node = self._metadata.get(f"{_job_path(record.job_id)}/{_shard_name(record.mark_id, shard)}")
        if node is None:
            raise _MarkGone  # nodes of a mark go only with its record
        size = len(record.shard_span(shard))
        return _StoredShard(decode_shard(node.data, size), node.version)

    def _boundaries(self, record: JobRecord) -> Boundaries:
        with self._cache_lock:
            cached = self._cache.get(record.mark_id)
            if cached is not None:
                self._cache.move_to_end(record.mark_id)
                return cached
        try:
            boundaries = decode_boundaries(self._blobs.get(record.object_key))
        except BlobNotFound:
            # Deletes remove the record first, so a missing object means the mark is gone too by
            # now, unless the invariant broke.
            after = self._read_job(record.job_id)
            if after is None or after.record.mark_id != record.mark_id:
                raise _MarkGone from None
            raise Internal(
                f"the backlog boundaries {record.object_key} of job_id {record.job_id!r} are missing"
            ) from None
        if (boundaries.job_id, boundaries.mark_id, len(boundaries.items)) != (
            record.job_id,
            record.mark_id,
            record.partition_count,
        ):
            raise Internal(f"the backlog boundaries {record.object_key} do not match their job record")
        self._remember(boundaries)
        return boundaries

    def _remember(self, boundaries: Boundaries) -> None:
        with self._cache_lock:
            if boundaries.mark_id in self._cache:
                return
            self._cache[boundaries.mark_id] = boundaries
            self._cached_partitions += len(boundaries.items)
            while self._cached_partitions > CACHE_PARTITIONS and len(self._cache) > 1:
                _, evicted = self._cache.popitem(last=False)
                self._cached_partitions -= len(evicted.items)

    def _forget(self, mark_id: str) -> None:
        with self._cache_lock:
            evicted = self._cache.pop(mark_id, None)
            if evicted is not None:
                self._cached_partitions -= len(evicted.items)

    def _commit_mark(self, record: JobRecord, boundaries: Boundaries, current: _StoredJob | None) -> None:
        """Create the record, its shards and markers, or (reset) replace the current mark's."""
        if not self._layout_ready:
            self._metadata.ensure_path(JOBS)
            self._layout_ready = True
        path = _job_path(record.job_id)
        data = encode_job_record(record)
        ops: list[Op]
        if current is None:
            ops = [Create(path, data)]
        else:
            # One transaction: the version check fences a concurrent reset or clear, and deleting
            # every node listed now fails (NoNode) if a report renamed a marker meanwhile.
            ops = [SetData(path, data, current.version)]
            ops += [Delete(f"{path}/{name}", None) for name in self._metadata.children(path)]
        for shard in range(record.shard_count):
            span = record.shard_span(shard)
            ops.append(Create(f"{path}/{_shard_name(record.mark_id, shard)}", encode_shard(empty_shard(0))))
            unfinished = remaining(empty_shard(len(span)), boundaries.values(span))
            if unfinished:
                ops.append(Create(f"{path}/{_marker_name(record.mark_id, shard, unfinished)}", b""))
        self._metadata.transaction(ops)

    def _full_status(self, record: JobRecord) -> BacklogStatus:
        boundaries = self._boundaries(record)
        partitions: list[PartitionBacklog] = []
        for shard in range(record.shard_count):
            progress = self._read_shard(record, shard).progress
            span = record.shard_span(shard)
            partitions += [
                partition_backlog(boundaries.items[i], progress.positions[i - span.start]) for i in span
            ]
        return BacklogStatus(
            record.job_id,
            processing_backlog=any(not p.finished for p in partitions),
            partitions=tuple(partitions),
        )

    def _report_on(self, record: JobRecord, items: tuple[Offset, ...], report_id: str) -> Progress:
        boundaries = self._boundaries(record)
        updates = boundaries.by_shard(items, record.shard_size)
        shards = {shard: self._read_shard(record, shard) for shard in sorted(updates)}
        self._write_shards(record, boundaries, shards, updates, report_id)
        # What this report finished is what carries its tag in the committed shards, whichever
        # attempt's write landed.
        newly: list[Offset] = []
        for shard, stored in sorted(shards.items()):
            progress, start = stored.progress, shard * record.shard_size
            for local in sorted(k for k, tag in progress.finished_by.items() if tag == report_id):
                b, position = boundaries.items[start + local], progress.positions[local]
                assert position is not None  # a tag is only set with the position that finished it
                newly.append(Offset(b.stream, b.partition, position))
        # The shards we hold tell "still processing" without a round trip unless all are done.
        processing = any(
            remaining(s.progress, boundaries.values(record.shard_span(k))) for k, s in shards.items()
        ) or self._has_markers(record)
        return Progress(record.job_id, tuple(newly), processing)

    def _write_shards(
        self,
        record: JobRecord,
        boundaries: Boundaries,
        shards: dict[int, _StoredShard],
        updates: dict[int, dict[int, int]],
        report_id: str,
    ) -> None:
        """Commit the merged positions shard by shard (``shards`` ends up holding what is stored).

        Shards go in transactions of at most ``chunk_bytes`` of data; each shard is its own unit of
        atomicity, so a report split over several transactions is still exactly-once per partition.
        A lost compare-and-set (or a commit whose outcome is unknown) re-reads the shards of that
        transaction and merges again: partitions a landed write of ours finished carry our tag, so
        they are neither finished twice nor lost.
        """
        path = _job_path(record.job_id)
        todo = sorted(updates)
        failures = 0
        while todo:
            ops: list[Op] = []
            chunk: list[tuple[int, ShardProgress]] = []
            size = 0
            rest: list[int] = []
            for shard in todo:
                if size >= self._chunk_bytes:
                    rest.append(shard)
                    continue
                stored = shards[shard]
                values = boundaries.values(record.shard_span(shard))
                merged = apply_positions(stored.progress, values, updates[shard], report_id)
                if merged is None:
                    continue  # nothing new: equal or later positions are stored already
                data = encode_shard(merged)
                if chunk and size + len(data) > self._chunk_bytes:
                    rest.append(shard)
                    continue
                size += len(data)
                chunk.append((shard, merged))
                ops.append(SetData(f"{path}/{_shard_name(record.mark_id, shard)}", data, stored.version))
                # Only this merge's flips change the count: each adds one tag.
                before = remaining(stored.progress, values)
                after = before - (len(merged.finished_by) - len(stored.progress.finished_by))
                if after != before:  # renamed with the shard: the marker always matches its shard
                    ops.append(Delete(f"{path}/{_marker_name(record.mark_id, shard, before)}", None))
                    if after:
                        ops.append(Create(f"{path}/{_marker_name(record.mark_id, shard, after)}", b""))
            if not chunk:
                return
            try:
                self._metadata.transaction(ops)
            except (TransactionFailed, CommitOutcomeUnknown):
                failures += 1
                if failures >= MAX_ATTEMPTS:
                    raise Aborted(
                        f"job_id {record.job_id!r} is heavily contended; retry the report"
                    ) from None
                for shard, _ in chunk:
                    shards[shard] = self._read_shard(record, shard)  # _MarkGone if reset or cleared
                # Jittered backoff: concurrent reporters on one shard otherwise collide in lockstep.
                time.sleep(random.uniform(0, min(0.05, 0.001 * 2 ** min(failures, 6))))
                todo = [shard for shard, _ in chunk] + rest
                continue
            for shard, merged in chunk:
                shards[shard] = _StoredShard(merged, shards[shard].version + 1)
            todo = rest

    def _has_markers(self, record: JobRecord) -> bool:
        prefix = f"r-{record.mark_id}-"
        return any(name.startswith(prefix) for name in self._metadata.children(_job_path(record.job_id)))

    def _delete_object(self, job_id: str, mark_id: str) -> None:
        """Best effort: an object left behind is an orphan, which the janitor sweeps later."""
        key = boundaries_key(job_id, mark_id)
        try:
            self._blobs.delete(key)
        except StoreUnavailable as e:
            _log.warning("could not delete %s now (the orphan sweep will): %s", key, e)
