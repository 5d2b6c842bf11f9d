"""A ``StreamingQueryListener`` that keeps the backlog jobs of an app's queries on snapcoord.

Spark posts a progress event after a micro-batch committed (offsets log and commit log written),
on the driver, in the driver's Python process; under Spark Connect, PySpark >= 4 delivers the
events to the client process, where this listener runs (it is never pickled). For each query named
in ``backlog_jobs`` (``writeStream.queryName(...)`` -> job id), ``SnapcoordListener`` hands every
progress to that query's ``BacklogTracker`` (``backlog``): the mark, the FLIP-309 lag bound that
turns the processing-backlog flag on again, and retry-safe progress reports. It does not take
snapshots: ``app_snapshots.take_snapshot`` reads the queries' checkpoints itself.

A query run by ``BacklogAwareRunner`` needs no listener for its job: the runner feeds its own
tracker from the query's ``recentProgress``, which also works where no listener can run.

Offsets are read with ``sources.offsets_of_sources``: one stream per source, ``<query>.<index>``
or the alias in ``stream_names``; Kafka sources ``<stream>:<topic>``; custom sources need a parser.

Listener callbacks run on Spark's listener bus: every coordinator call here has a short deadline
(``call_timeout_s``) and every failure is logged and kept pending, never raised, so a slow or absent
coordinator never stalls the query. What failed is sent again with the next event, or by ``flush()``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

from snapcoord.client import BacklogStatus, CoordinatorClient, ProgressResult
from snapcoord.spark_connector.backlog.tracker import (
    BacklogBound,
    BacklogTracker,
    BatchOffsets,
    LatestOffsets,
)
from snapcoord.spark_connector.driver import DriverOnly, require_driver
from snapcoord.spark_connector.sources import OffsetParser

_log = logging.getLogger(__name__)


class SnapcoordListener(StreamingQueryListener, DriverOnly):
    """Reports the progress of the queries in ``backlog_jobs`` (query name -> job id) to their
    backlog jobs, one ``BacklogTracker`` per query; queries not named there are ignored.

    ``bound`` applies to every query; ``latest_offsets``, ``stream_names`` and ``parsers`` are per
    query name (see ``BacklogTracker``). Without ``latest_offsets`` a query's boundary is its
    first progress's ``latestOffset`` where the sources report one (Kafka does), else that batch's
    end offsets (the file source reports no latest offset: give ``latest_offsets`` when the
    backlog spans several batches).
    """

    def __init__(
        self,
        client: CoordinatorClient,
        backlog_jobs: Mapping[str, str],
        *,
        bound: BacklogBound | None = None,
        latest_offsets: Mapping[str, LatestOffsets] | None = None,
        stream_names: Mapping[str, Sequence[str | None]] | None = None,
        parsers: Mapping[str, Mapping[int, OffsetParser]] | None = None,
        call_timeout_s: float = 2.0,
    ) -> None:
        require_driver("SnapcoordListener")
        super().__init__()
        if call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be positive, got {call_timeout_s}")
        self.trackers: dict[str, BacklogTracker] = {
            query: BacklogTracker(
                client,
                job_id,
                query,
                bound=bound,
                latest_offsets=(latest_offsets or {}).get(query),
                stream_names=(stream_names or {}).get(query),
                parsers=(parsers or {}).get(query),
                call_timeout_s=call_timeout_s,
            )
            for query, job_id in backlog_jobs.items()
        }
        self._by_job = {t.job_id: t for t in self.trackers.values()}

    # -- what the listener learned ----------------------------------------------------------------
    def last_batch(self, query_name: str) -> BatchOffsets | None:
        """The offsets of the query's last committed batch this listener saw."""
        tracker = self.trackers.get(query_name)
        return tracker.last_batch if tracker is not None else None

    def backlog_mark(self, job_id: str) -> BacklogStatus | None:
        """The job's mark as the coordinator answered it (the original one after a restart)."""
        tracker = self._by_job.get(job_id)
        return tracker.mark if tracker is not None else None

    def last_progress_result(self, job_id: str) -> ProgressResult | None:
        tracker = self._by_job.get(job_id)
        return tracker.last_result if tracker is not None else None

    @property
    def errors(self) -> int:
        """Coordinator calls that failed (logged and retried); for tests and metrics."""
        return sum(t.errors for t in self.trackers.values())

    def flush(self) -> bool:
        """Send every pending mark and report now; True when nothing is left pending."""
        return all([t.flush() for t in self.trackers.values()])

    # -- StreamingQueryListener ---------------------------------------------------------------------
    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        tracker = self.trackers.get(progress.name) if progress.name is not None else None
        if tracker is None:
            return
        try:
            tracker.observe(progress)
        except Exception:  # never let a bug here fail Spark's listener bus
            _log.exception("snapcoord listener: progress event of %s not handled", progress.name)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        # An idle query sends no progress: deliver what an earlier event could not.
        for tracker in self.trackers.values():
            if tracker.pending:
                tracker.flush()

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass
