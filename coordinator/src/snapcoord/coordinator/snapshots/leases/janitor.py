"""The janitor's lease steps: remove leases past their expiry (with their pins), count gauges."""

from __future__ import annotations

import logging

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.leases import LeasePolicy
from snapcoord.coordinator.errors import CorruptRecord
from snapcoord.coordinator.kernel.commit import CommitKernel
from snapcoord.coordinator.kernel.corruption import skipped
from snapcoord.coordinator.kernel.decision import ReadNode
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.snapshots import pins
from snapcoord.coordinator.snapshots.leases import decide
from snapcoord.coordinator.snapshots.leases.layout import EXPIRY, RECORDS, new_nonce, record_path
from snapcoord.coordinator.storage.metadata import MetadataStore

_log = logging.getLogger(__name__)


class LeaseJanitor:
    def __init__(
        self,
        kernel: CommitKernel,
        metadata: MetadataStore,
        clock: Clock,
        policy: LeasePolicy,
        metrics: CoordinatorMetrics,
    ) -> None:
        self._kernel = kernel
        self._metadata = metadata
        self._clock = clock
        self._policy = policy
        self._metrics = metrics

    def expire_due(self, limit: int) -> int:
        """Remove up to ``limit`` leases past their expiry plus the skew margin, with their pins."""
        now = self._clock.now_ms()
        expired = 0
        index = self._kernel.expiry(EXPIRY)
        for path, lease_id in index.due(now):
            if expired >= limit:
                break
            # A nonce per lease, as per RPC: it names the retention trigger of the lease's app, and
            # a second lease of the same app in this pass would otherwise create the same node,
            # failing its commit every round (one lease per app per pass, the rest left behind).
            clocks = decide.Clocks(now, new_nonce(), self._policy)
            try:
                outcome = self._kernel.run(
                    "lease_expire",
                    {"lease_id": lease_id},
                    [ReadNode(record_path(lease_id))],
                    lambda reads, pending: decide.remove(lease_id, reads, pending, clocks, only_expired=True),  # noqa: B023
                )
            except CorruptRecord as e:
                # Its record or a pin index it names: the entry stays due (counted every pass), and
                # its snapshots stay pinned (retention keeps what an unreadable lease may hold).
                skipped(self._metrics, e, "lease expiry")
                continue
            if outcome == "absent":
                index.remove(path)  # cannot happen (they change together)
            elif outcome == "removed":
                expired += 1
                _log.info("lease %s expired; released its pins", lease_id)
        if expired:
            self._metrics.lease_expirations.inc(expired)
        return expired

    def update_gauges(self) -> int:
        """Set the lease and pinned-snapshot gauges (names only: one listing each)."""
        self._metrics.leases.set(len(self._metadata.children(RECORDS)))
        self._metrics.pinned_snapshots.set(len(self._metadata.children(pins.PINS)))
        return 0
