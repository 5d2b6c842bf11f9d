"""What a replica keeps of backlogs in memory: boundaries by mark id (they never change, so a
report reads no S3) and its copy of each job record (so a report reads no record first)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from snapcoord.coordinator.domain.backlog import Boundaries, JobRecord

#: Boundaries kept in memory, counted in partitions (~200 bytes each with the index).
CACHE_PARTITIONS = 200_000

#: Job records kept in memory (least recently used go first): a few hundred bytes each.
JOB_COPIES = 10_000


class BoundariesCache:
    """An LRU of boundaries bounded by their total partition count (at least one entry stays)."""

    def __init__(self, max_partitions: int = CACHE_PARTITIONS) -> None:
        self._max_partitions = max_partitions
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Boundaries] = OrderedDict()
        self._partitions = 0

    def get(self, mark_id: str) -> Boundaries | None:
        with self._lock:
            cached = self._entries.get(mark_id)
            if cached is not None:
                self._entries.move_to_end(mark_id)
            return cached

    def remember(self, boundaries: Boundaries) -> None:
        with self._lock:
            if boundaries.mark_id in self._entries:
                return
            self._entries[boundaries.mark_id] = boundaries
            self._partitions += len(boundaries.items)
            while self._partitions > self._max_partitions and len(self._entries) > 1:
                _, evicted = self._entries.popitem(last=False)
                self._partitions -= len(evicted.items)

    def forget(self, mark_id: str) -> None:
        with self._lock:
            evicted = self._entries.pop(mark_id, None)
            if evicted is not None:
                self._partitions -= len(evicted.items)


class JobCopies:
    """job id -> the job record this process last read or wrote (thread-safe, bounded).

    A copy is only a guess at the current mark, never trusted on its own: a record never changes
    within a mark (a reset writes a new mark id), and every progress node carries its mark id in
    its name and goes in the same transaction as the record that names it. So reading a copy's
    shards proves its mark current, and a stale copy finds them gone (``MarkGone``): the caller
    then reads the record. ZooKeeper versions play no part (they restart when a job is cleared
    and marked again; mark ids are UUIDs and never come back)."""

    def __init__(self, capacity: int = JOB_COPIES) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._records: OrderedDict[str, JobRecord] = OrderedDict()

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            record = self._records.get(job_id)
            if record is not None:
                self._records.move_to_end(job_id)
            return record

    def remember(self, record: JobRecord) -> None:
        # Two calls on one job may finish out of order and leave the older mark here: harmless
        # (its shards are gone, so the next call reads the record), one round trip more.
        with self._lock:
            self._records[record.job_id] = record
            self._records.move_to_end(record.job_id)
            while len(self._records) > self._capacity:
                self._records.popitem(last=False)

    def forget(self, job_id: str, mark_id: str | None = None) -> None:
        """Drop the copy of ``job_id`` (only if it is of ``mark_id``, when given: a newer copy
        another call remembered meanwhile stays)."""
        with self._lock:
            record = self._records.get(job_id)
            if record is not None and (mark_id is None or record.mark_id == mark_id):
                del self._records[job_id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)
