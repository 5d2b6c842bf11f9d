"""What a replica keeps of backlogs in memory: boundaries by mark id (they never change, so a
report reads no S3), its copy of each job record (so a report reads no record first) and of each
progress shard it last read or wrote (so a report reads no shard first)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from snapcoord.coordinator.domain.backlog import Boundaries, JobRecord
from snapcoord.coordinator.domain.lru import Lru

if TYPE_CHECKING:
    from snapcoord.coordinator.backlog.decide import StoredShard

#: Boundaries kept in memory, counted in partitions (~200 bytes each with the index).
CACHE_PARTITIONS = 200_000

#: Job records kept in memory (least recently used go first): a few hundred bytes each.
JOB_COPIES = 10_000

#: Shard copies kept in memory, counted in partitions (~100 bytes each: a position and a tag).
SHARD_PARTITIONS = 200_000


class BoundariesCache:
    """An LRU of boundaries bounded by their total partition count (at least one entry stays)."""

    def __init__(self, max_partitions: int = CACHE_PARTITIONS) -> None:
        self._entries: Lru[str, Boundaries] = Lru(max_partitions)

    def get(self, mark_id: str) -> Boundaries | None:
        return self._entries.get(mark_id)

    def remember(self, boundaries: Boundaries) -> None:
        self._entries.put(boundaries.mark_id, boundaries, len(boundaries.items))

    def forget(self, mark_id: str) -> None:
        self._entries.pop(mark_id)


class JobCopies:
    """job id -> the job record this process last read or wrote (thread-safe, bounded).

    A copy is only a guess at the current mark, never trusted on its own: a record never changes
    within a mark (a reset or a grow writes a new mark id), and every progress node carries its mark id in
    its name and goes in the same transaction as the record that names it. So reading a copy's
    shards proves its mark current, and a stale copy finds them gone (``MarkGone``): the caller
    then reads the record. ZooKeeper versions play no part (they restart when a job is cleared
    and marked again; mark ids are UUIDs and never come back)."""

    def __init__(self, capacity: int = JOB_COPIES) -> None:
        self._records: Lru[str, JobRecord] = Lru(capacity)

    def get(self, job_id: str) -> JobRecord | None:
        return self._records.get(job_id)

    def remember(self, record: JobRecord) -> None:
        # Two calls on one job may finish out of order and leave the older mark here: harmless
        # (its shards are gone, so the next call reads the record), one round trip more.
        self._records.put(record.job_id, record)

    def forget(self, job_id: str, mark_id: str | None = None) -> None:
        """Drop the copy of ``job_id`` (only if it is of ``mark_id``, when given: a newer copy
        another call remembered meanwhile stays)."""
        self._records.pop(job_id, None if mark_id is None else lambda record: record.mark_id == mark_id)

    def __len__(self) -> int:
        return len(self._records)


class ShardCopies:
    """shard path -> the shard (with its ZooKeeper version) this process last read or wrote.

    A copy stands in for the read before a report's compare-and-set, which checks it: a copy that
    is behind (another reporter, another replica wrote since) fails the commit, and the kernel
    re-reads the shard and merges again, so a stale copy costs a retry and never writes a wrong
    shard. A shard path names its mark, and the shard goes with its mark's record, so a copy of a
    reset, grown or cleared mark fails its commit too (no node) and the re-read finds it gone
    (``MarkGone``). A report that would write nothing reads the shards instead (``decide``): its
    answer then rests on what is stored, as without copies."""

    def __init__(self, max_partitions: int = SHARD_PARTITIONS) -> None:
        self._shards: Lru[str, StoredShard] = Lru(max_partitions)

    def get(self, path: str) -> StoredShard | None:
        return self._shards.get(path)

    def remember(self, path: str, shard: StoredShard) -> None:
        # Two calls finishing out of order may race here and leave the older version: harmless
        # (the next commit from it fails and re-reads), so no lock beyond the map's own.
        known = self._shards.get(path)
        if known is None or known.version < shard.version:
            self._shards.put(path, shard, len(shard.progress.positions))

    def __len__(self) -> int:
        return len(self._shards)
