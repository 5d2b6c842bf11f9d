"""Snapshot leases: the LeaseService logic on the commit kernel.

The rules of each change are in ``decide``, the paths in ``layout``, the janitor's steps in
``janitor``; what leases and snapshots share (pin indexes) in ``snapshots.pins``. Pinning a
snapshot checks the version of its header in the same transaction, and a snapshot deletion checks
its pin index and the records of the holders it found dead: of an acquire, or a renewal, and a
delete racing on one snapshot, exactly one commits.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TypeVar

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.leases import (
    Lease,
    LeasePolicy,
    SnapshotRef,
    validate_duration,
    validate_refs,
)
from snapcoord.coordinator.domain.paging import decode_id_token, encode_id_token
from snapcoord.coordinator.errors import CorruptRecord, InvalidArgument
from snapcoord.coordinator.kernel.commit import CommitKernel, synced_retry
from snapcoord.coordinator.kernel.corruption import at, skipped
from snapcoord.coordinator.kernel.decision import Commit, Decide, Decision, ReadNode, Reads
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.snapshots.leases import decide
from snapcoord.coordinator.snapshots.leases.cache import RecordCache
from snapcoord.coordinator.snapshots.leases.decide import Acquired
from snapcoord.coordinator.snapshots.leases.janitor import LeaseJanitor
from snapcoord.coordinator.snapshots.leases.layout import RECORDS, new_nonce, record_path
from snapcoord.coordinator.storage.metadata import MetadataStore

__all__ = ["Acquired", "LeaseRegistry"]

R = TypeVar("R")

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


class LeaseRegistry:
    """Acquire, renew, release, drop, read and expire leases."""

    def __init__(
        self,
        metadata: MetadataStore,
        clock: Clock,
        policy: LeasePolicy,
        kernel: CommitKernel,
        metrics: CoordinatorMetrics,
    ) -> None:
        self._metadata = metadata
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._kernel = kernel
        self._janitor = LeaseJanitor(self._kernel, metadata, clock, policy, metrics)
        self._records = RecordCache()

    # --- the API ----------------------------------------------------------------------------

    def acquire(self, lease_id: str, duration_ms: int, refs: Iterable[SnapshotRef]) -> Acquired:
        """Create or renew the lease to now + duration and pin every requested snapshot that
        exists; the others come back as unavailable."""
        require_id("lease_id", lease_id)
        validate_duration(duration_ms, self._policy)
        wanted = tuple(validate_refs(refs, self._policy))
        nonce = new_nonce()
        acquired = self._run(
            "lease_acquire",
            lease_id,
            lambda reads, pending: decide.acquire(
                lease_id, duration_ms, wanted, reads, pending, self._clocks(nonce)
            ),
            assume=self._assumed(lease_id, refusals=False, unknown_absent=True),
        )
        self._metrics.lease_acquires.inc()
        return acquired

    def release(self, lease_id: str, refs: Iterable[SnapshotRef]) -> Lease:
        """Unpin the given snapshots (those not held are ignored); NOT_FOUND for no live lease."""
        require_id("lease_id", lease_id)
        releasing = frozenset(validate_refs(refs, self._policy))
        nonce = new_nonce()
        released = self._run(
            "lease_release",
            lease_id,
            lambda reads, pending: decide.release(lease_id, releasing, reads, pending, self._clocks(nonce)),
            assume=self._assumed(lease_id, refusals=True),
        )
        self._metrics.lease_releases.inc(len(released.released))
        return released.lease

    def renew(self, lease_id: str, duration_ms: int) -> Lease:
        """Extend a live lease to now + duration; NOT_FOUND for an unknown or expired lease."""
        require_id("lease_id", lease_id)
        validate_duration(duration_ms, self._policy)
        return self._run(
            "lease_renew",
            lease_id,
            lambda reads, pending: decide.renew(lease_id, duration_ms, reads, pending, self._clocks("")),
            assume=self._assumed(lease_id, refusals=True),
        )

    def drop(self, lease_id: str) -> bool:
        """Release everything and delete the lease; True when a live lease was dropped."""
        require_id("lease_id", lease_id)
        nonce = new_nonce()
        outcome = self._run(
            "lease_drop",
            lease_id,
            lambda reads, pending: decide.remove(
                lease_id, reads, pending, self._clocks(nonce), only_expired=False
            ),
            assume=self._assumed(lease_id, refusals=False),
        )
        return outcome == "alive"

    def get(self, lease_id: str) -> Lease:
        """The live lease; NOT_FOUND (after a sync: it may just have been acquired through
        another replica) when there is none."""
        require_id("lease_id", lease_id)

        def attempt() -> Lease:
            with at(record_path(lease_id)):
                current = decide.stored(self._metadata.get(record_path(lease_id)))
            return decide.live(lease_id, current, self._clocks("")).lease

        return synced_retry(self._metadata, attempt)

    def list_page(self, page_size: int, page_token: str) -> tuple[list[Lease], str]:
        """Live leases in lease_id order, and the token of the next page."""
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(
                f"page_size is {page_size}; use 1-{MAX_PAGE_SIZE}, or 0 for {DEFAULT_PAGE_SIZE}"
            )
        after = decode_id_token(page_token)
        size = page_size or DEFAULT_PAGE_SIZE
        names = self._metadata.children(RECORDS)
        i = bisect.bisect_right(names, after) if after else 0
        now = self._clock.now_ms()
        page: list[Lease] = []
        while i < len(names) and len(page) < size:
            batch = names[i : i + size - len(page)]  # the leases of a page are read together
            nodes = self._metadata.get_many([record_path(n) for n in batch])
            for name in batch:
                i += 1
                try:
                    with at(record_path(name)):
                        current = decide.stored(nodes[record_path(name)])
                except CorruptRecord as e:  # its neighbours are listed; the log and metric name it
                    skipped(self._metrics, e, "ListLeases")
                    continue
                if current is not None and current.lease.is_current(now):
                    page.append(current.lease)
        return page, (encode_id_token(names[i - 1]) if i < len(names) else "")

    # --- the janitor's steps (janitor.py) -------------------------------------------------------

    def expire_due(self, limit: int) -> int:
        """Remove up to ``limit`` leases past their expiry plus the skew margin, with their pins."""
        return self._janitor.expire_due(limit)

    def update_gauges(self) -> int:
        """Set the lease and pinned-snapshot gauges (names only: one listing each)."""
        return self._janitor.update_gauges()

    # --- the record cache (leases.cache) ----------------------------------------------------

    def _assumed(self, lease_id: str, *, refusals: bool, unknown_absent: bool = False) -> Reads | None:
        """What the first round of a call may take as read instead of reading the lease record:
        this process's copy of it. ``refusals``: the decision refuses a dead lease (renew,
        release), so a copy showing one is not used (it may be stale: renewed elsewhere). A copy
        showing a lease alive can only be wrong by being stale, which fails the commit.
        ``unknown_absent`` (acquire): with no copy, guess "no record" (a new lease is one
        transaction; a create over an existing record fails, and the call reads)."""
        path = record_path(lease_id)
        node = self._records.get(path)
        if node is None:
            return Reads({path: None}) if unknown_absent else None
        with at(path):
            current = decide.stored(node)
        if current is None or not current.lease.incarnation:
            return None
        if refusals and not current.lease.is_current(self._clock.now_ms()):
            return None
        return Reads({path: node})

    def _run(self, operation: str, lease_id: str, decide_fn: Decide[R], *, assume: Reads | None) -> R:
        """``kernel.run`` on the lease's record, then remember what its last commit wrote there."""
        path = record_path(lease_id)
        last: list[Decision[R] | None] = [None]

        def tracked(reads: Reads, pending: Commit[R] | None) -> Decision[R]:
            decision = decide_fn(reads, pending)
            last[0] = decision
            return decision

        try:
            result = self._kernel.run(
                operation, {"lease_id": lease_id}, [ReadNode(path)], tracked, assume=assume
            )
        except Exception:
            self._records.forget(path)
            raise
        self._records.committed(path, last[0])
        return result

    def _clocks(self, nonce: str) -> decide.Clocks:
        return decide.Clocks(self._clock.now_ms(), nonce, self._policy)
