"""Pins: the contract between leases and snapshots, in one place.

``/snapshots/pins/<app>@<generation>`` is each pinned snapshot's reverse index: lease id ->
expiry, so "is it pinned?" is one read. A lease changes the pin indexes of its snapshots in the
same transaction as its record (and checks the snapshot header's version when it pins one); a
snapshot deletion checks the pin index in its own transaction (``guard``). So of an acquire and a
delete racing on one snapshot, exactly one commits; never both.

When pins go away, retention may now delete what they held: the ops of ``unpinned_triggers``
have it look at those apps on its next pass. Pure: paths and ops only, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from snapcoord.coordinator.domain.leases import decode_pins, encode_pins, pinned_by_live_lease
from snapcoord.coordinator.domain.snapshot_codec import decode_snapshot
from snapcoord.coordinator.domain.snapshots import State
from snapcoord.coordinator.expiry_index import entry_path
from snapcoord.coordinator.snapshots.layout import RETENTION, gen_path, ref
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, Op, SetData

PINS = "/snapshots/pins"


def pin_path(app_id: str, generation: int) -> str:
    """The pin index of a snapshot: which leases hold it, with their expiry."""
    return f"{PINS}/{ref(app_id, generation)}"


def snapshot_path(app_id: str, generation: int) -> str:
    """The header node of a snapshot; a lease checks its version when it pins the snapshot."""
    return gen_path(app_id, generation)


def pinnable(header: Node | None) -> bool:
    """May a lease pin the snapshot with this header node? Not when it is absent or DELETING: the
    deletion checked the pins when it marked the header, so a pin now would hold nothing."""
    return header is not None and decode_snapshot(header.data).state is not State.DELETING


def pinned(node: Node | None, now_ms: int, skew_ms: int) -> bool:
    """Is the snapshot with this pin index held by a live lease? A lease counts until its expiry
    plus the clock-skew margin, even before the janitor removes it."""
    return node is not None and pinned_by_live_lease(decode_pins(node.data), now_ms, skew_ms)


def guard(app_id: str, generation: int, node: Node | None) -> list[Op]:
    """Ops that fail a snapshot's delete transaction if a pin lands concurrently: a Check on the
    index's version or, when there is no index, a create and delete of it (which fails if a lease
    created it meanwhile; the parent ``PINS`` must exist)."""
    path = pin_path(app_id, generation)
    if node is None:
        return [Create(path, b""), Delete(path, None)]
    return [Check(path, node.version)]


def live_holders(node: Node | None, now_ms: int, skew_ms: int) -> dict[str, int]:
    """The leases of a pin index that still count as alive (expiry plus the skew margin)."""
    holders = decode_pins(node.data) if node is not None and node.data else {}
    return {k: v for k, v in holders.items() if now_ms < v + skew_ms}


def pin_change(
    path: str,
    node: Node | None,
    lease_id: str,
    *,
    holding: bool,
    expires_at_ms: int,
    live_after_ms: int | None = None,
) -> Op | None:
    """The op that records ``lease_id`` (with its expiry) in the pin index at ``path``, or takes it
    out (deleting an index that becomes empty); None when there is nothing to write. With
    ``live_after_ms`` (now less the skew margin), the holders expired by then are dropped from
    what is written: they pin nothing, and so an index never lists more than the live leases a
    pin admitted (``LeasePolicy.max_holders``), which bounds its size."""
    holders = decode_pins(node.data) if node is not None and node.data else {}
    # (Usually none has expired: one pass over the expiries tells, before building a new dict.)
    if live_after_ms is not None and holders and min(holders.values()) <= live_after_ms:
        holders = {k: v for k, v in holders.items() if v > live_after_ms or k == lease_id}
    if holding:
        holders[lease_id] = expires_at_ms
    else:
        holders.pop(lease_id, None)
    if node is None:
        return Create(path, encode_pins(holders)) if holders else None
    if holders:
        return SetData(path, encode_pins(holders), node.version)
    return Delete(path, node.version)


def unpinned_triggers(app_ids: Iterable[str], now_ms: int, nonce: str) -> list[Op]:
    """Ops that have retention look at these apps on its next pass (after pins went away). The
    commit needs the retention bucket of ``now_ms``; ``nonce`` keeps the names of two calls apart."""
    return [
        Create(entry_path(RETENTION, now_ms, f"{app_id}@unpinned-{nonce}"), b"")
        for app_id in sorted(set(app_ids))
    ]
