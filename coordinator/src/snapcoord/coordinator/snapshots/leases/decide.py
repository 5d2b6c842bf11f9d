"""The rules of every lease change, as pure functions of what was read (no I/O).

Each takes the request, the kernel's ``Reads``, the commit still in doubt (``pending``), the time
and the clock-skew margin; it returns ``Done``, ``Commit`` or ``More`` (the pin indexes to read,
which depend on the lease read first). A commit in doubt is recognised by the stored lease being
exactly the one it wrote.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

from snapcoord.coordinator.domain.leases import Lease, LeasePolicy, SnapshotRef, decode_lease, encode_lease
from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, NotFound, Reason
from snapcoord.coordinator.kernel.decision import Commit, Done, More, ReadNode, Reads, landed
from snapcoord.coordinator.snapshots import pins
from snapcoord.coordinator.snapshots.layout import RETENTION
from snapcoord.coordinator.snapshots.leases.layout import (
    EXPIRY,
    RECORDS,
    due_ms,
    incarnation_path,
    index_path,
    record_path,
)
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, Op, SetData

R = TypeVar("R")


@dataclass(frozen=True)
class Stored:
    lease: Lease
    version: int


def stored(node: Node | None) -> Stored | None:
    return Stored(decode_lease(node.data), node.version) if node is not None else None


@dataclass(frozen=True)
class Acquired:
    lease: Lease
    unavailable: tuple[SnapshotRef, ...]


@dataclass(frozen=True)
class Released:
    lease: Lease
    released: frozenset[SnapshotRef]


@dataclass(frozen=True)
class Clocks:
    """The time of a decision, this call's nonce (names its retention triggers), and the policy
    in force: its clock-skew margin and the limits an acquire enforces against stored state."""

    now: int
    nonce: str
    policy: LeasePolicy

    @property
    def skew_ms(self) -> int:
        return self.policy.max_clock_skew_ms


def _pin_reads(refs: Iterable[SnapshotRef], reads: Reads) -> More | None:
    missing = [r for r in (ReadNode(pins.pin_path(x.app_id, x.generation)) for x in refs) if not reads.has(r)]
    return More(sorted(set(missing), key=lambda r: r.path)) if missing else None


def pin_ops(
    lease_id: str,
    reads: Reads,
    *,
    add: Iterable[SnapshotRef],
    expires_at_ms: int,
    remove: Iterable[SnapshotRef],
) -> list[Op]:
    """Record ``lease_id`` in the pin index of each snapshot in ``add``; take it out of ``remove``
    (``pins.pin_change``; the two name distinct snapshots)."""
    ops: list[Op] = []
    for ref, holding in [(r, True) for r in add] + [(r, False) for r in remove]:
        path = pins.pin_path(ref.app_id, ref.generation)
        op = pins.pin_change(path, reads.node(path), lease_id, holding=holding, expires_at_ms=expires_at_ms)
        if op is not None:
            ops.append(op)
    return ops


def record_ops(current: Stored | None, lease: Lease, skew_ms: int) -> list[Op]:
    """Write the lease and move its expiry-index entry, version-checked against ``current``.

    A new record gets its incarnation child; a rewrite checks it: ``current`` may come from this
    process's cache of what it last wrote (``leases.cache``), not from a read, and a record dropped
    and acquired again meanwhile may be back at the same version. The check fails that commit,
    so a stale copy never extends, or overwrites, another incarnation of the lease."""
    entry = index_path(lease, skew_ms)
    record = record_path(lease.lease_id)
    if current is None:
        ops: list[Op] = [Create(record, encode_lease(lease))]
        if lease.incarnation:
            ops.append(Create(incarnation_path(lease), b""))
        return [*ops, Create(entry, b"")]
    ops = [Check(incarnation_path(current.lease), 0)] if current.lease.incarnation else []
    ops.append(SetData(record, encode_lease(lease), current.version))
    old = index_path(current.lease, skew_ms)
    if old != entry:
        ops += [Delete(old, None), Create(entry, b"")]
    return ops


def _commit(
    ops: list[Op],
    result: R,
    lease: Lease,
    clocks: Clocks,
    unpinned: Iterable[SnapshotRef],
    *,
    indexed: bool = True,
) -> Commit[R]:
    """The commit with what it needs: the bucket of the lease's index entry (when it writes one)
    and, when pins go away, retention triggers."""
    apps = [r.app_id for r in unpinned]
    buckets: list[tuple[str, int]] = [(EXPIRY, due_ms(lease, clocks.skew_ms))] if indexed else []
    if apps:  # retention may now delete what these pins held
        ops = ops + pins.unpinned_triggers(apps, clocks.now, clocks.nonce)
        buckets.append((RETENTION, clocks.now))
    return Commit(ops, result, buckets=tuple(buckets), ensure=(RECORDS, pins.PINS))


def live(lease_id: str, current: Stored | None, clocks: Clocks) -> Stored:
    """The lease if its holder may still use it (``Lease.is_current``: before its expiry); NOT_FOUND
    (reason EXPIRED once expired) otherwise."""
    if current is None:
        raise NotFound(f"no lease {lease_id!r}")
    if not current.lease.is_current(clocks.now):
        raise NotFound(
            f"lease {lease_id!r} expired at {current.lease.expires_at_ms} (now {clocks.now})",
            reason=Reason.EXPIRED,
            metadata={"lease_id": lease_id, "expires_at_ms": current.lease.expires_at_ms},
        )
    return current


def acquire(
    lease_id: str,
    duration_ms: int,
    wanted: tuple[SnapshotRef, ...],
    reads: Reads,
    pending: Commit[Acquired] | None,
    clocks: Clocks,
) -> Done[Acquired] | Commit[Acquired] | More:
    """Create or renew the lease to now + duration and pin every requested snapshot that exists;
    the others come back as unavailable."""
    current = stored(reads.node(record_path(lease_id)))
    if pending is not None and current is not None and current.lease == pending.result.lease:
        return landed(pending)
    # An expired lease counts as absent: it pinned nothing since it expired, so its old snapshots
    # may be gone (a deletion may find it dead from its expiry plus the skew margin on, by a clock
    # ahead of ours); the new term starts from this call's snapshots only, each checked again.
    alive = current is not None and current.lease.is_current(clocks.now)
    held = set(current.lease.snapshots) if current is not None and alive else set()
    dropped = set(current.lease.snapshots) - held if current is not None else set()
    adding = [r for r in wanted if r not in held]
    headers = [ReadNode(pins.snapshot_path(r.app_id, r.generation)) for r in adding]
    more = _pin_reads([*adding, *dropped], reads)
    missing = [r for r in headers if not reads.has(r)]
    if more is not None or missing:
        return More([*missing, *(more.reads if more else ())])
    ops: list[Op] = []
    unavailable: list[SnapshotRef] = []
    new_refs: list[SnapshotRef] = []
    max_holders = clocks.policy.max_holders
    for ref in wanted:
        if ref in held:
            continue
        path = pins.snapshot_path(ref.app_id, ref.generation)
        header = reads.node(path)
        if header is None or not pins.pinnable(header):
            unavailable.append(ref)
            continue
        pin_path = pins.pin_path(ref.app_id, ref.generation)
        # Every listed holder takes a place, an expired one too until the janitor removes it
        # (with its record: only that may take it out), so an index never outgrows the limit.
        others = pins.holders(reads.node(pin_path))
        others.pop(lease_id, None)
        if len(others) >= max_holders:
            raise FailedPrecondition(
                f"{ref.app_id}@{ref.generation} is already held by {len(others)} leases; the limit is "
                f"{max_holders} (--lease-max-holders): share a lease, or release one (an "
                "expired lease keeps its place until the janitor removes it, one pass after its "
                "expiry plus the clock-skew margin)",
                reason=Reason.TOO_LARGE,
                metadata={"app_id": ref.app_id, "generation": ref.generation, "limit": max_holders},
            )
        ops.append(Check(path, header.version))  # a delete racing this pin fails one of the two
        new_refs.append(ref)
    total = len(held | set(new_refs))
    if total > clocks.policy.max_snapshots:
        raise InvalidArgument(
            f"lease {lease_id!r} would hold {total} snapshots ({len(held)} already); the limit per "
            f"lease is {clocks.policy.max_snapshots} (--lease-max-snapshots)",
            reason=Reason.TOO_LARGE,
            metadata={"field": "snapshots", "limit": clocks.policy.max_snapshots},
        )
    # The record keeps its incarnation while it exists (even across an expiry); a new record gets
    # this call's nonce, the same in every round of the call (a commit in doubt is recognised).
    incarnation = current.lease.incarnation if current is not None else clocks.nonce
    lease = Lease(
        lease_id, duration_ms, clocks.now + duration_ms, tuple(sorted(held | set(new_refs))), incarnation
    )
    # Only the indexes of the snapshots pinned or given up change: those of the held ones list
    # this lease already (a renewal does not rewrite them, see ``pins``). An expired lease asked
    # for a snapshot of its dead term pins it again: that index is rewritten, not emptied.
    given_up = sorted(dropped - set(new_refs))
    ops += pin_ops(lease_id, reads, add=new_refs, expires_at_ms=lease.expires_at_ms, remove=given_up)
    ops += record_ops(current, lease, clocks.skew_ms)
    return _commit(ops, Acquired(lease, tuple(unavailable)), lease, clocks, given_up)


def release(
    lease_id: str,
    releasing: frozenset[SnapshotRef],
    reads: Reads,
    pending: Commit[Released] | None,
    clocks: Clocks,
) -> Done[Released] | Commit[Released] | More:
    """Unpin the given snapshots (those not held are ignored); NOT_FOUND for no live lease."""
    current = stored(reads.node(record_path(lease_id)))
    if pending is not None and current is not None and current.lease == pending.result.lease:
        return landed(pending)
    current = live(lease_id, current, clocks)
    gone = releasing & set(current.lease.snapshots)
    more = _pin_reads(gone, reads)
    if more is not None:
        return more
    old = current.lease
    lease = Lease(
        lease_id,
        old.duration_ms,
        old.expires_at_ms,
        tuple(r for r in old.snapshots if r not in gone),
        old.incarnation,
    )
    ops = pin_ops(lease_id, reads, add=(), expires_at_ms=lease.expires_at_ms, remove=sorted(gone))
    ops += record_ops(current, lease, clocks.skew_ms)
    return _commit(ops, Released(lease, gone), lease, clocks, gone)


def renew(
    lease_id: str, duration_ms: int, reads: Reads, pending: Commit[Lease] | None, clocks: Clocks
) -> Done[Lease] | Commit[Lease] | More:
    """Extend a live lease to now + duration; NOT_FOUND for an unknown or expired lease. One write,
    of the record: the pin indexes keep the expiry the lease pinned with, and whoever needs to know
    whether a holder listed there as expired still lives reads its record (``pins``)."""
    current = stored(reads.node(record_path(lease_id)))
    if pending is not None and current is not None and current.lease == pending.result:
        return landed(pending)
    current = live(lease_id, current, clocks)
    old = current.lease
    lease = Lease(lease_id, duration_ms, clocks.now + duration_ms, old.snapshots, old.incarnation)
    return _commit(record_ops(current, lease, clocks.skew_ms), lease, lease, clocks, ())


Removal = Literal["removed", "absent", "alive"]


def remove(
    lease_id: str, reads: Reads, pending: Commit[Removal] | None, clocks: Clocks, *, only_expired: bool
) -> Done[Removal] | Commit[Removal] | More:
    """Delete the lease, its index entry and its pins in one transaction: DropLease, or (with
    ``only_expired``) the janitor's expiry, which leaves a lease still alive ("alive").

    The result of DropLease's commit says whether the lease was alive: "alive" then means "a
    live lease was dropped", "removed" an expired one."""
    current = stored(reads.node(record_path(lease_id)))
    if current is None:
        return landed(pending) if pending is not None else Done("absent")
    lease = current.lease
    alive = lease.is_alive(clocks.now, clocks.skew_ms)
    if only_expired and alive:
        return Done("alive")  # the current minute's bucket is only partly due
    more = _pin_reads(lease.snapshots, reads)
    if more is not None:
        return more
    ops = pin_ops(lease_id, reads, add=(), expires_at_ms=0, remove=lease.snapshots)
    if lease.incarnation:  # first: ZooKeeper deletes no node that has children
        ops.append(Delete(incarnation_path(lease), 0))
    ops += [Delete(record_path(lease_id), current.version), Delete(index_path(lease, clocks.skew_ms), None)]
    return _commit(ops, "alive" if alive else "removed", lease, clocks, lease.snapshots, indexed=False)
