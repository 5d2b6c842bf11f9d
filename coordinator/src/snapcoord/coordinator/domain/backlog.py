"""Backlog tracking (FLIP-309 "processing backlog"): the rules, without I/O.

A streaming job marks, when it starts, the end offsets of its inputs as its backlog boundary; as it
reports progress the coordinator says which partitions have caught up and whether the job is still
processing backlog, so the driver can switch from a catch-up trigger to a low-latency one.

The rules:

- **Identity inside a mark.** A mark's boundaries are sorted by (stream, partition) and never change
  afterwards, so a partition is named by its index in that order; progress is stored by index
  (no stream names) in shards of ``shard_size`` consecutive indices.
- **Finished.** A partition is finished once a reported position is at or past its boundary
  (``position >= boundary``). Positions only move forward: a report lower than the stored
  position is ignored (reports may arrive out of order), so a finished partition stays finished.
- **Finished at once.** A boundary of 0 or -1 (an empty partition, or one with no data) is at or
  below any position the job can start from (offsets are 0 or more, or -1), so the partition is
  finished by the mark itself: the mark's status shows it ``finished`` with position -1. Such a
  partition is never listed in ``newly_finished``: that list holds what a *report* finished. A
  partition whose first reported position is already at or past its boundary (docs/api.md: "at or
  below its first position") is finished by that first report, which lists it, exactly once.
- **newly_finished, exactly once.** The write that finishes a partition tags it with the id of
  the report that made it (``finished_by``). Tags are set once, by a compare-and-set write, and
  never changed, so at most one report owns each partition; a report's ``newly_finished`` is read
  back from the committed tags, which also settles a write whose reply was lost. A call that
  fails (UNAVAILABLE...) after its write committed can be sent again with the same
  ``report_id``: the retry finds the partitions tagged with that id and lists them again (the
  stored tag is a hash of the id, ``report_tag``), so no final report is lost. Without a
  ``report_id`` the coordinator makes a fresh tag and a retry lists nothing; the status still
  shows the partition finished. The list is in (stream, partition) order, with the position that
  finished each partition (the report's own position for it).
- **A report's answer** is ``newly_finished`` and the job-wide ``processing_backlog``, with no
  per-partition status (``Progress``); MarkBacklog and GetBacklogStatus list every partition.
- **Not marked, not backlog, never dropped silently.** Positions for partitions the mark does
  not name are validated, left out of the progress, and listed back in the report's ``unmarked``
  (in (stream, partition) order): the driver learns in the same call that its source has a
  partition the mark lacks, and marks it (``grow``). The mark also keeps the set of partitions
  reports named unmarked (as ``unmarked_tag`` hashes, at most ``max_partitions``), so that
  GetBacklogStatus and the gauges count them; a grow drops the ones it adds.
- **A mark grows.** A mark naming partitions the stored one lacks adds them (``grow``): each
  partition's first boundary wins, the partitions already marked keep their boundary and
  progress. The grown mark is a new mark id (so ``Boundaries`` and ``JobRecord`` stay immutable
  per mark id, and a partition's index stays its place in (stream, partition) order); its
  progress is the old mark's, carried over partition by partition with the report tags
  (``carry_progress``), so nothing reported before is lost and a report retried after the grow
  still finds what it finished.
- **Tamper-evident boundaries.** The job record holds the SHA-256 of its boundaries object
  (``boundaries_digest``); an object that no longer matches is a corrupt record. Records written
  before the digest existed have none and are read without the check.
- **Status position.** -1 (``NO_POSITION``) until a position is reported.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import cast

from snapcoord.coordinator.domain.ids import is_valid_id, require_id
from snapcoord.coordinator.domain.offsets import MAX_PARTITION, NO_DATA, Offset, validate_offsets
from snapcoord.coordinator.errors import InvalidArgument, Reason

#: Partitions per progress shard. A shard stores one position (at most 20 characters) and, once
#: finished, one report tag (about 25 characters) per partition: at most ~46 KB, far below
#: ZooKeeper's 1 MB node limit, and ~10 KB for a typical job. Larger shards mean fewer reads for a
#: large report; smaller ones, less contention between concurrent reporters.
SHARD_SIZE = 1024

#: The position a status shows for a partition with no reported position yet.
NO_POSITION = NO_DATA

OBJECT_PREFIX = "backlog/"


@dataclass(frozen=True)
class BacklogPolicy:
    """Server-side limits, from the configuration (``config.options.OPTIONS`` names the option of
    each field). A field's default here is its option's default: the option reads it."""

    #: Most partitions in one mark, and positions in one report. A status lists every partition,
    #: so gRPC's 4 MB default message size bounds this: 10,000 partitions with 200-character
    #: stream names make a status of ~2.4 MB.
    max_partitions: int = 10_000


@dataclass(frozen=True)
class JobRecord:
    """What the metadata store holds for a marked job: small, with a pointer to the boundaries."""

    job_id: str
    #: Unique per mark (a UUID): names the boundaries object and the progress nodes, so nothing of
    #: an earlier mark can ever count for this one.
    mark_id: str
    partition_count: int
    shard_size: int
    marked_at_ms: int
    #: SHA-256 (hex) of the boundaries object; empty in records written before it was kept (their
    #: object is read unchecked).
    boundaries_digest: str = ""

    @property
    def object_key(self) -> str:
        return boundaries_key(self.job_id, self.mark_id)

    @property
    def shard_count(self) -> int:
        return -(-self.partition_count // self.shard_size)

    def shard_span(self, shard: int) -> range:
        """The partition indices of ``shard``."""
        start = shard * self.shard_size
        return range(start, min(start + self.shard_size, self.partition_count))


@dataclass(frozen=True)
class Boundaries:
    """The boundaries of one mark, sorted by (stream, partition); immutable once marked."""

    job_id: str
    mark_id: str
    items: tuple[Offset, ...]

    @cached_property
    def _index(self) -> dict[tuple[str, int], int]:
        return {(o.stream, o.partition): i for i, o in enumerate(self.items)}

    def index_of(self, stream: str, partition: int) -> int | None:
        """The index of a marked partition; None when the mark does not name it."""
        return self._index.get((stream, partition))

    @cached_property
    def _offsets(self) -> tuple[int, ...]:
        return tuple(o.offset for o in self.items)

    def values(self, span: range) -> Sequence[int]:
        """The boundary offsets of the partitions in ``span`` (a slice: every report asks)."""
        return self._offsets[span.start : span.stop]

    def by_shard(self, positions: Positions, shard_size: int) -> dict[int, dict[int, int]]:
        """Reported positions of marked partitions as shard -> index within it -> position;
        positions of partitions this mark does not name are left out (they are not backlog)."""
        # The lookups run in C (map over the columns): this is per partition on every report.
        indices = map(self._index.get, zip(positions.streams, positions.partitions, strict=True))
        if len(self.items) <= shard_size:  # one shard: the index is the index within it
            only: dict[int | None, int] = dict(zip(indices, positions.offsets, strict=True))
            only.pop(None, None)  # the partitions the mark does not name, all under one key
            return {0: cast(dict[int, int], only)} if only else {}
        updates: dict[int, dict[int, int]] = {}
        for i, o in zip(indices, positions.offsets, strict=True):
            if i is not None:
                shard, local = divmod(i, shard_size)
                updates.setdefault(shard, {})[local] = o
        return updates

    def unmarked(self, positions: Positions) -> tuple[Offset, ...]:
        """The reported positions of partitions this mark does not name, in (stream, partition)
        order (only asked when ``by_shard`` placed fewer positions than were reported)."""
        index = self._index
        return tuple(
            sorted(
                Offset(s, p, o)
                for s, p, o in zip(positions.streams, positions.partitions, positions.offsets, strict=True)
                if (s, p) not in index
            )
        )


@dataclass(frozen=True)
class Growth:
    """A mark grown by the partitions a later mark names that it lacks: the grown boundaries
    (under a new mark id) and the partitions added, with their boundaries, in (stream, partition)
    order."""

    boundaries: Boundaries
    added: tuple[Offset, ...]


def grow(stored: Boundaries, requested: Iterable[Offset], mark_id: str) -> Growth | None:
    """``stored`` with the partitions of ``requested`` it does not name added (each partition's
    first boundary wins: a partition already marked keeps its own); None when it names them all."""
    added = tuple(sorted(o for o in requested if stored.index_of(o.stream, o.partition) is None))
    if not added:
        return None
    items = tuple(sorted(itertools.chain(stored.items, added)))
    return Growth(Boundaries(stored.job_id, mark_id, items), added)


def carry_progress(
    old: Boundaries,
    old_shards: Mapping[int, ShardProgress],
    old_shard_size: int,
    new: Boundaries,
    shard_size: int,
) -> tuple[ShardProgress, ...]:
    """The progress of ``old`` (its shards, all of them) re-indexed for ``new``, a grown mark
    naming every partition of ``old``: each position and report tag moves to the partition's index
    in ``new``; the added partitions start with none."""
    positions: list[int | None] = [None] * len(new.items)
    tags: dict[int, str] = {}
    for shard, progress in old_shards.items():
        start = shard * old_shard_size
        for local, position in enumerate(progress.positions):
            if position is None and local not in progress.finished_by:
                continue
            o = old.items[start + local]
            i = new.index_of(o.stream, o.partition)
            if i is None:
                raise ValueError(f"{o.stream}/{o.partition} of the old mark is missing from the grown one")
            positions[i] = position
            if local in progress.finished_by:
                tags[i] = progress.finished_by[local]
    shards: list[ShardProgress] = []
    for start in range(0, len(new.items), shard_size):
        stop = min(start + shard_size, len(new.items))
        shards.append(
            ShardProgress(
                tuple(positions[start:stop]),
                {i - start: tag for i, tag in tags.items() if start <= i < stop},
            )
        )
    return tuple(shards)


@dataclass(frozen=True)
class Positions:
    """Reported positions as three parallel columns, in request order: the form a report is read
    into straight from its request, with no object per partition (a driver reports every
    partition on every batch, so per-partition work is most of a report's CPU)."""

    streams: Sequence[str]
    partitions: Sequence[int]
    offsets: Sequence[int]

    @classmethod
    def of(cls, items: Iterable[Offset]) -> Positions:
        listed = tuple(items)
        streams = tuple(o.stream for o in listed)
        return cls(streams, tuple(o.partition for o in listed), tuple(o.offset for o in listed))

    def __len__(self) -> int:
        return len(self.streams)

    def items(self) -> tuple[Offset, ...]:
        return tuple(
            Offset(s, p, o) for s, p, o in zip(self.streams, self.partitions, self.offsets, strict=True)
        )


@dataclass(frozen=True)
class ShardProgress:
    """The progress of one shard's partitions (by index within the shard)."""

    #: One per partition of the shard: the highest reported position, None when none was reported.
    positions: tuple[int | None, ...]
    #: Index within the shard -> id of the report whose write finished the partition.
    finished_by: Mapping[int, str] = field(default_factory=dict)


def empty_shard(size: int) -> ShardProgress:
    return ShardProgress(positions=(None,) * size, finished_by={})


def is_finished(boundary: int, position: int | None) -> bool:
    """Finished by the mark (boundary 0 or -1: nothing to catch up) or by a reported position."""
    return boundary <= 0 or (position is not None and position >= boundary)


def remaining(shard: ShardProgress, boundaries: Sequence[int]) -> int:
    """How many partitions of the shard are still behind their boundary (``not is_finished``,
    inlined: this runs over whole shards on every report)."""
    return sum(1 for b, p in zip(boundaries, shard.positions, strict=True) if b > 0 and (p is None or p < b))


def apply_positions(
    shard: ShardProgress, boundaries: Sequence[int], updates: Mapping[int, int], report_id: str
) -> ShardProgress | None:
    """Merge reported positions into ``shard`` (each only forward) and tag with ``report_id`` the
    partitions this merge finishes; None when nothing would change (the write can be skipped)."""
    positions = list(shard.positions)
    finished_by = dict(shard.finished_by)
    changed = False
    for local, position in updates.items():
        before = positions[local]
        if before is not None and position <= before:
            continue  # out of order or repeated: positions never move back
        positions[local] = position
        changed = True
        boundary = boundaries[local]
        # Finished by this merge: behind before (not is_finished), at or past it now.
        if boundary > 0 and (before is None or before < boundary) and position >= boundary:
            finished_by[local] = report_id
    return ShardProgress(tuple(positions), finished_by) if changed else None


@dataclass(frozen=True)
class PartitionBacklog:
    stream: str
    partition: int
    boundary: int
    position: int
    finished: bool


@dataclass(frozen=True)
class BacklogStatus:
    job_id: str
    #: True while any marked partition is behind its boundary.
    processing_backlog: bool
    partitions: tuple[PartitionBacklog, ...]
    #: MarkBacklog only: the partitions this call added to a stored mark, with their boundaries,
    #: in (stream, partition) order (empty for a first mark, a reset, or a mark naming nothing new).
    added: tuple[Offset, ...] = ()
    #: How many partitions reports named that the mark does not (at most ``max_partitions``).
    unmarked_partitions: int = 0


@dataclass(frozen=True)
class Progress:
    """What a report returns: the partitions it finished, and whether the job is still behind.

    No per-partition status: a report's answer grows with what changed, not with what it carried
    (a driver reports every partition each batch; echoing 10,000 partition states would cost
    ~2.4 MB a call and, with newly_finished, could pass gRPC's 4 MB default). GetBacklogStatus
    lists the partitions.
    """

    job_id: str
    #: Each with the position that finished it, in (stream, partition) order.
    newly_finished: tuple[Offset, ...]
    #: True while any marked partition of the job is behind its boundary.
    processing_backlog: bool
    #: The reported positions of partitions the mark does not name, in (stream, partition) order:
    #: not backlog, not stored; the driver marks them (MarkBacklog adds them to the mark).
    unmarked: tuple[Offset, ...] = ()


def partition_backlog(boundary: Offset, position: int | None) -> PartitionBacklog:
    return PartitionBacklog(
        stream=boundary.stream,
        partition=boundary.partition,
        boundary=boundary.offset,
        position=NO_POSITION if position is None else position,
        finished=is_finished(boundary.offset, position),
    )


def _check_count(field_name: str, count: int, policy: BacklogPolicy) -> None:
    if count > policy.max_partitions:
        raise InvalidArgument(
            f"{field_name} has {count} entries; this coordinator tracks at most "
            f"{policy.max_partitions} partitions per job (--backlog-max-partitions)"
        )


def validate_mark(job_id: str, boundaries: Iterable[Offset], policy: BacklogPolicy) -> tuple[Offset, ...]:
    """Check a mark request; return the boundaries sorted by (stream, partition)."""
    require_id("job_id", job_id)
    items = tuple(boundaries)
    _check_count("boundaries", len(items), policy)
    return tuple(sorted(validate_offsets(items, field="boundaries", max_count=policy.max_partitions)))


def validate_report(job_id: str, positions: Positions, policy: BacklogPolicy) -> Positions:
    """Check a progress report (the rules of ``validate_offsets``); return its positions.

    Whole columns at a time, in C, and each distinct stream name once (a report usually names a
    few streams for many partitions); only a report that fails them goes through
    ``validate_offsets``, item by item, for the message naming the first bad item."""
    require_id("job_id", job_id)
    count = len(positions)
    if not count:
        raise InvalidArgument(
            "positions is empty: give at least one (stream, partition, offset); "
            "GetBacklogStatus reads the status without reporting"
        )
    _check_count("positions", count, policy)
    streams, partitions = positions.streams, positions.partitions
    if not (
        min(partitions) >= 0
        and max(partitions) <= MAX_PARTITION
        and min(positions.offsets) >= NO_DATA
        and all(map(is_valid_id, set(streams)))
        and len(set(zip(streams, partitions, strict=True))) == count
    ):
        validate_offsets(positions.items(), field="positions", max_count=policy.max_partitions)
    return positions


def check_growth(job_id: str, marked: int, added: int, policy: BacklogPolicy) -> None:
    """Refuse a grown mark over ``max_partitions`` (nothing is stored: the check comes first)."""
    if marked + added > policy.max_partitions:
        raise InvalidArgument(
            f"adding {added} partitions to the backlog mark of job_id {job_id!r} ({marked} marked) "
            f"would track {marked + added}; this coordinator tracks at most {policy.max_partitions} "
            "partitions per job (--backlog-max-partitions): raise the limit, or mark again with "
            "reset=true naming fewer partitions",
            reason=Reason.TOO_LARGE,
            metadata={"field": "boundaries", "limit": policy.max_partitions},
        )


def unmarked_tag(stream: str, partition: int) -> str:
    """How the mark's unmarked set names a partition: 16 hex characters whatever the stream
    name's length (a stream name never holds ``/``), so the set's node stays bounded."""
    return hashlib.sha256(f"{stream}/{partition}".encode()).hexdigest()[:16]


def add_unmarked(stored: frozenset[str], tags: Iterable[str], limit: int) -> frozenset[str]:
    """``stored`` with ``tags`` added, up to ``limit`` tags in all (the smallest new ones first,
    so that every replica adds the same)."""
    new = sorted(set(tags) - stored)[: max(0, limit - len(stored))]
    return stored | frozenset(new) if new else stored


def boundaries_digest(payload: bytes) -> str:
    """The digest a job record keeps of its boundaries object: SHA-256, hex."""
    return hashlib.sha256(payload).hexdigest()


def new_mark_id() -> str:
    return uuid.uuid4().hex


def new_report_id() -> str:
    """A tag for the partitions one report finishes: 64 random bits, unique enough among the
    reports that can race on one shard."""
    return os.urandom(8).hex()


#: Longest client-supplied report id: the stored tag is its hash, so this only bounds the request.
MAX_REPORT_ID_LENGTH = 128


def report_tag(report_id: str) -> str:
    """The tag a report stores on the partitions it finishes: 16 hex characters, like
    ``new_report_id``, whatever the id's length (a shard's size stays bounded, docs in ``SHARD_SIZE``).
    A client-supplied id gives the same tag on every retry; an empty one gives a fresh tag."""
    if not report_id:
        return new_report_id()
    return hashlib.sha256(report_id.encode()).hexdigest()[:16]


def validate_report_id(report_id: str) -> str:
    """Empty (the coordinator makes one), or 1-128 characters of ``[A-Za-z0-9._:-]``. It is only
    ever hashed (``report_tag``), never a path or key segment, so ``.`` and ``..`` are ids too."""
    if not report_id or report_id in (".", ".."):
        return report_id
    if len(report_id) > MAX_REPORT_ID_LENGTH:
        raise InvalidArgument(
            f"report_id is {len(report_id)} characters long; the limit is {MAX_REPORT_ID_LENGTH}"
        )
    return require_id("report_id", report_id)


def boundaries_key(job_id: str, mark_id: str) -> str:
    return f"{OBJECT_PREFIX}{job_id}/{mark_id}.json"


def job_of_object(key: str) -> str | None:
    """The job id of a boundaries key ``backlog/<job_id>/<mark_id>.json``; None for other keys."""
    parts = key.split("/")
    ok = len(parts) == 3 and parts[0] + "/" == OBJECT_PREFIX and parts[2].endswith(".json")
    return parts[1] if ok else None
