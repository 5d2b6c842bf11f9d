"""Pins: the contract between leases and snapshots, in one place.

``/snapshots/pins/<app>@<generation>`` is each pinned snapshot's reverse index: lease id -> the
lease's expiry when it pinned the snapshot. A lease changes the pin indexes of the snapshots it
adds or gives up in the same transaction as its record (and checks the snapshot header's version
when it pins one), so an index lists a lease exactly while that lease's record holds the
snapshot: only a release, a drop, a new term of an expired lease or the janitor's expiry take a
lease out, each in the transaction that rewrites or deletes its record.

A renewal does not touch the indexes (RenewLease is one write, of the record, and holders of
one snapshot never collide renewing). So the expiry an index shows is a lower bound while the
lease keeps the duration it pinned with: a holder whose listed expiry is still ahead (plus the
clock-skew margin) holds the snapshot with no further read, and only one whose listed expiry has
passed is looked up in its record (``to_confirm``). A snapshot deletion checks the pin index and
rewrites (same bytes, new version) the record of every holder it found dead in its own transaction
(``guard``): a check alone would let a renewal decided before it, at that record's version, still
commit after it. So of an acquire, or a renewal, racing a delete on one snapshot, exactly one
commits; never both. A holder renews only before its expiry (``Lease.is_current``), a deleter
finds it dead only from its expiry plus the skew margin on (``Lease.is_alive``): a renewal that
reads after a deletion committed finds the lease expired.

When pins go away, retention may now delete what they held: the ops of ``unpinned_triggers``
have it look at those apps on its next pass. Pure: paths and ops only, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from snapcoord.coordinator.domain.leases import decode_lease, decode_pins, encode_pins, pinned_by_live_lease
from snapcoord.coordinator.domain.snapshot_codec import decode_snapshot
from snapcoord.coordinator.domain.snapshots import State
from snapcoord.coordinator.kernel.expiry_index import entry_path
from snapcoord.coordinator.snapshots.layout import RETENTION, gen_path, ref
from snapcoord.coordinator.snapshots.leases.layout import record_path
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, Op, SetData

PINS = "/snapshots/pins"

#: Lease record path -> the node read (None: no record).
Records = Mapping[str, Node | None]


def pin_path(app_id: str, generation: int) -> str:
    """The pin index of a snapshot: which leases hold it, with their expiry when they pinned it."""
    return f"{PINS}/{ref(app_id, generation)}"


def snapshot_path(app_id: str, generation: int) -> str:
    """The header node of a snapshot; a lease checks its version when it pins the snapshot."""
    return gen_path(app_id, generation)


def pinnable(header: Node | None) -> bool:
    """May a lease pin the snapshot with this header node? Not when it is absent or DELETING: the
    deletion checked the pins when it marked the header, so a pin now would hold nothing."""
    return header is not None and decode_snapshot(header.data).state is not State.DELETING


def holders(node: Node | None) -> dict[str, int]:
    """The leases a pin index lists (lease id -> expiry when pinned), live or not yet collected."""
    return decode_pins(node.data) if node is not None and node.data else {}


def to_confirm(node: Node | None, now_ms: int, skew_ms: int) -> list[str]:
    """The record paths of the holders whose listed expiry (plus the skew margin) has passed:
    they may have renewed since they pinned, which only their records show. Empty when any
    holder is still alive by the index alone (the snapshot is pinned whatever the others say)."""
    listed = holders(node)
    if pinned_by_live_lease(listed, now_ms, skew_ms):
        return []
    return [record_path(lease_id) for lease_id in sorted(listed)]


def _holds(app_id: str, generation: int, record: Node | None, now_ms: int, skew_ms: int) -> bool:
    """Does this lease record hold the snapshot, alive?"""
    if record is None:
        return False
    lease = decode_lease(record.data)
    held = any(r.app_id == app_id and r.generation == generation for r in lease.snapshots)
    return held and lease.is_alive(now_ms, skew_ms)


def pinned(
    app_id: str, generation: int, node: Node | None, records: Records, now_ms: int, skew_ms: int
) -> bool:
    """Is the snapshot with this pin index held by a live lease? A lease counts until its expiry
    plus the clock-skew margin, even before the janitor removes it. ``records`` holds at least
    the ``to_confirm`` paths of ``node``."""
    listed = holders(node)
    if pinned_by_live_lease(listed, now_ms, skew_ms):
        return True
    return any(
        _holds(app_id, generation, records[record_path(lease_id)], now_ms, skew_ms) for lease_id in listed
    )


def guard(app_id: str, generation: int, node: Node | None, records: Records) -> list[Op]:
    """Ops that make a snapshot's delete transaction and a pin, or a renewal of a holder found
    dead, exclusive: a Check on the index's version (or, when there is no index, a create and
    delete of it, which fails if a lease created it meanwhile; the parent ``PINS`` must exist) and
    a rewrite, unchanged, of each listed holder's record that was read (``to_confirm``): it fails
    if the holder renewed since, and fails a renewal decided before it."""
    path = pin_path(app_id, generation)
    if node is None:
        return [Create(path, b""), Delete(path, None)]
    ops: list[Op] = [Check(path, node.version)]
    for lease_id in sorted(holders(node)):
        record = records.get(record_path(lease_id))
        if record is not None:
            ops.append(SetData(record_path(lease_id), record.data, record.version))
    return ops


def pin_change(
    path: str, node: Node | None, lease_id: str, *, holding: bool, expires_at_ms: int
) -> Op | None:
    """The op that records ``lease_id`` (with its expiry) in the pin index at ``path``, or takes it
    out (deleting an index that becomes empty); None when there is nothing to write. The other
    holders stay as listed: only the transaction that rewrites or deletes a lease's record takes
    it out (an index never lists more than ``LeasePolicy.max_holders`` leases: an acquire counts
    every listed holder, so an expired one the janitor has not removed yet still takes a place)."""
    listed = holders(node)
    if holding:
        listed[lease_id] = expires_at_ms
    elif lease_id in listed:
        del listed[lease_id]
    else:
        return None
    if node is None:
        return Create(path, encode_pins(listed)) if listed else None
    if listed:
        return SetData(path, encode_pins(listed), node.version)
    return Delete(path, node.version)


def unpinned_triggers(app_ids: Iterable[str], now_ms: int, nonce: str) -> list[Op]:
    """Ops that have retention look at these apps on its next pass (after pins went away). The
    commit needs the retention bucket of ``now_ms``; ``nonce`` keeps the names of two calls apart."""
    return [
        Create(entry_path(RETENTION, now_ms, f"{app_id}@unpinned-{nonce}"), b"")
        for app_id in sorted(set(app_ids))
    ]
