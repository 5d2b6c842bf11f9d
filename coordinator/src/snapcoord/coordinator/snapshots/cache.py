"""GetCurrentSnapshot(consistent=false) from memory, kept fresh by metadata watches."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from snapcoord.coordinator.domain.snapshots import Snapshot
from snapcoord.coordinator.snapshots.layout import app_path, gen_path
from snapcoord.coordinator.storage.metadata import MetadataStore

_log = logging.getLogger(__name__)


class CurrentSnapshotCache:
    """The current snapshot of recently asked apps.

    An entry watches the app's pointer and the current header. Watches are set before the reads
    they guard. A change reloads the entry in the background (one refresher thread) while reads
    keep being served the snapshot it replaces: while an app is being snapshotted, every report
    changes its header, and dropping the entry on each would make cached reads slower than
    consistent ones. A reload that fails, or a reconnect after which events may have been missed,
    drops the entry; the next read loads it again.
    """

    def __init__(self, metadata: MetadataStore, load: Callable[[str], Snapshot], *, max_apps: int) -> None:
        self._metadata = metadata
        self._load = load
        self._max_apps = max_apps
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _CacheEntry] = OrderedDict()
        self._due: OrderedDict[str, _CacheEntry] = OrderedDict()  # entries to reload, in order
        self._wake = threading.Condition(self._lock)
        self._refresher: threading.Thread | None = None

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
        entry.app_cancel = self._metadata.watch(app_path(app_id), lambda _p: self._changed(app_id, entry))
        snapshot = self._load(app_id)
        if snapshot.record.generation:
            self._watch_header(app_id, entry, snapshot.record.generation)
            snapshot = self._load(app_id)  # re-read under the header watch
        evicted: list[_CacheEntry] = []
        with self._lock:
            if self._entries.get(app_id) is entry and entry.valid:
                # A change seen meanwhile queued a reload, which may already have stored a
                # snapshot at least as new as this one (it read after the change).
                if entry.snapshot is None:
                    entry.snapshot = snapshot
                while len(self._entries) > self._max_apps:
                    evicted.append(self._entries.popitem(last=False)[1])
        for item in evicted:
            item.cancel()
        return snapshot

    def _watch_header(self, app_id: str, entry: _CacheEntry, generation: int) -> bool:
        """Watch the header of ``generation`` instead of the previous one; True if it is new."""
        with entry.watch_lock:  # get() and the refresher may both move it
            if entry.header == generation:
                return False
            cancel = self._metadata.watch(
                gen_path(app_id, generation), lambda _p: self._changed(app_id, entry)
            )
            previous, entry.header, entry.header_cancel = entry.header_cancel, generation, cancel
        if previous is not None:
            previous()
        return True

    def _changed(self, app_id: str, entry: _CacheEntry) -> None:
        """A watch fired (a change, or a reconnect): queue a reload of the entry."""
        with self._lock:
            if not entry.valid or self._entries.get(app_id) is not entry:
                return
            entry.changes += 1
            self._due[app_id] = entry
            if self._refresher is None or not self._refresher.is_alive():
                self._refresher = threading.Thread(
                    target=self._refresh_loop, name="snapshot-cache-refresh", daemon=True
                )
                self._refresher.start()
            self._wake.notify()

    def _refresh_loop(self) -> None:
        while True:
            with self._lock:
                if not self._wake.wait_for(lambda: bool(self._due), timeout=30):
                    self._refresher = None  # idle: the next change starts a new thread
                    return
                app_id, entry = self._due.popitem(last=False)
                seen = entry.changes
            try:
                snapshot = self._load(app_id)
                # A new generation: watch its header, then read again so that a change made
                # between the load and the watch is not missed.
                generation = snapshot.record.generation
                if generation and self._watch_header(app_id, entry, generation):
                    snapshot = self._load(app_id)
            except Exception as e:  # the store is down or closed: fall back to reading on demand
                _log.debug("could not reload the cached snapshot of %s: %s", app_id, e)
                self._drop(app_id, entry)
                continue
            with self._lock:
                if entry.valid and self._entries.get(app_id) is entry:
                    entry.snapshot = snapshot
                    if entry.changes != seen and app_id not in self._due:
                        self._due[app_id] = entry  # changed again while we read: read again

    def _drop(self, app_id: str, entry: _CacheEntry) -> None:
        with self._lock:
            entry.valid = False
            if self._entries.get(app_id) is entry:
                del self._entries[app_id]
            self._due.pop(app_id, None)
        entry.cancel()


class _CacheEntry:
    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.valid = True
        self.changes = 0
        self.watch_lock = threading.Lock()
        self.header = 0  # the generation whose header is watched (0: none)
        self.header_cancel: Callable[[], None] | None = None
        self.app_cancel: Callable[[], None] | None = None

    def cancel(self) -> None:
        with self.watch_lock:
            cancels = [c for c in (self.app_cancel, self.header_cancel) if c is not None]
            self.app_cancel = self.header_cancel = None
        for cancel in cancels:
            cancel()
