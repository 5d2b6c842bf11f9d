"""A time-bucketed index in the metadata store, so janitor passes read only what is due.

Entries live at ``<root>/<minute>/<name>``: the minute in which they fall due, and a name that
identifies what is due. Writers add and remove entries in the same transaction as the records
they index (``entry`` gives the path; ``prepare`` makes sure the bucket exists first, since a
transaction never creates parents). A pass walks the buckets up to the current minute, so its
cost follows the number of due entries plus the number of buckets, never the number of records.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from snapcoord.coordinator.errors import NoNodeError, NotEmptyError

if TYPE_CHECKING:  # the path arithmetic below is pure: decide modules use it without any I/O
    from snapcoord.coordinator.storage.metadata import MetadataStore

BUCKET_MS = 60_000


def bucket_of(due_ms: int) -> int:
    return due_ms // BUCKET_MS


def entry_path(root: str, due_ms: int, name: str) -> str:
    """The path of entry ``name`` falling due at ``due_ms`` in the index under ``root``."""
    return f"{root}/{bucket_of(due_ms)}/{name}"


class ExpiryIndex:
    """One index under ``root``; cheap to keep per registry (it caches which buckets exist)."""

    def __init__(self, metadata: MetadataStore, root: str) -> None:
        self._metadata = metadata
        self._root = root
        # Buckets known to exist, to save a round trip per write. A bucket removed meanwhile makes
        # the writer's transaction fail with NoNode on the entry: ``forget`` it and retry.
        self._known: set[int] = set()

    def entry(self, due_ms: int, name: str) -> str:
        """The path of entry ``name`` falling due at ``due_ms``."""
        return entry_path(self._root, due_ms, name)

    def prepare(self, due_ms: int) -> None:
        """Make sure the bucket of ``due_ms`` exists before a transaction creates an entry in it."""
        bucket = bucket_of(due_ms)
        if bucket not in self._known:
            self._metadata.ensure_path(f"{self._root}/{bucket}")
            self._known.add(bucket)

    def known(self, due_ms: int) -> bool:
        """True when the bucket of ``due_ms`` is known to exist (``prepare`` made or found it)."""
        return bucket_of(due_ms) in self._known

    def forget(self, due_ms: int) -> None:
        """Drop a bucket from the cache after a transaction met NoNode on one of its entries."""
        self._known.discard(bucket_of(due_ms))

    def due(self, now_ms: int) -> Iterator[tuple[str, str]]:
        """(path, name) of every entry in the buckets up to ``now_ms``'s minute, oldest first.

        Entries of the current minute may not be due yet: callers check the record. Past buckets
        that are empty once the caller has consumed them are removed (nothing new falls due in
        the past; a writer on a replica with a lagging clock that races this retries on NoNode).
        """
        now_bucket = bucket_of(now_ms)
        buckets = sorted(int(b) for b in self._metadata.children(self._root) if b.isdigit())
        for bucket in buckets:
            if bucket > now_bucket:
                return
            path = f"{self._root}/{bucket}"
            for name in self._metadata.children(path):
                yield f"{path}/{name}", name
            if bucket < now_bucket:
                with contextlib.suppress(NotEmptyError, NoNodeError):
                    self._metadata.delete(path)
                self._known.discard(bucket)

    def remove(self, path: str) -> None:
        """Delete one entry; already gone is fine."""
        with contextlib.suppress(NoNodeError):
            self._metadata.delete(path)
