"""One bounded, thread-safe LRU map for every in-memory copy the coordinator keeps (record copies,
job records, boundaries, generations last seen, coding memos): each differs only in what it keys,
what it weighs and what it may drop, so the eviction and locking live here once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """Key -> value, least recently used dropped first once the weights add up to more than
    ``max_weight`` (each entry weighs 1 unless ``put`` says otherwise); the newest entry always
    stays, however heavy."""

    def __init__(self, max_weight: int) -> None:
        self._max_weight = max_weight
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V, weight: int = 1) -> None:
        """Keep ``value`` under ``key`` (replacing what was there) as the most recently used."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._entries[key] = (value, weight)
            self._weight += weight
            while self._weight > self._max_weight and len(self._entries) > 1:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._weight -= dropped

    def pop(self, key: K, only_if: Callable[[V], bool] | None = None) -> V | None:
        """Drop ``key`` (only when ``only_if(value)`` holds, if given); returns what was dropped."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or (only_if is not None and not only_if(entry[0])):
                return None
            del self._entries[key]
            self._weight -= entry[1]
            return entry[0]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
