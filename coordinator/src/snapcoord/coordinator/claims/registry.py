"""Commit claims: the CommitClaimService logic on the commit kernel, and the janitor's step.

Validation and the janitor's rule are in ``domain.claims``, the layout in ``layout``, the rules
of each change in ``decide``. Reads in the kernel are not synced, and need not be: a fence only
rises and a claim never changes, so a stale read can only make a commit fail its version check
(and re-read), never grant a claim the store would refuse. GetCommitClaims syncs before a
NOT_FOUND, as every read-only call does.
"""

from __future__ import annotations

import logging

from snapcoord.coordinator.claims import decide
from snapcoord.coordinator.claims.layout import TABLES, claim_path, parse_claim_name, table_path
from snapcoord.coordinator.domain.claims import (
    ClaimResult,
    CommitClaim,
    CommitClaimPolicy,
    TableClaims,
    TableFence,
    validate_claim,
    validate_fence,
    validate_listing,
)
from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.ids import is_valid_id
from snapcoord.coordinator.errors import CorruptRecord, FailedPrecondition, NotFound
from snapcoord.coordinator.kernel.commit import CommitKernel, synced_retry
from snapcoord.coordinator.kernel.corruption import at, skipped
from snapcoord.coordinator.kernel.decision import ReadNode
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.storage.metadata import MetadataStore

_log = logging.getLogger(__name__)

#: Claims removed per janitor transaction: a Delete each (at most ~500 bytes with the longest
#: chroot and table id), far below ZooKeeper's request bound.
CLEAN_CHUNK = 256


class CommitClaimRegistry:
    """Fence tables, claim log numbers, list claims; remove old claims for the janitor."""

    def __init__(
        self,
        metadata: MetadataStore,
        clock: Clock,
        policy: CommitClaimPolicy,
        metrics: CoordinatorMetrics,
        kernel: CommitKernel,
    ) -> None:
        self._metadata = metadata
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._kernel = kernel

    def fence(self, table_id: str, epoch: int, seq: int) -> TableFence:
        """FenceTable: one transaction raises the fence and claims the first number of the run."""
        validate_fence(table_id, epoch, seq)
        request = decide.FenceRequest(table_id, epoch, seq)
        try:
            fenced = self._kernel.run(
                "claims_fence",
                {"table_id": table_id},
                [ReadNode(table_path(table_id))],
                lambda reads, pending: decide.fence(request, reads, pending, self._clock.now_ms()),
            )
        except FailedPrecondition:
            self._metrics.commit_fences.labels("refused").inc()
            raise
        self._metrics.commit_fences.labels("raised" if fenced.raised else "existing").inc()
        if fenced.raised:
            _log.info(
                "table %s fenced at epoch %d from log number %d", table_id, epoch, fenced.fence.from_seq
            )
        return fenced.fence

    def claim(self, table_id: str, seq: int, epoch: int, attempt: str) -> ClaimResult:
        """ClaimCommit: grant ``seq`` to (epoch, attempt) unless another write holds it."""
        validate_claim(table_id, seq, epoch, attempt)
        request = decide.ClaimRequest(table_id, seq, epoch, attempt)
        try:
            result = self._kernel.run(
                "claims_claim",
                {"table_id": table_id, "seq": seq},
                [ReadNode(path) for path in decide.claim_reads(request)],
                lambda reads, pending: decide.claim(request, reads, pending, self._clock.now_ms()),
            )
        except FailedPrecondition:
            self._metrics.commit_claims.labels("refused").inc()
            raise
        self._metrics.commit_claims.labels("granted" if result.granted else "held").inc()
        return result

    def claims(self, table_id: str, from_seq: int, limit: int) -> TableClaims:
        """GetCommitClaims: the fence and the claims from ``from_seq`` on, in number order."""
        size = validate_listing(table_id, from_seq, limit)
        return synced_retry(self._metadata, lambda: self._claims(table_id, from_seq, size))

    def _claims(self, table_id: str, from_seq: int, size: int) -> TableClaims:
        path = table_path(table_id)
        node = self._metadata.get(path)
        with at(path):
            current = decide.stored_table(node)
        if current is None:
            raise NotFound(f"table_id {table_id!r} has no fence and no commit claim")
        numbers = sorted(n for n in map(parse_claim_name, self._metadata.children(path)) if n is not None)
        wanted = [claim_path(table_id, n) for n in numbers if n >= from_seq][:size]
        nodes = self._metadata.get_many(wanted)
        claims: list[CommitClaim] = []
        for claim_node in wanted:
            with at(claim_node):
                held = decide.stored_claim(nodes[claim_node])
            if held is not None:  # removed by the janitor between the listing and the read
                claims.append(held)
        record = current.record
        return TableClaims(record.fence_epoch, tuple(claims), record.next_seq)

    # --- the janitor's step ---------------------------------------------------------------------

    def clean(self, limit: int) -> int:
        """Remove up to ``limit`` claims older than the retention, except each table's highest
        (``domain.claims.removable``); fences are never removed. Returns how many went."""
        now = self._clock.now_ms()
        removed = 0
        for table_id in self._metadata.children(TABLES):
            if removed >= limit:
                break
            if not is_valid_id(table_id):
                _log.warning("ignoring a foreign node %s/%s among the commit claim tables", TABLES, table_id)
                continue
            try:
                gone = self._clean_table(table_id, limit - removed, now)
            except CorruptRecord as e:
                skipped(self._metrics, e, "commit claim cleanup", table_path(table_id))
                continue
            if gone:
                removed += gone
                _log.info("removed %d commit claims of table %s older than the retention", gone, table_id)
        if removed:
            self._metrics.commit_claims_removed.inc(removed)
        return removed

    def _clean_table(self, table_id: str, limit: int, now: int) -> int:
        """Remove up to ``limit`` of one table's claims, ``CLEAN_CHUNK`` per transaction."""
        path = table_path(table_id)
        numbers = sorted(n for n in map(parse_claim_name, self._metadata.children(path)) if n is not None)
        removed = 0
        while removed < limit:
            chunk = min(CLEAN_CHUNK, limit - removed)
            # The lowest claims left, one more than may go: it shows where the removable run stops.
            candidates = numbers[removed : removed + chunk + 1]
            if len(candidates) < 2:
                break  # a lone claim is the table's highest
            cleaned = self._kernel.run(
                "claims_clean",
                {"table_id": table_id},
                [ReadNode(path), *(ReadNode(claim_path(table_id, n)) for n in candidates)],
                lambda reads, pending: decide.clean(
                    table_id,
                    candidates,  # noqa: B023
                    chunk,  # noqa: B023
                    self._policy.retention_ms,
                    reads,
                    now,
                ),
            )
            removed += cleaned.removed
            if cleaned.removed < chunk:
                break  # the run of removable claims ended in this chunk
        return removed
