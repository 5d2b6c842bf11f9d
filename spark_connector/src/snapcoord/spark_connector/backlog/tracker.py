"""FLIP-309's processing-backlog signal for one streaming query, kept on the coordinator.

A ``BacklogTracker`` turns the query's progress (one ``StreamingQueryProgress`` per committed
micro-batch) into the coordinator's backlog calls for one job:

- **Mark.** On the first batch it sees, the tracker marks the boundary: the sources' latest
  offsets (``latest_offsets()`` when given, else the progress's ``latestOffset`` where the source
  reports one, as Kafka does, else the batch's end offsets). The first mark wins, so a restarted
  driver keeps a backlog it had not finished.
- **Backlog on again.** The flag turns on again, by a mark with ``reset``, when the query is behind
  by more than ``BacklogBound.max_lag`` (the sources' latest offsets minus the batch's end offsets,
  summed over partitions: records for Kafka, files-log entries for the file source) while the
  coordinator says it has caught up; or on the next batch after ``request_backlog()`` (the runner
  asks for it when a restart follows more than ``BacklogBound.max_downtime_s`` of downtime).
- **Sources that grow.** A partition that appears after the mark (a Kafka topic given more
  partitions, a table more buckets, any source whose offsets name a partition the mark lacks) is
  marked at the source's latest offset for it as of the batch that shows it first (the latest
  offsets as above, else the batch's end offset for it): the coordinator adds it to the stored
  mark and keeps every other partition's boundary and progress. A partition the coordinator
  answers as unmarked in a report (the mark was made elsewhere, or a grow is not delivered yet)
  is marked the same way, in the same ``flush``. While such a partition is behind, the flag is on
  again, and ``observe`` says so. ``mark_partitions`` does the same for offsets the driver learns
  of itself (an admin client listing a topic's partitions). A grow the coordinator refuses (past
  its partition limit) is logged, counted and dropped (``refused``), not sent again: it must not
  hold the reports back.
- **Off when caught up.** Every batch reports its end offsets; the coordinator turns the flag off
  once every partition reached its boundary.
- **No report lost.** A report carries a deterministic id, ``<run id>.<batch id>``, so sending it
  again (after a lost reply, a deadline, a coordinator outage) is safe and answers the same
  ``newly_finished``. A failed mark or report stays pending and is sent again, in order, by the
  next ``observe`` or by ``flush()``, which the runner calls while it polls: the last batch of an
  AvailableNow query, after which no progress comes, is still delivered.

Every coordinator call has a short deadline (``call_timeout_s``) and failures are logged, counted
(``errors``) and retried later, never raised: the tracker runs beside a live query.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.streaming.listener import StreamingQueryProgress

from snapcoord.client import (
    BacklogStatus,
    CoordinatorClient,
    InvalidArgument,
    Offset,
    ProgressResult,
    SnapcoordError,
)
from snapcoord.spark_connector.sources import OffsetParser, UnknownOffsetFormat, offsets_of_sources

_log = logging.getLogger(__name__)

#: ``latest_offsets()``: the sources' latest offsets now, named as the tracker names its streams.
LatestOffsets = Callable[[], Sequence[Offset]]


@dataclass(frozen=True)
class BacklogBound:
    """How far behind a query may fall before it counts as processing backlog again.

    ``max_lag``: offsets behind the sources' latest ones (None: never by lag). ``max_downtime_s``:
    a restart after longer without a committed batch starts with the catch-up trigger (None:
    never by downtime; the runner reads the time of the last batch from the checkpoint).
    """

    max_lag: int | None = None
    max_downtime_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_lag is not None and self.max_lag < 0:
            raise ValueError(f"max_lag must be 0 or more, got {self.max_lag}")
        if self.max_downtime_s is not None and self.max_downtime_s < 0:
            raise ValueError(f"max_downtime_s must be 0 or more, got {self.max_downtime_s}")


@dataclass(frozen=True)
class BatchOffsets:
    """The offsets of one committed micro-batch, in the tracker's stream naming."""

    run_id: str
    batch_id: int
    end: tuple[Offset, ...]
    #: The sources' latest offsets where known (the progress's ``latestOffset``), else ().
    latest: tuple[Offset, ...]

    @property
    def report_id(self) -> str:
        """The same for every sending of this batch's report, unique across runs and batches."""
        return f"{self.run_id}.{self.batch_id}"


