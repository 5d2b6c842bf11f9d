"""Boundaries in memory, by mark id: they never change, so a report reads no S3."""

from __future__ import annotations

import threading
from collections import OrderedDict

from snapcoord.coordinator.domain.backlog import Boundaries

#: Boundaries kept in memory, counted in partitions (~200 bytes each with the index).
CACHE_PARTITIONS = 200_000


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
