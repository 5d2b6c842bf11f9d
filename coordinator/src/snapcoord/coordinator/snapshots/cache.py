"""GetCurrentSnapshot(consistent=false) from memory, kept fresh by metadata watches."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from snapcoord.coordinator.domain.snapshots import Snapshot
from snapcoord.coordinator.snapshots.layout import app_path, gen_path
from snapcoord.coordinator.storage.metadata import MetadataStore


class CurrentSnapshotCache:
    """The current snapshot of recently asked apps.

    An entry watches the app's pointer and the current header. Watches are set before the reads
    they guard, and any callback (a change, or a reconnect after which events may have been
    missed) drops the entry; a read raced by a callback is returned but not cached.
    """

    def __init__(self, metadata: MetadataStore, load: Callable[[str], Snapshot], *, max_apps: int) -> None:
        self._metadata = metadata
        self._load = load
        self._max_apps = max_apps
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _CacheEntry] = OrderedDict()

    def get(self, app_id: str) -> Snapshot:
        with self._lock:
            entry = self._entries.get(app_id)
            if entry is not None and entry.snapshot is not None:
                self._entries.move_to_end(app_id)
                return entry.snapshot
            entry = _CacheEntry()
            old = self._entries.pop(app_id, None)
            self._entries[app_id] = entry
        if old is not None:
            old.cancel()
        entry.cancels.append(
            self._metadata.watch(app_path(app_id), lambda _p: self._invalidate(app_id, entry))
        )
        snapshot = self._load(app_id)
        if snapshot.record.generation:
            path = gen_path(app_id, snapshot.record.generation)
            entry.cancels.append(self._metadata.watch(path, lambda _p: self._invalidate(app_id, entry)))
            snapshot = self._load(app_id)  # re-read under the header watch
        evicted: list[_CacheEntry] = []
        with self._lock:
            if self._entries.get(app_id) is entry and entry.valid:
                entry.snapshot = snapshot
                while len(self._entries) > self._max_apps:
                    evicted.append(self._entries.popitem(last=False)[1])
        for item in evicted:
            item.cancel()
        return snapshot

    def _invalidate(self, app_id: str, entry: _CacheEntry) -> None:
        with self._lock:
            entry.valid = False
            if self._entries.get(app_id) is entry:
                del self._entries[app_id]
        entry.cancel()


class _CacheEntry:
    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.valid = True
        self.cancels: list[Callable[[], None]] = []

    def cancel(self) -> None:
        for cancel in self.cancels:
            cancel()