def lag(end: Sequence[Offset], latest: Sequence[Offset]) -> int | None:
    """How far ``end`` is behind ``latest``, summed over the partitions ``latest`` names (a
    partition missing from ``end`` counts from 0); None when ``latest`` names none."""
    if not latest:
        return None
    at = {(o.stream, o.partition): o.offset for o in end}
    return sum(max(0, o.offset - max(0, at.get((o.stream, o.partition), 0))) for o in latest)


def batch_offsets(
    progress: StreamingQueryProgress,
    query_name: str,
    stream_names: Sequence[str | None] | None = None,
    parsers: Mapping[int, OffsetParser] | None = None,
) -> BatchOffsets:
    """The end and latest offsets of a progress (``UnknownOffsetFormat`` for an unknown source)."""
    end = offsets_of_sources(query_name, [s.endOffset for s in progress.sources], stream_names, parsers)
    latest_jsons = [s.latestOffset for s in progress.sources]
    latest: tuple[Offset, ...] = ()
    if any(j not in (None, "null") for j in latest_jsons):
        latest = offsets_of_sources(query_name, latest_jsons, stream_names, parsers)
    return BatchOffsets(str(progress.runId), int(progress.batchId), end, latest)


class BacklogTracker:
    """Marks and reports one query's backlog as one coordinator job (see the module docstring).

    Thread-safe: a listener calls ``observe`` from Spark's listener bus while the driver reads.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        job_id: str,
        query_name: str,
        *,
        bound: BacklogBound | None = None,
        latest_offsets: LatestOffsets | None = None,
        stream_names: Sequence[str | None] | None = None,
        parsers: Mapping[int, OffsetParser] | None = None,
        call_timeout_s: float = 2.0,
    ) -> None:
        if call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be positive, got {call_timeout_s}")
        self._client = client
        self.job_id = job_id
        self.query_name = query_name
        self.bound = bound or BacklogBound()
        self._latest_offsets = latest_offsets
        self._stream_names = tuple(stream_names) if stream_names is not None else None
        self._parsers = dict(parsers or {})
        self._timeout_s = call_timeout_s
        self._lock = threading.RLock()
        self._seen: set[tuple[str, int]] = set()
        self._reset_requested = False
        self._pending_mark: tuple[tuple[Offset, ...], bool] | None = None
        self._pending_report: tuple[str, tuple[Offset, ...]] | None = None
        #: The partitions of the stored mark, as the coordinator last listed them.
        self._marked: frozenset[tuple[str, int]] = frozenset()
        #: The sources' latest offset of each partition, as of the last batch (grows use them).
        self._latest_seen: dict[tuple[str, int], int] = {}
        #: The mark as the coordinator answered this tracker's last mark (None: not marked yet).
        self.mark: BacklogStatus | None = None
        #: The job's flag as the coordinator last answered it (None: not known yet).
        self.processing_backlog: bool | None = None
        self.last_result: ProgressResult | None = None
        self.last_batch: BatchOffsets | None = None
        #: Marks with reset this tracker made (backlog turned on again).
        self.resets = 0
        #: The partitions this tracker's marks added to the stored mark (a source that grew), with
        #: the boundaries the coordinator stored, in the order they were added.
        self.added: list[Offset] = []
        #: Partitions whose grow the coordinator refused (past its partition limit): not marked
        #: again by this tracker.
        self.refused: set[tuple[str, int]] = set()
        self.errors = 0  # coordinator calls that failed (logged, retried)

    # -- what the driver asks ---------------------------------------------------------------------
    def request_backlog(self) -> None:
        """Turn the flag on again with the next batch (a mark with reset at its offsets)."""
        with self._lock:
            self._reset_requested = True

    @property
    def pending(self) -> bool:
        """A mark or report not delivered yet."""
        with self._lock:
            return self._pending_mark is not None or self._pending_report is not None

    def mark_partitions(self, offsets: Sequence[Offset]) -> tuple[Offset, ...]:
        """Mark the partitions of ``offsets`` that the stored mark lacks, each at the offset given
        (its source's latest offset now), with the next ``flush``; returns the ones queued. The
        partitions already marked keep their boundary (the coordinator keeps each partition's
        first). Nothing is queued before the first mark: that one names every partition."""
        with self._lock:
            if self.mark is None and self._pending_mark is None:
                return ()
            queued = {(o.stream, o.partition) for o in (self._pending_mark or ((), False))[0]}
            known = self._marked | queued | self.refused
            new = tuple(o for o in offsets if (o.stream, o.partition) not in known)
            if new:
                boundaries, reset = self._pending_mark or ((), False)
                self._pending_mark = (boundaries + new, reset)
                _log.info("backlog of %s: partitions appeared, marking %s", self.job_id, list(new)[:20])
            return new

    def caught_up(self) -> bool:
        """Marked by this tracker, everything delivered, and the coordinator says not behind."""
        with self._lock:
            return (
                self.mark is not None
                and not self._reset_requested
                and not self.pending
                and self.processing_backlog is False
            )

    # -- progress -----------------------------------------------------------------------------------
    def observe(self, progress: StreamingQueryProgress) -> bool:
        """Handle one committed batch (each once; repeats are ignored). True when this batch turned
        the backlog flag on again (a reset because of lag or ``request_backlog``)."""
        key = (str(progress.runId), int(progress.batchId))
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            try:
                batch = batch_offsets(progress, self.query_name, self._stream_names, self._parsers)
            except (UnknownOffsetFormat, ValueError) as e:
                self._failed("parse offsets", str(e))
                return False
            return self._observe(batch)

    def _observe(self, batch: BatchOffsets) -> bool:
        self.last_batch = batch
        latest = self._latest(batch)
        boundaries = latest or batch.end
        turned_on = False
        if not boundaries:
            return False  # no source has an offset yet: nothing to mark or report
        was_processing = self.processing_backlog
        added_before = len(self.added)
        self._latest_seen = {(o.stream, o.partition): o.offset for o in latest}
        if self.mark is None and self._pending_mark is None:
            self._pending_mark = (boundaries, self._reset_requested)
            turned_on = self._reset_requested
        elif self._reset_requested:
            self._pending_mark = (boundaries, True)
            turned_on = True
        else:
            behind = lag(batch.end, latest)
            limit = self.bound.max_lag
            caught_up = self.processing_backlog is False
            if limit is not None and behind is not None and behind > limit and caught_up:
                _log.info(
                    "backlog of %s: %s is %d behind its sources (bound %d): backlog again",
                    self.job_id,
                    self.query_name,
                    behind,
                    limit,
                )
                self._pending_mark = (latest, True)
                turned_on = True
        self._reset_requested = False
        if self.mark is not None or self._pending_mark is not None:
            self.mark_partitions(self._appeared(latest, batch.end))
        if batch.end:
            self._pending_report = (batch.report_id, batch.end)
        self.flush()
        # A partition added while the job was caught up, and behind: backlog again.
        grew = len(self.added) > added_before
        return turned_on or (grew and was_processing is False and self.processing_backlog is True)

    def _appeared(self, latest: Sequence[Offset], end: Sequence[Offset]) -> tuple[Offset, ...]:
        """The partitions of ``latest`` and ``end`` that the stored mark lacks, each at its latest
        offset (its end offset where no latest one is known, or where that is higher)."""
        at: dict[tuple[str, int], int] = {}
        for o in (*latest, *end):
            key = (o.stream, o.partition)
            if key not in self._marked:
                at[key] = max(at.get(key, o.offset), o.offset)
        return tuple(Offset(s, p, o) for (s, p), o in sorted(at.items()))

    def _latest(self, batch: BatchOffsets) -> tuple[Offset, ...]:
        if self._latest_offsets is None:
            return batch.latest
        try:
            return tuple(self._latest_offsets())
        except Exception as e:  # the user's callable: log, fall back to what the progress says
            self._failed("latest_offsets()", repr(e))
            return batch.latest

    def flush(self) -> bool:
        """Send what is pending (the mark first); True when nothing is left pending. A report
        answering partitions as unmarked queues their mark, sent before this returns."""
        with self._lock:
            if not self._send():
                return False
            if self._pending_mark is not None:  # queued by the report's unmarked partitions
                return self._send()
            return True

    def _send(self) -> bool:
        """The pending mark, then the pending report; False when one failed (kept pending)."""
        with self._lock:
            if self._pending_mark is not None and not self._send_mark(*self._pending_mark):
                return False
            if self._pending_report is not None:
                report_id, positions = self._pending_report
                try:
                    result = self._client.report_progress(
                        self.job_id, positions, report_id=report_id, timeout_s=self._timeout_s
                    )
                except SnapcoordError as e:
                    self._failed("report_progress", f"{e.code}: {e.details}")
                    return False
                self._pending_report = None
                self.last_result, self.processing_backlog = result, result.status.processing_backlog
                if result.newly_finished:
                    _log.info("backlog of %s: finished %s", self.job_id, list(result.newly_finished)[:20])
                if result.unmarked:
                    # Marked elsewhere without them, or their grow was lost: mark them now, at the
                    # latest offset known for each (else the position just reported).
                    seen = self._latest_seen
                    self._marked -= {(o.stream, o.partition) for o in result.unmarked}
                    at = [max(o.offset, seen.get((o.stream, o.partition), -1)) for o in result.unmarked]
                    self.mark_partitions(
                        [Offset(o.stream, o.partition, a) for o, a in zip(result.unmarked, at, strict=True)]
                    )
            return True

    def _send_mark(self, boundaries: tuple[Offset, ...], reset: bool) -> bool:
        """Send the pending mark; False when it failed and stays pending."""
        try:
            status = self._client.mark_backlog(
                self.job_id, boundaries, reset=reset, timeout_s=self._timeout_s
            )
        except InvalidArgument as e:
            if reset or self.mark is None:
                self._failed("mark_backlog", f"{e.code}: {e.details}")
                return False
            # A grow the coordinator refuses (past --backlog-max-partitions): sending it again
            # cannot help, and holding it would hold every report back. The partitions stay
            # unmarked (not backlog) and are not asked for again.
            self.errors += 1
            self.refused.update((o.stream, o.partition) for o in boundaries)
            self._pending_mark = None
            _log.error(
                "backlog of %s: the coordinator refused to mark %d partitions its sources added "
                "(%s); they are not tracked as backlog. Raise the limit, or mark the job again "
                "with reset",
                self.job_id,
                len(boundaries),
                e.details,
            )
            return True
        except SnapcoordError as e:
            self._failed("mark_backlog", f"{e.code}: {e.details}")
            return False
        self._pending_mark = None
        self.mark, self.processing_backlog = status, status.processing_backlog
        self._marked = frozenset((p.stream, p.partition) for p in status.partitions)
        self.added += status.added
        if reset:
            self.resets += 1
        _log.info(
            "backlog of %s %s: %s",
            self.job_id,
            "reset" if reset else "grown" if status.added else "marked",
            [(o.stream, o.partition, o.offset) for o in status.added]
            or [(p.stream, p.partition, p.boundary) for p in status.partitions][:20],
        )
        return True

    def _failed(self, what: str, why: str) -> None:
        self.errors += 1
        _log.warning(
            "backlog of %s (%s): %s failed (%s); retried later", self.job_id, self.query_name, what, why
        )
