"""The janitor's producer steps: expire records past their TTL, sweep unreferenced payloads."""

from __future__ import annotations

import logging

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.producer_codec import decode_producer_record
from snapcoord.coordinator.domain.producers import parse_index_entry, producer_of_object
from snapcoord.coordinator.errors import CorruptRecord
from snapcoord.coordinator.kernel.commit import CommitKernel
from snapcoord.coordinator.kernel.corruption import at, skipped
from snapcoord.coordinator.kernel.decision import ReadNode
from snapcoord.coordinator.kernel.orphans import sweep_unreferenced
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.producers import decide
from snapcoord.coordinator.producers.layout import EXPIRY, OBJECT_PREFIX, record_path
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore

_log = logging.getLogger(__name__)


class ProducerJanitor:
    def __init__(
        self,
        kernel: CommitKernel,
        metadata: MetadataStore,
        blobs: BlobStore,
        clock: Clock,
        metrics: CoordinatorMetrics,
    ) -> None:
        self._kernel = kernel
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._metrics = metrics

    def expire_due(self, limit: int) -> int:
        """Delete up to ``limit`` expired records, reading only the expiry buckets that are due
        (the intents their payloads' deletes leave to withdraw go together at the end)."""
        with self._kernel.withdrawing_later():
            return self._expire_due(limit)

    def _expire_due(self, limit: int) -> int:
        now = self._clock.now_ms()
        expired = 0
        index = self._kernel.expiry(EXPIRY)
        for path, name in index.due(now):
            if expired >= limit:
                break
            parsed = parse_index_entry(name)
            if parsed is None:
                _log.warning("ignoring a foreign node %s in the producer expiry index", path)
                continue
            producer_id, registration = parsed
            try:
                outcome = self._kernel.run(
                    "producer_expire",
                    {"producer_id": producer_id},
                    [ReadNode(record_path(producer_id))],
                    lambda reads, pending: decide.expire(producer_id, registration, reads, pending, now),  # noqa: B023
                )
            except CorruptRecord as e:
                # Its entry stays due: counted and logged on every pass until someone repairs it.
                skipped(self._metrics, e, "producer expiry", record_path(producer_id))
                continue
            if outcome == "stale":
                # An index entry without its record cannot arise (they change in one transaction),
                # except from a bug or a hand edit; drop it so it does not stay due forever.
                index.remove(path)
            elif outcome == "expired":
                expired += 1
                _log.info("expired producer offsets of %s (registration %s)", producer_id, registration)
        if expired:
            self._metrics.producer_records_expired.inc(expired)
        return expired

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` payload objects that no record references and that are older than
        ``grace_ms`` (younger ones may belong to a registration still in flight)."""

        def referenced_by(producer_id: str) -> set[str]:
            node = self._metadata.get(record_path(producer_id))
            with at(record_path(producer_id)):
                return set(decode_producer_record(node.data).objects) if node is not None else set()

        # Objects a live intent announces are the intent sweep's (they may be in flight); the
        # intents are read before the listing (``sweep_unreferenced`` says why).
        deleted = sweep_unreferenced(
            self._blobs,
            OBJECT_PREFIX,
            modified_before_ms=self._clock.now_ms() - grace_ms,
            limit=limit,
            owner_of=producer_of_object,
            referenced_by=referenced_by,
            announced=self._kernel.intents.announced_keys,
            corrupt=lambda e: skipped(self._metrics, e, "producer orphan sweep"),
        )
        if deleted:
            self._metrics.orphans_deleted.labels("producer").inc(deleted)
        return deleted
