"""The orphan sweep shared by every capability that stores payloads.

Payloads are written before the metadata that references them, so a crash in between leaves an
object no record points at. The sweep deletes such objects once they are older than a grace
period (an upload younger than that may belong to a commit still in flight), never one a record
references.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import TypeVar

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
    announced: Collection[str] = frozenset(),
) -> int:
    """Delete up to ``limit`` objects under ``prefix`` older than the cutoff that their owner's
    record does not reference; returns how many went.

    ``owner_of(key)`` names the record an object belongs to (None: not ours to judge, keep it);
    ``referenced_by(owner)`` reads that record once per sweep and returns the keys it points at.
    ``announced``: keys a live upload intent names (read before the listing), which are not
    committed *yet* and so are never this sweep's to delete.
    """
    deleted = 0
    references: dict[Owner, Collection[str]] = {}
    for info in blobs.list(prefix, modified_before_ms=modified_before_ms):
        if deleted >= limit:
            break
        owner = owner_of(info.key)
        if owner is None or info.key in announced:
            continue
        if owner not in references:
            references[owner] = referenced_by(owner)
        if info.key not in references[owner]:
            blobs.delete(info.key)
            deleted += 1
    return deleted
