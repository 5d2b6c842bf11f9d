"""GetCurrentSnapshot(consistent=false) from memory, kept fresh by metadata watches."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from snapcoord.coordinator.domain.snapshots import Snapshot
from snapcoord.coordinator.snapshots.decide import current_generation
from snapcoord.coordinator.snapshots.layout import app_path, gen_path
from snapcoord.coordinator.storage.metadata import MetadataStore, Node

_log = logging.getLogger(__name__)


#: Builds the snapshot answered for an app from its current generation (0: none) and that
#: generation's header node (None when absent); it may remember the generation (``Guess``).
Present = Callable[[str, int, Node | None], Snapshot]
#: The app's current generation as last seen (0: unknown): read together with the pointer, its
#: header costs no round trip of its own when the guess is right.
Guess = Callable[[str], int]


class CurrentSnapshotCache:
    """The current snapshot of recently asked apps.

    An entry watches the app's pointer and the current header. Watches are set before the reads
    they guard, in the same round trip (``watch_and_get_many``): a cold read whose generation is
    known (``guess``) is one round of overlapped requests, an app never seen two (the pointer
    names the header to read). A change reloads the entry in the background (one refresher
    thread, one round per reload) while reads keep being served the snapshot it replaces: while
    an app is being snapshotted, every report changes its header, and dropping the entry on each
    would make cached reads slower than consistent ones. A reload that fails, or a reconnect
    after which events may have been missed, drops the entry; the next read loads it again.

    Entries are only as fresh as the watches that feed them, and no watch fires while the store
    is disconnected: a partition can last for hours while other replicas move the app on. So the
    moment the store stops being usable every entry is dropped, and no entry is served while it
    is unusable: a read then goes to the store, which answers or fails (UNAVAILABLE), never old
    data.
    """

    def __init__(self, metadata: MetadataStore, present: Present, guess: Guess, *, max_apps: int) -> None:
        self._metadata = metadata
        self._present = present
        self._guess = guess
        self._max_apps = max_apps
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _CacheEntry] = OrderedDict()
        self._due: OrderedDict[str, _CacheEntry] = OrderedDict()  # entries to reload, in order
        self._wake = threading.Condition(self._lock)
        self._refresher: threading.Thread | None = None
        metadata.add_state_listener(self._on_usable)

    def _on_usable(self, usable: bool) -> None:
        """The store's state listener: unusable drops every entry (their watches went silent)."""
        if not usable:
            self.clear()

    def clear(self) -> None:
        """Drop every entry and cancel its watches; the next read of each app loads it again."""
        with self._lock:
            entries = list(self._entries.values())
            for entry in entries:
                entry.valid = False
            self._entries.clear()
            self._due.clear()
        for entry in entries:
            entry.cancel()

    def get(self, app_id: str) -> Snapshot:
        if not self._metadata.is_usable():
            # Before the state listener has run (it runs on the store's event thread).
            self.clear()
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
        snapshot = self._fetch(app_id, entry, self._guess(app_id), watch_app=True)
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

    def _fetch(self, app_id: str, entry: _CacheEntry, guess: int, *, watch_app: bool) -> Snapshot:
        """Read the pointer and the header of ``guess`` under watches, in one round trip (arming
        the pointer's watch with ``watch_app``, and the header's unless it is already watched);
        when the pointer names another generation, watch and read its header in a second."""

        def changed(_path: str) -> None:
            self._changed(app_id, entry)

        pointer = app_path(app_id)
        header = gen_path(app_id, guess) if guess else ""
        watches = [pointer] if watch_app else []
        if guess and entry.header != guess:
            watches.append(header)
        cancels, nodes = self._metadata.watch_and_get_many(
            [(p, changed) for p in watches], [pointer, header] if guess else [pointer]
        )
        if watch_app:
            entry.set_app_watch(cancels[0])
        if header in watches:
            entry.set_header_watch(guess, cancels[-1])
        current = current_generation(nodes[pointer])
        if current and current != guess:
            header = gen_path(app_id, current)
            new = entry.header != current
            cancels, nodes = self._metadata.watch_and_get_many([(header, changed)] if new else [], [header])
            if new:
                entry.set_header_watch(current, cancels[0])
        return self._present(app_id, current, nodes[header] if current else None)

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
                snapshot = self._fetch(app_id, entry, entry.header, watch_app=False)
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

    def set_app_watch(self, cancel: Callable[[], None]) -> None:
        with self.watch_lock:
            stale = not self.valid
            if not stale:
                self.app_cancel = cancel
        if stale:  # cancelled while the watch was being armed
            cancel()

    def set_header_watch(self, generation: int, cancel: Callable[[], None]) -> None:
        """Watch the header of ``generation`` instead of the previous one (``get()`` and the
        refresher may both move it; a watch armed twice keeps one)."""
        with self.watch_lock:
            if not self.valid or self.header == generation:
                previous: Callable[[], None] | None = cancel
            else:
                previous, self.header, self.header_cancel = self.header_cancel, generation, cancel
        if previous is not None:
            previous()

    def cancel(self) -> None:
        with self.watch_lock:
            self.valid = False
            cancels = [c for c in (self.app_cancel, self.header_cancel) if c is not None]
            self.app_cancel = self.header_cancel = None
        for cancel in cancels:
            cancel()
