"""Snapshot leases on the metadata store: the LeaseService logic and the janitor's lease step.

Layout::

    /leases/records/<lease_id>                  the lease: duration, expiry, pinned snapshots
    /leases/expiry/<minute>/<lease_id>          the expiry index (ExpiryIndex), by expiry + skew
    /snapshots/pins/<app>@<generation>          each pinned snapshot's reverse index:
                                                lease id -> expiry, so "is it pinned?" is one read

A lease, its expiry-index entry and the pin indexes of its snapshots change in one transaction.
Pinning a snapshot also checks the version of the snapshot's header in that transaction, and a
snapshot deletion checks its pin index (see ``SnapshotRegistry.pin_state``): of an acquire and a
delete racing on one snapshot, exactly one commits; never both.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.leases import (
    Lease,
    LeasePolicy,
    SnapshotRef,
    decode_lease,
    decode_pins,
    encode_lease,
    encode_pins,
    validate_duration,
    validate_refs,
)
from snapcoord.coordinator.domain.paging import decode_id_token, encode_id_token
from snapcoord.coordinator.errors import (
    Aborted,
    CommitOutcomeUnknown,
    InvalidArgument,
    NoNodeError,
    NotFound,
    Reason,
    TransactionFailed,
)
from snapcoord.coordinator.expiry_index import ExpiryIndex
from snapcoord.coordinator.metrics import CoordinatorMetrics
from snapcoord.coordinator.snapshots import PINS, SnapshotRegistry, pin_path, snapshot_path
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, MetadataStore, Op, SetData

_log = logging.getLogger(__name__)

RECORDS = "/leases/records"
EXPIRY = "/leases/expiry"
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_ATTEMPTS = 32


@dataclass(frozen=True)
class _Stored:
    lease: Lease
    version: int


@dataclass(frozen=True)
class Acquired:
    lease: Lease
    unavailable: tuple[SnapshotRef, ...]


def _record_path(lease_id: str) -> str:
    return f"{RECORDS}/{lease_id}"


class LeaseRegistry:
    """Acquire, renew, release, drop, read and expire leases."""

    def __init__(
        self,
        metadata: MetadataStore,
        clock: Clock,
        policy: LeasePolicy,
        snapshots: SnapshotRegistry,
        metrics: CoordinatorMetrics,
    ) -> None:
        self._metadata = metadata
        self._clock = clock
        self._policy = policy
        self._snapshots = snapshots
        self._metrics = metrics
        self._expiry = ExpiryIndex(metadata, EXPIRY)
        self._ready = False

    # --- the API ----------------------------------------------------------------------------

    def acquire(self, lease_id: str, duration_ms: int, refs: Iterable[SnapshotRef]) -> Acquired:
        """Create or renew the lease to now + duration and pin every requested snapshot that
        exists; the others come back as unavailable."""
        require_id("lease_id", lease_id)
        validate_duration(duration_ms, self._policy)
        wanted = validate_refs(refs, self._policy)
        self._ensure_layout()
        for _ in range(MAX_ATTEMPTS):
            now = self._clock.now_ms()
            stored = self._read(lease_id)
            # An expired lease counts as absent: it pinned nothing since it expired, so its old
            # snapshots may be gone; the new term starts from this call's snapshots only.
            alive = stored is not None and self._alive(stored.lease, now)
            held = set(stored.lease.snapshots) if stored is not None and alive else set()
            dropped = set(stored.lease.snapshots) - held if stored is not None else set()
            ops: list[Op] = []
            unavailable: list[SnapshotRef] = []
            new_refs: list[SnapshotRef] = []
            for ref in wanted:
                if ref in held:
                    continue
                header = self._metadata.get(snapshot_path(ref.app_id, ref.generation))
                if header is None:
                    unavailable.append(ref)
                    continue
                ops.append(Check(snapshot_path(ref.app_id, ref.generation), header.version))
                new_refs.append(ref)
            lease = Lease(lease_id, duration_ms, now + duration_ms, tuple(sorted(held | set(new_refs))))
            ops += self._pin_ops(
                lease_id, add=lease.snapshots, expires_at_ms=lease.expires_at_ms, remove=dropped
            )
            ops += self._record_ops(stored, lease)
            if dropped:
                ops += self._snapshots.retention_triggers(r.app_id for r in dropped)
            if self._commit(ops, lease):
                self._metrics.lease_acquires.inc()
                return Acquired(lease, tuple(unavailable))
        raise Aborted(f"lease {lease_id!r} is heavily contended; retry AcquireSnapshots")

    def release(self, lease_id: str, refs: Iterable[SnapshotRef]) -> Lease:
        """Unpin the given snapshots (those not held are ignored); NOT_FOUND for no live lease."""
        require_id("lease_id", lease_id)
        releasing = set(validate_refs(refs, self._policy))
        for _ in range(MAX_ATTEMPTS):
            stored = self._live(lease_id)
            gone = releasing & set(stored.lease.snapshots)
            lease = Lease(
                lease_id,
                stored.lease.duration_ms,
                stored.lease.expires_at_ms,
                tuple(r for r in stored.lease.snapshots if r not in gone),
            )
            ops = self._pin_ops(lease_id, add=(), expires_at_ms=lease.expires_at_ms, remove=gone)
            ops += self._record_ops(stored, lease)
            if gone:
                ops += self._snapshots.retention_triggers(r.app_id for r in gone)
            if self._commit(ops, lease):
                self._metrics.lease_releases.inc(len(gone))
                return lease
        raise Aborted(f"lease {lease_id!r} is heavily contended; retry ReleaseSnapshots")

    def renew(self, lease_id: str, duration_ms: int) -> Lease:
        """Extend a live lease to now + duration; NOT_FOUND for an unknown or expired lease."""
        require_id("lease_id", lease_id)
        validate_duration(duration_ms, self._policy)
        for _ in range(MAX_ATTEMPTS):
            stored = self._live(lease_id)
            now = self._clock.now_ms()
            lease = Lease(lease_id, duration_ms, now + duration_ms, stored.lease.snapshots)
            ops = self._pin_ops(lease_id, add=lease.snapshots, expires_at_ms=lease.expires_at_ms, remove=())
            ops += self._record_ops(stored, lease)
            if self._commit(ops, lease):
                return lease
        raise Aborted(f"lease {lease_id!r} is heavily contended; retry RenewLease")

    def drop(self, lease_id: str) -> bool:
        """Release everything and delete the lease; True when a live lease was dropped."""
        require_id("lease_id", lease_id)
        for _ in range(MAX_ATTEMPTS):
            stored = self._read(lease_id)
            if stored is None:
                return False
            if self._remove(stored):
                return self._alive(stored.lease, self._clock.now_ms())
        raise Aborted(f"lease {lease_id!r} is heavily contended; retry DropLease")

    def get(self, lease_id: str) -> Lease:
        require_id("lease_id", lease_id)
        return self._live(lease_id).lease

    def list_page(self, page_size: int, page_token: str) -> tuple[list[Lease], str]:
        """Live leases in lease_id order, and the token of the next page."""
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(
                f"page_size is {page_size}; use 1-{MAX_PAGE_SIZE}, or 0 for {DEFAULT_PAGE_SIZE}"
            )
        after = decode_id_token(page_token)  # harden D4: was an inline require_id
        names = self._metadata.children(RECORDS)
        i = bisect.bisect_right(names, after) if after else 0
        now = self._clock.now_ms()
        page: list[Lease] = []
        while i < len(names) and len(page) < (page_size or DEFAULT_PAGE_SIZE):
            stored = self._read(names[i])
            i += 1
            if stored is not None and self._alive(stored.lease, now):
                page.append(stored.lease)
        return page, (encode_id_token(names[i - 1]) if i < len(names) else "")

    # --- the janitor's steps ----------------------------------------------------------------

    def expire_due(self, limit: int) -> int:
        """Remove up to ``limit`` leases past their expiry plus the skew margin, with their pins."""
        now = self._clock.now_ms()
        expired = 0
        for path, lease_id in self._expiry.due(now):
            if expired >= limit:
                break
            stored = self._read(lease_id)
            if stored is None:
                self._expiry.remove(path)  # cannot happen (they change together)
                continue
            if self._alive(stored.lease, now):
                continue  # the current minute's bucket is only partly due
            if self._remove(stored):
                expired += 1
                _log.info("lease %s expired at %d; released its pins", lease_id, stored.lease.expires_at_ms)
        if expired:
            self._metrics.lease_expirations.inc(expired)
        return expired

    def update_gauges(self) -> int:
        """Set the lease and pinned-snapshot gauges (names only: one listing each)."""
        self._metrics.leases.set(len(self._metadata.children(RECORDS)))
        self._metrics.pinned_snapshots.set(len(self._metadata.children(PINS)))
        return 0

    # --- internals ------------------------------------------------------------------------------

    def _ensure_layout(self) -> None:
        if not self._ready:
            self._metadata.ensure_path(RECORDS)
            self._metadata.ensure_path(PINS)
            self._ready = True

    def _alive(self, lease: Lease, now: int) -> bool:
        return lease.is_alive(now, self._policy.max_clock_skew_ms)

    def _due_ms(self, lease: Lease) -> int:
        return lease.expires_at_ms + self._policy.max_clock_skew_ms

    def _read(self, lease_id: str) -> _Stored | None:
        node = self._metadata.get(_record_path(lease_id))
        return _Stored(decode_lease(node.data), node.version) if node is not None else None

    def _live(self, lease_id: str) -> _Stored:
        stored = self._read(lease_id)
        now = self._clock.now_ms()
        if stored is None:
            raise NotFound(f"no lease {lease_id!r}")
        if not self._alive(stored.lease, now):
            raise NotFound(
                f"lease {lease_id!r} expired at {stored.lease.expires_at_ms} (now {now})",
                reason=Reason.EXPIRED,
                metadata={"lease_id": lease_id, "expires_at_ms": stored.lease.expires_at_ms},
            )
        return stored

    def _record_ops(self, stored: _Stored | None, lease: Lease) -> list[Op]:
        """Write the lease and move its expiry-index entry, version-checked against ``stored``."""
        self._expiry.prepare(self._due_ms(lease))
        entry = self._expiry.entry(self._due_ms(lease), lease.lease_id)
        if stored is None:
            return [Create(_record_path(lease.lease_id), encode_lease(lease)), Create(entry, b"")]
        ops: list[Op] = [SetData(_record_path(lease.lease_id), encode_lease(lease), stored.version)]
        old = self._expiry.entry(self._due_ms(stored.lease), lease.lease_id)
        if old != entry:
            ops += [Delete(old, None), Create(entry, b"")]
        return ops

    def _pin_ops(
        self, lease_id: str, *, add: Iterable[SnapshotRef], expires_at_ms: int, remove: Iterable[SnapshotRef]
    ) -> list[Op]:
        """Record ``lease_id`` (with its expiry) in the pin index of each snapshot in ``add``, and
        take it out of each one in ``remove`` (deleting an index that becomes empty)."""
        ops: list[Op] = []
        for ref, holding in [(r, True) for r in add] + [(r, False) for r in remove]:
            path = pin_path(ref.app_id, ref.generation)
            node = self._metadata.get(path)
            holders = decode_pins(node.data) if node is not None and node.data else {}
            if holding:
                holders[lease_id] = expires_at_ms
            else:
                holders.pop(lease_id, None)
            if node is None:
                if holders:
                    ops.append(Create(path, encode_pins(holders)))
            elif holders:
                ops.append(SetData(path, encode_pins(holders), node.version))
            else:
                ops.append(Delete(path, node.version))
        return ops

    def _remove(self, stored: _Stored) -> bool:
        """Delete the lease, its index entry and its pins in one transaction; False if it changed."""
        lease = stored.lease
        ops = self._pin_ops(lease.lease_id, add=(), expires_at_ms=0, remove=lease.snapshots)
        ops += [
            Delete(_record_path(lease.lease_id), stored.version),
            Delete(self._expiry.entry(self._due_ms(lease), lease.lease_id), None),
        ]
        if lease.snapshots:
            ops += self._snapshots.retention_triggers(r.app_id for r in lease.snapshots)
        try:
            self._metadata.transaction(ops)
        except (TransactionFailed, CommitOutcomeUnknown):
            return False
        return True

    def _commit(self, ops: list[Op], lease: Lease) -> bool:
        try:
            self._metadata.transaction(ops)
        except TransactionFailed as e:
            if isinstance(e.cause, NoNodeError):
                self._expiry.forget(self._due_ms(lease))
            return False  # a pin, a snapshot or the lease changed meanwhile: read again
        except CommitOutcomeUnknown:
            after = self._read(lease.lease_id)
            return after is not None and after.lease == lease
        return True
