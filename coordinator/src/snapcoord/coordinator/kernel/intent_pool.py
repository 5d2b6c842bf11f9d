"""Upload intents made ahead of the calls that use them.

An object's intent must exist before its put (``intents``), and RegisterProducerOffsets has no read
its intent could ride with: made per call, the intent costs the call a ZooKeeper round trip of its
own, as many as its commit. So the pool makes intents for object keys it picks itself
(``<prefix><uuid>.json``), several in one transaction, and a call takes one: it puts its payload
under that key, and its commit retires that intent in the same transaction as the record, exactly as
it retires one made for the call. A call that finds the pool empty refills it, so it pays the round
trip it paid before; the others pay none.

Entries are handed out only while younger than ``max_age_ms``, a small part of the orphan grace: the
sweep claims intents older than the grace, and a call must have time to commit before that (if it
has not, its commit fails on the claim as any call's does, and the record is never written). Entries
that aged unused are deleted in the next refill's transaction. The batch follows demand: it doubles
when every entry of the last one was used, and halves when some aged out, so an idle server leaves
at most a few unused intents behind, which the sweep removes like a crashed call's.
"""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from snapcoord.coordinator.kernel.intents import IntentIndex

#: The most intents one refill makes (a transaction of about 230 bytes each, plus the deletes of
#: as many aged ones: far below ZooKeeper's request limit; ``zk_budget`` holds the exact figure).
MAX_BATCH = 32


@dataclass(frozen=True)
class Reserved:
    """An intent announcing ``key``, created before the object: put the payload there, and retire
    ``path`` in the commit that references it."""

    path: str
    key: str


@dataclass(frozen=True)
class _Entry:
    reserved: Reserved
    created_ms: int


class IntentPool:
    """Intents for keys under one prefix, made in batches and handed out one per call."""

    def __init__(
        self,
        index: IntentIndex,
        prefix: str,
        max_age_ms: int,
        now_ms: Callable[[], int],
    ) -> None:
        self._index = index
        self._prefix = prefix
        self._max_age_ms = max_age_ms
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._entries: collections.deque[_Entry] = collections.deque()
        self._aged: list[str] = []  # unused intents past max_age: deleted by the next refill
        self._batch = 1

    def take(self) -> Reserved:
        """A young intent of the pool, or the first of a new batch made now (one transaction)."""
        now = self._now_ms()
        with self._lock:
            while self._entries:
                entry = self._entries.popleft()
                if now - entry.created_ms < self._max_age_ms:
                    return entry.reserved
                self._aged.append(entry.reserved.path)
            if self._aged:
                self._batch = max(1, self._batch // 2)
            # At most a batch's worth per refill (its size is budgeted); the rest wait for the next.
            size = self._batch
            withdraw, self._aged = self._aged[:MAX_BATCH], self._aged[MAX_BATCH:]
        keys = [f"{self._prefix}{uuid.uuid4().hex}.json" for _ in range(size)]
        try:
            paths = self._index.announce_each(keys, now, withdraw)
        except Exception:
            with self._lock:  # not withdrawn: try again next time (or the sweep takes them)
                self._aged.extend(withdraw)
            raise
        made = [Reserved(path, key) for path, key in zip(paths, keys, strict=True)]
        with self._lock:
            if not withdraw:  # the last batch was used up before any of it aged: grow
                self._batch = min(MAX_BATCH, self._batch * 2)
            self._entries.extend(_Entry(r, now) for r in made[1:])
        return made[0]

    def drain(self) -> list[str]:
        """Empty the pool; returns the paths of its unused intents (for ``close`` to delete)."""
        with self._lock:
            paths = [*self._aged, *(e.reserved.path for e in self._entries)]
            self._entries.clear()
            self._aged = []
        return paths
