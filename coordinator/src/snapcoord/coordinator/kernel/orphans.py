"""The orphan sweep shared by every capability that stores payloads.

Payloads are written before the metadata that references them, so a crash in between leaves an
object no record points at. The sweep deletes such objects once they are older than a grace
period (an upload younger than that may belong to a commit still in flight), never one a record
references, nor one whose record cannot be decoded (what it references is unknown: it keeps
everything until it is repaired).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import TypeVar

from snapcoord.coordinator.errors import CorruptRecord
from snapcoord.coordinator.storage.blobs import BlobStore

Owner = TypeVar("Owner", bound=Hashable)


def sweep_unreferenced(
    blobs: BlobStore,
    prefix: str,
    *,
    modified_before_ms: int,
    limit: int,
    owner_of: Callable[[str], Owner | None],
    referenced_by: Callable[[Owner], Collection[str]],
    announced: Callable[[], Collection[str]],
    corrupt: Callable[[CorruptRecord], None],
) -> int:
    """Delete up to ``limit`` objects under ``prefix`` older than the cutoff that their owner's
    record does not reference; returns how many went.

    ``owner_of(key)`` names the record an object belongs to (None: not ours to judge, keep it);
    ``referenced_by(owner)`` reads that record once per sweep and returns the keys it points at.
    ``announced()``: the keys live upload intents name (read before the listing: an object older
    than the grace had its intent made before it was put, so an intent not seen then was retired
    before the listing: committed, the reference check after it sees the record; or given up, the
    object with it), which are not committed *yet* and so are never this sweep's to delete.
    ``corrupt(error)`` is told of a record that cannot be decoded: an owner's (its objects are
    kept) or an intent's (any object may be one it names, so the sweep deletes nothing).
    """
    try:
        keep = announced()
    except CorruptRecord as e:
        corrupt(e)
        return 0
    deleted = 0
    references: dict[Owner, Collection[str] | None] = {}  # None: undecodable, keep everything
    for info in blobs.list(prefix, modified_before_ms=modified_before_ms):
        if deleted >= limit:
            break
        owner = owner_of(info.key)
        if owner is None or info.key in keep:
            continue
        if owner not in references:
            try:
                references[owner] = referenced_by(owner)
            except CorruptRecord as e:
                corrupt(e)
                references[owner] = None
        keys = references[owner]
        if keys is not None and info.key not in keys:
            blobs.delete(info.key)
            deleted += 1
    return deleted
