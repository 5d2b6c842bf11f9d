"""The janitor's backlog steps: sweep unreferenced boundaries objects, compute the gauges."""

from __future__ import annotations

from snapcoord.coordinator.backlog.decide import stored_job
from snapcoord.coordinator.backlog.layout import JOBS, job_path, parse_marker, shard_name
from snapcoord.coordinator.domain.backlog import OBJECT_PREFIX, job_of_object
from snapcoord.coordinator.domain.backlog_codec import decode_unmarked
from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.errors import CorruptRecord
from snapcoord.coordinator.kernel.commit import CommitKernel
from snapcoord.coordinator.kernel.corruption import at, skipped
from snapcoord.coordinator.kernel.orphans import sweep_unreferenced
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore


class BacklogJanitor:
    """``gauges_stale_after_ms`` is how long the values of the last gauge pass stay exported (a
    replica that stopped leading then exports 0)."""

    def __init__(
        self,
        kernel: CommitKernel,
        metadata: MetadataStore,
        blobs: BlobStore,
        clock: Clock,
        metrics: CoordinatorMetrics,
        *,
        gauges_stale_after_ms: int,
    ) -> None:
        self._kernel = kernel
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._metrics = metrics
        self._gauges_stale_after_ms = gauges_stale_after_ms
        # (jobs, partitions remaining, partitions unmarked, computed at ms)
        self._gauges: tuple[int, int, int, int] | None = None
        metrics.backlog_jobs_processing.set_function(lambda: self._gauge(0))
        metrics.backlog_partitions_remaining.set_function(lambda: self._gauge(1))
        metrics.backlog_partitions_unmarked.set_function(lambda: self._gauge(2))

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` boundaries objects that no job record references and that are
        older than ``grace_ms`` (younger ones may belong to a mark still in flight)."""

        def referenced_by(job_id: str) -> set[str]:
            with at(job_path(job_id)):
                current = stored_job(job_id, self._metadata.get(job_path(job_id)))
            return {current.record.object_key} if current else set()

        # Objects a live intent announces are the intent sweep's (they may be in flight); the
        # intents are read before the listing (``sweep_unreferenced`` says why).
        deleted = sweep_unreferenced(
            self._blobs,
            OBJECT_PREFIX,
            modified_before_ms=self._clock.now_ms() - grace_ms,
            limit=limit,
            owner_of=job_of_object,
            referenced_by=referenced_by,
            announced=self._kernel.intents.announced_keys,
            corrupt=lambda e: skipped(self._metrics, e, "backlog orphan sweep"),
        )
        if deleted:
            self._metrics.orphans_deleted.labels("backlog").inc(deleted)
        return deleted

    def refresh_gauges(self) -> int:
        """Count jobs still processing backlog and their unfinished partitions: one ``children``
        call per job (the remaining markers), none per partition; and the partitions reports
        named unmarked: one read per job that has an unmarked set (of its current mark, the one
        whose first shard is listed). Removes nothing: returns 0."""
        jobs = partitions = unmarked = 0
        for job_id in self._metadata.children(JOBS):
            names = self._metadata.children(job_path(job_id))
            counts = [m[2] for m in map(parse_marker, names) if m]
            if counts:
                jobs += 1
                partitions += sum(counts)
            listed = set(names)
            for name in names:
                if name.startswith("u-") and shard_name(name[2:], 0) in listed:
                    unmarked += self._unmarked_count(f"{job_path(job_id)}/{name}")
        self._gauges = (jobs, partitions, unmarked, self._clock.now_ms())
        return 0

    def _unmarked_count(self, path: str) -> int:
        node = self._metadata.get(path)
        if node is None:
            return 0  # a grow, reset or clear since the listing
        try:
            with at(path):
                return len(decode_unmarked(node.data))
        except CorruptRecord as e:
            skipped(self._metrics, e, "backlog gauges")
            return 0

    def _gauge(self, which: int) -> float:
        gauges = self._gauges
        if gauges is None or self._clock.now_ms() - gauges[3] > self._gauges_stale_after_ms:
            return 0.0
        return float(gauges[which])
