"""A ``StreamingQueryListener`` that reports an app's committed offsets to snapcoord, from the driver.

Spark posts a progress event after a micro-batch committed (offsets log and commit log written),
on the driver, in the driver's Python process. ``SnapcoordListener`` uses those events for two
things, both keyed by the query's name (``writeStream.queryName(...)``):

- **Generation snapshots** (app = several streaming queries, tasks = query names). When the app's
  current snapshot is CREATED and names a query that has not reported yet, the listener reports the
  query's committed end offsets with its checkpoint location and batch id (``report_task_snapshot``).
  An idle query reports the last batch it committed, on the next ``onQueryIdle`` event. A
  ``SnapshotFenced`` answer (a newer generation exists) is logged and ignored.
- **Backlog tracking** (one backlog job per query). On the query's first progress the listener marks
  the backlog boundary once (``mark_backlog``: the first mark wins, so a restarted driver keeps the
  original boundary) and reports the end offsets of every batch (``report_progress``).

Offsets: Spark's per-source ``endOffset`` JSON becomes ``Offset(stream, partition, offset)``:

- file source ``{"logOffset": N}`` -> ``Offset(<stream>, 0, N)``;
- a bare number (rate, memory sources) ``N`` -> ``Offset(<stream>, 0, N)``;
- Kafka-like ``{"topic": {"0": 12, "1": 7}}`` -> ``Offset("topic", 0, 12)``, ``Offset("topic", 1, 7)``
  (``<alias>:topic`` when the source has an alias);
- anything else is left out (logged once per source).

``<stream>`` is ``<query name>.<source index>`` (characters outside ``[A-Za-z0-9._:-]``, which the
coordinator refuses, become ``_``) unless ``stream_names`` gives the query's sources aliases by
source index. Source descriptions (``FileStreamSource[file:/in]``) are not used: they contain
characters the coordinator refuses and change when a path changes.

Listener callbacks run on Spark's listener bus: every coordinator call here has a short deadline
(``call_timeout_s``) and every failure is logged and swallowed, so a slow or absent coordinator never
stalls the query. What failed is retried on the next event.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    SourceProgress,
    StreamingQueryListener,
    StreamingQueryProgress,
)

from snapcoord.client import (
    BacklogStatus,
    CoordinatorClient,
    Offset,
    ProgressResult,
    SnapcoordError,
    SnapshotFenced,
    SnapshotState,
    TaskSnapshot,
)
from snapcoord.spark_connector.driver import DriverOnly, require_driver

_log = logging.getLogger(__name__)

#: Checkpoint map keys of a query's report (small UTF-8 payloads; see ``app_snapshots.restore_plan``).
CHECKPOINT_KEY = "checkpoint"
BATCH_ID_KEY = "batch_id"
SOURCES_KEY = "sources"

_NOT_A_STREAM_CHAR = re.compile(r"[^A-Za-z0-9._:-]")
_NO_OFFSET = (None, "null", "None")


def default_stream_name(query_name: str, source_index: int) -> str:
    """``<query name>.<source index>`` in the characters the coordinator accepts."""
    return _NOT_A_STREAM_CHAR.sub("_", f"{query_name}.{source_index}")


def parse_end_offset(
    stream: str, offset_json: str | None, *, alias: bool = False
) -> tuple[Offset, ...] | None:
    """Map one source's offset JSON to ``Offset`` values; None when the format is unknown.

    ``stream`` names single-stream sources; for Kafka-like offsets the topic names the stream (as
    ``<stream>:<topic>`` when ``alias`` is true). A missing offset (``None``, ``"null"``) maps to ().
    """
    if offset_json in _NO_OFFSET:
        return ()
    assert offset_json is not None
    try:
        value = json.loads(offset_json)
    except ValueError:
        return None
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (Offset(stream, 0, value),)
    if not isinstance(value, dict):
        return None
    log_offset = value.get("logOffset")
    if len(value) == 1 and isinstance(log_offset, int) and not isinstance(log_offset, bool):
        return (Offset(stream, 0, log_offset),)
    offsets: list[Offset] = []
    for topic, partitions in sorted(value.items()):
        if not isinstance(partitions, dict):
            return None
        name = f"{stream}:{topic}" if alias else str(topic)
        for partition, position in partitions.items():
            if not (isinstance(position, int) and not isinstance(position, bool)):
                return None
            try:
                offsets.append(Offset(name, int(partition), position))
            except ValueError:
                return None
    return tuple(sorted(offsets, key=lambda o: (o.stream, o.partition)))


@dataclass(frozen=True)
class CommittedBatch:
    """What the listener last saw committed for one query (from its progress event)."""

    query_name: str
    batch_id: int
    offsets: tuple[Offset, ...]
    #: One ``(description, endOffset JSON or None)`` per source, in the query's source order.
    sources: tuple[tuple[str, str | None], ...]
    #: The ``latestOffset`` of each source (None where the source does not report one).
    latest_offsets: tuple[Offset, ...]


class SnapcoordListener(StreamingQueryListener, DriverOnly):
    """Reports committed offsets of the app's queries to snapshots and backlog jobs.

    ``checkpoints`` maps each query name of the app to its checkpoint location (Spark's progress
    events do not carry it); queries not named there are ignored. ``backlog_jobs`` maps query
    names to backlog job ids (one query per job); ``backlog_boundaries`` optionally gives a job's
    boundary in the listener's stream naming. Without it the boundary is the first progress's
    ``latestOffset`` when the sources report one (Kafka does), else its ``endOffset`` (the file
    source reports no latest offset: pass the boundary when the backlog spans several batches).
    """

    def __init__(
        self,
        client: CoordinatorClient,
        app_id: str,
        checkpoints: Mapping[str, str],
        *,
        backlog_jobs: Mapping[str, str] | None = None,
        backlog_boundaries: Mapping[str, Sequence[Offset]] | None = None,
        stream_names: Mapping[str, Sequence[str]] | None = None,
        call_timeout_s: float = 2.0,
    ) -> None:
        require_driver("SnapcoordListener")
        super().__init__()
        if call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be positive, got {call_timeout_s}")
        self._client = client
        self._app_id = app_id
        self._checkpoints = dict(checkpoints)
        self._jobs = dict(backlog_jobs or {})
        unknown = set(self._jobs) - set(self._checkpoints)
        if unknown:
            raise ValueError(f"backlog_jobs names queries without a checkpoint location: {sorted(unknown)}")
        self._boundaries = {k: tuple(v) for k, v in (backlog_boundaries or {}).items()}
        self._stream_names = {k: tuple(v) for k, v in (stream_names or {}).items()}
        self._timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._names_by_id: dict[str, str] = {}
        self._last: dict[str, CommittedBatch] = {}
        self._reported: set[tuple[int, str]] = set()
        self._marks: dict[str, BacklogStatus] = {}
        self._progress: dict[str, ProgressResult] = {}
        self._unknown_formats: set[str] = set()
        self.errors = 0  # coordinator calls that failed (logged); for tests and metrics

    # -- what the listener learned ----------------------------------------------------------------
    def last_committed(self, query_name: str) -> CommittedBatch | None:
        with self._lock:
            return self._last.get(query_name)

    def backlog_mark(self, job_id: str) -> BacklogStatus | None:
        """The job's mark as the coordinator answered it (the original one after a restart)."""
        with self._lock:
            return self._marks.get(job_id)

    def last_progress_result(self, job_id: str) -> ProgressResult | None:
        with self._lock:
            return self._progress.get(job_id)

    def reported_generations(self, query_name: str) -> list[int]:
        with self._lock:
            return sorted(g for g, name in self._reported if name == query_name)

    # -- StreamingQueryListener ---------------------------------------------------------------------
    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        if event.name in self._checkpoints:
            with self._lock:
                self._names_by_id[str(event.id)] = event.name

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        try:
            self._on_progress(event.progress)
        except Exception:  # never let a bug here fail Spark's listener bus
            _log.exception("snapcoord listener: progress event of %s not handled", event.progress.name)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        with self._lock:
            name = self._names_by_id.get(str(event.id))
            batch = self._last.get(name) if name is not None else None
        if batch is None:
            return
        try:
            self._maybe_report_snapshot(batch)
        except Exception:
            _log.exception("snapcoord listener: idle event of %s not handled", name)

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass

    # -- internals ----------------------------------------------------------------------------------
    def _on_progress(self, progress: StreamingQueryProgress) -> None:
        name = progress.name
        if name is None or name not in self._checkpoints:
            return
        batch = self._committed_batch(name, progress)
        with self._lock:
            self._names_by_id[str(progress.id)] = name
            self._last[name] = batch
        self._maybe_report_snapshot(batch)
        job_id = self._jobs.get(name)
        if job_id is not None:
            self._report_backlog(job_id, batch)

    def _stream_name(self, query_name: str, index: int, source: SourceProgress) -> tuple[str, bool]:
        aliases = self._stream_names.get(query_name, ())
        if index < len(aliases):
            return aliases[index], True
        return default_stream_name(query_name, index), False

    def _parse(
        self, query_name: str, index: int, source: SourceProgress, offset_json: str | None
    ) -> tuple[Offset, ...]:
        stream, alias = self._stream_name(query_name, index, source)
        parsed = parse_end_offset(stream, offset_json, alias=alias)
        if parsed is None:
            key = f"{query_name}/{index}"
            if key not in self._unknown_formats:
                self._unknown_formats.add(key)
                _log.warning(
                    "snapcoord listener: offsets of source %d of %s (%s) have an unknown format %r; left out",
                    index,
                    query_name,
                    source.description,
                    offset_json,
                )
            return ()
        return parsed

    def _committed_batch(self, name: str, progress: StreamingQueryProgress) -> CommittedBatch:
        offsets: list[Offset] = []
        latest: list[Offset] = []
        sources: list[tuple[str, str | None]] = []
        for index, source in enumerate(progress.sources):
            end = None if source.endOffset in _NO_OFFSET else source.endOffset
            sources.append((source.description, end))
            offsets.extend(self._parse(name, index, source, end))
            if source.latestOffset not in _NO_OFFSET:
                latest.extend(self._parse(name, index, source, source.latestOffset))
        return CommittedBatch(name, progress.batchId, tuple(offsets), tuple(sources), tuple(latest))

    def _maybe_report_snapshot(self, batch: CommittedBatch) -> None:
        try:
            current = self._client.get_current_snapshot(self._app_id, timeout_s=self._timeout_s)
        except SnapcoordError as e:
            self._failed("get_current_snapshot", e)
            return
        key = (current.generation, batch.query_name)
        if current.state is not SnapshotState.CREATED or batch.query_name not in current.task_ids:
            return
        with self._lock:
            if key in self._reported:
                return
        report = TaskSnapshot(
            batch.query_name,
            batch.offsets,
            {
                CHECKPOINT_KEY: self._checkpoints[batch.query_name].encode(),
                BATCH_ID_KEY: str(batch.batch_id).encode(),
                SOURCES_KEY: json.dumps([list(s) for s in batch.sources]).encode(),
            },
        )
        try:
            self._client.report_task_snapshot(
                self._app_id, current.generation, report, timeout_s=self._timeout_s
            )
        except SnapshotFenced as e:
            _log.info(
                "snapcoord listener: report of %s for %s generation %d fenced (%s); ignored",
                batch.query_name,
                self._app_id,
                current.generation,
                e.details,
            )
        except SnapcoordError as e:
            self._failed("report_task_snapshot", e)
            return
        else:
            _log.info(
                "snapcoord listener: %s reported batch %d to %s generation %d",
                batch.query_name,
                batch.batch_id,
                self._app_id,
                current.generation,
            )
        with self._lock:
            self._reported.add(key)

    def _report_backlog(self, job_id: str, batch: CommittedBatch) -> None:
        with self._lock:
            marked = job_id in self._marks
        if not marked:
            boundaries = self._boundaries.get(batch.query_name) or batch.latest_offsets or batch.offsets
            try:
                status = self._client.mark_backlog(job_id, boundaries, timeout_s=self._timeout_s)
            except SnapcoordError as e:
                self._failed("mark_backlog", e)
                return  # retried on the next event; no progress before the mark
            with self._lock:
                self._marks[job_id] = status
            _log.info(
                "snapcoord listener: backlog of %s marked: %s",
                job_id,
                [(p.stream, p.partition, p.boundary) for p in status.partitions],
            )
        if not batch.offsets:
            return
        try:
            result = self._client.report_progress(job_id, batch.offsets, timeout_s=self._timeout_s)
        except SnapcoordError as e:
            self._failed("report_progress", e)
            return
        with self._lock:
            self._progress[job_id] = result
        if result.newly_finished:
            _log.info(
                "snapcoord listener: %s finished backlog partitions %s", job_id, list(result.newly_finished)
            )

    def _failed(self, what: str, error: SnapcoordError) -> None:
        with self._lock:
            self.errors += 1
        _log.warning(
            "snapcoord listener: %s failed (%s: %s); retried on the next event",
            what,
            error.code,
            error.details,
        )
