"""Snapshot leases: the rules, without I/O.

A reader (a restore or backfill job) leases the snapshots it depends on; cleanup never deletes a
snapshot a live lease pins. Every acquire renews the lease to now + duration, and a lease that is
not renewed ends by itself. Replicas' clocks may disagree, so a lease counts as alive until its
expiry plus the configured clock-skew margin.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from snapcoord.coordinator.domain.documents import SHAPE_ERRORS, dump, load, malformed
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.lru import Lru
from snapcoord.coordinator.errors import InvalidArgument

LEASE_VERSION = 1
PINS_VERSION = 1


@dataclass(frozen=True, order=True)
class SnapshotRef:
    app_id: str
    generation: int


@dataclass(frozen=True)
class LeasePolicy:
    """Server-side limits, from the configuration (``config.options.OPTIONS`` names the option of
    each field). A field's default here is its option's default: the option reads it."""

    min_duration_ms: int = 1_000
    max_duration_ms: int = 7 * 24 * 3_600_000
    #: Most snapshots in one AcquireSnapshots or ReleaseSnapshots call, and held by one lease.
    max_snapshots: int = 256
    #: Most leases holding one snapshot (its pin index lists them all, an expired one until the
    #: janitor removes it), which bounds the index's size.
    max_holders: int = 4
    #: A lease counts as alive until its expiry plus this margin (replicas' clocks disagree).
    max_clock_skew_ms: int = 5_000
    #: ZooKeeper's jute.maxbuffer: bounds the leases one snapshot's pin index may list.
    max_request_bytes: int = 1_048_575


@dataclass(frozen=True)
class Lease:
    lease_id: str
    duration_ms: int
    expires_at_ms: int
    snapshots: tuple[SnapshotRef, ...]
    #: Names this lease record from its create to its delete (never changed in between). ZooKeeper
    #: versions restart at 0 when a lease is dropped and acquired again, so a version alone does
    #: not tell two incarnations apart; a writer that did not just read the record checks this
    #: (as the ``<record>/<incarnation>`` child node, see ``leases.layout``). Empty for records
    #: written before incarnations existed.
    incarnation: str = ""

    def is_alive(self, now_ms: int, skew_ms: int) -> bool:
        """Does the lease still pin its snapshots, for whoever would delete them? Until its expiry
        plus the clock-skew margin: a lease renewed by a replica whose clock runs behind must not
        look expired to one whose clock runs ahead."""
        return now_ms < self.expires_at_ms + skew_ms

    def is_current(self, now_ms: int) -> bool:
        """May its holder still use it (renew it, release from it, read it)? Only until its expiry:
        a renewal after it could land after a deletion that found the lease dead, and hold a
        deleted snapshot. The skew margin between the two rules keeps them apart (``is_alive``)."""
        return now_ms < self.expires_at_ms


def validate_duration(duration_ms: int, policy: LeasePolicy) -> int:
    if not policy.min_duration_ms <= duration_ms <= policy.max_duration_ms:
        raise InvalidArgument(
            f"duration_ms is {duration_ms}; leases last {policy.min_duration_ms}-{policy.max_duration_ms} ms"
        )
    return duration_ms


def validate_refs(
    refs: Iterable[SnapshotRef], policy: LeasePolicy, *, field: str = "snapshots"
) -> tuple[SnapshotRef, ...]:
    """Valid, distinct refs in request order (at most ``policy.max_snapshots``)."""
    items = tuple(refs)
    if len(items) > policy.max_snapshots:
        raise InvalidArgument(f"{field} has {len(items)} entries; the limit is {policy.max_snapshots}")
    seen: dict[SnapshotRef, int] = {}
    for i, ref in enumerate(items):
        require_id(f"{field}[{i}].app_id", ref.app_id)
        if ref.generation <= 0:
            raise InvalidArgument(f"{field}[{i}].generation is {ref.generation}; generations start at 1")
        if ref in seen:
            raise InvalidArgument(
                f"{field}[{i}] repeats {ref.app_id}@{ref.generation} (first at {field}[{seen[ref]}])"
            )
        seen[ref] = i
    return items


def pinned_by_live_lease(holders: Mapping[str, int], now_ms: int, skew_ms: int) -> bool:
    """Does any holder (lease id -> the expiry a pin index lists) still count as alive by it?"""
    return any(now_ms < expires + skew_ms for expires in holders.values())


#: The most bytes each decoding memo below keeps (keys and values are about the same size).
MEMO_MAX_BYTES = 8 * 1024 * 1024

#: Encoded lease record -> the lease, decoded once or written by this process. A holder's next
#: call finds the record its last call wrote (the record copy, or a read of it), and the commit
#: kernel's rounds decode it again (a renew of a lease with snapshots decides twice): lookups.
_LEASES: Lru[bytes, Lease] = Lru(MEMO_MAX_BYTES)
#: Encoded pin index -> its holders, the same way: an acquire or release rewrites the index of
#: each snapshot it pins or gives up, and the next call on one (here) reads those bytes back. An
#: index lists up to ``LeasePolicy.max_holders`` leases, so decoding one can cost more than the
#: rest of the call.
_PINS: Lru[bytes, dict[str, int]] = Lru(MEMO_MAX_BYTES)


def encode_lease(lease: Lease) -> bytes:
    doc: dict[str, object] = {
        "version": LEASE_VERSION,
        "lease_id": lease.lease_id,
        "duration_ms": lease.duration_ms,
        "expires_at_ms": lease.expires_at_ms,
        "snapshots": [[r.app_id, r.generation] for r in sorted(lease.snapshots)],
    }
    if lease.incarnation:
        doc["incarnation"] = lease.incarnation
    data = dump(doc)
    # Decoding these bytes gives the lease back exactly when its snapshots are in stored order.
    if list(lease.snapshots) == sorted(lease.snapshots):
        _LEASES.put(data, lease, 2 * len(data))
    return data


def decode_lease(data: bytes) -> Lease:
    known = _LEASES.get(data)
    if known is not None:
        return known  # frozen: shared safely
    lease = _decode_lease(data)
    _LEASES.put(data, lease, 2 * len(data))
    return lease


def _decode_lease(data: bytes) -> Lease:
    doc = load(data, "lease", LEASE_VERSION)
    try:
        return Lease(
            lease_id=str(doc["lease_id"]),
            duration_ms=int(doc["duration_ms"]),
            expires_at_ms=int(doc["expires_at_ms"]),
            snapshots=tuple(SnapshotRef(str(a), int(g)) for a, g in doc["snapshots"]),
            incarnation=str(doc.get("incarnation", "")),
        )
    except SHAPE_ERRORS as e:
        raise malformed("lease", e, data) from e


#: Lease ids as ``require_id`` admits them: JSON strings that need no escaping.
_PLAIN_IDS = re.compile(r"[A-Za-z0-9._:-]*")


def encode_pins(holders: Mapping[str, int]) -> bytes:
    """A snapshot's pin index: which leases hold it, with their expiry (so one read answers)."""
    leases = dict(sorted(holders.items()))
    if _PLAIN_IDS.fullmatch("".join(leases)) and all(type(v) is int for v in leases.values()):
        # ``documents.dump``'s bytes, written directly: an index may list hundreds of leases, and the
        # JSON encoder takes three times as long over them (rewritten on every renew).
        entries = ",".join([f'"{k}":{v}' for k, v in leases.items()])
        data = f'{{"leases":{{{entries}}},"version":{PINS_VERSION}}}'.encode()
    else:
        data = dump({"version": PINS_VERSION, "leases": leases})
    _PINS.put(data, leases, 2 * len(data))
    return data


def decode_pins(data: bytes) -> dict[str, int]:
    """The holders (a new dict each time: callers change it to write the next index)."""
    known = _PINS.get(data)
    if known is not None:
        return dict(known)
    holders = _decode_pins(data)
    _PINS.put(data, dict(holders), 2 * len(data))
    return holders


def _decode_pins(data: bytes) -> dict[str, int]:
    doc = load(data, "pin index", PINS_VERSION)
    try:
        return {str(k): int(v) for k, v in doc["leases"].items()}
    except SHAPE_ERRORS as e:
        raise malformed("pin index", e, data) from e
