"""One lock per key, held only while a thread holds or waits for it.

Concurrent calls of one process on the same record (ReportProgress of one job from several driver
threads) would each commit on the same copy: all but one transaction fail on the version check,
and the losers read, decide and commit again, each loss a ZooKeeper request and its CPU. Taken in
turn, each call commits on the copy the last one left, at one transaction each. Calls on other
keys never wait; the map holds only the keys in use, so it does not grow with the records seen.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: Threads holding or waiting for ``lock``.
        self.users = 0


class KeyedLocks:
    """``hold(key)``: the key's lock for the ``with`` block (thread-safe; not re-entrant)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Hashable, _Entry] = {}

    @contextlib.contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = _Entry()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._lock:
                entry.users -= 1
                if entry.users == 0:
                    del self._held[key]

    def __len__(self) -> int:
        """Keys in use (held or waited for)."""
        with self._lock:
            return len(self._held)
