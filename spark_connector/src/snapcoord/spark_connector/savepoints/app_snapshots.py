"""Snapshots of a Spark app made of several streaming queries, taken from the driver.

``take_snapshot`` starts a generation snapshot whose tasks are the app's query names and reports
every query itself, from the checkpoints, without waiting for Spark's progress events: so idle,
just-restarted, ``AvailableNow`` and stopped queries complete a snapshot at once, and it works the
same under Spark Connect. For each query it

1. cuts the checkpoint (at any location Spark can use, reached through ``storage.open_location``)
   at its last committed batch ``N``;
2. reads the sink's positions right after batch ``N`` (``RestorableSink.batch_end_positions``);
3. streams what a restart from ``N`` needs (``checkpoint_archive``: metadata, offsets, commits,
   source logs, state up to ``N+1``) straight from the checkpoint's store to the coordinator as the
   task's ``archive`` checkpoint (the coordinator's chunked upload: no single gRPC message limits it,
   no local copy is made; files Spark purges meanwhile make it cut again) and reports it with the
   small keys ``checkpoint``, ``batch_id``, ``sources`` and ``sink_positions``.

The coordinator owns the copy from then on: retention, leases, the janitor. ``restore`` rebuilds
checkpoints and rolls sinks back from it.

**The cut.** A query ``B`` may read the sink of a query ``A`` (``SnapshotQuery.reads_from``). The
snapshot is consistent when nothing ``B``'s snapshot consumed is missing from ``A``'s: ``B``'s
cut batch read only output of ``A`` that lies below ``A``'s recorded sink positions. Queries are
therefore cut *downstream first*: ``B`` first, then ``A``. Once every reader of ``A`` is cut, the
newest output any of them can have read is ``A``'s newest visible sink output at that moment, of
batch ``k`` (``last_batch_id``). ``A``'s sink makes a batch visible before Spark writes the batch's
commit log entry, so ``A`` is cut only when its checkpoint has committed batch ``k`` or later
(waiting within ``timeout_s``): its positions then lie at or above everything its readers saw.
``A`` may have moved on further; that is fine, ``B`` reads the rest after a restore. A reader must
read only ``A``'s committed output for this to hold (``PartitionedFileSink.read``, or a file
stream over a table it publishes files into only at commit).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from snapcoord.client import (
    CoordinatorClient,
    Offset,
    Snapshot,
    SnapshotFenced,
    SnapshotState,
    TaskSnapshot,
    Unavailable,
)
from snapcoord.spark_connector.driver import require_driver
from snapcoord.spark_connector.savepoints.checkpoint_archive import (
    CheckpointCut,
    CheckpointNotReady,
    cut_checkpoint,
    send_cut,
)
from snapcoord.spark_connector.savepoints.spark_file_sink import UnfencedRestorableSink
from snapcoord.spark_connector.sink.protocols import RestorableSink
from snapcoord.spark_connector.sources import OffsetParser, offsets_of_sources
from snapcoord.spark_connector.storage import Storage, open_location

log = logging.getLogger(__name__)

#: Checkpoint keys of a query's report: small UTF-8 values, and the archive (a tar stream).
CHECKPOINT_KEY = "checkpoint"
BATCH_ID_KEY = "batch_id"
SOURCES_KEY = "sources"
SINK_POSITIONS_KEY = "sink_positions"
ARCHIVE_KEY = "archive"


class SnapshotNotCompleted(RuntimeError):
    """The snapshot was aborted, or did not complete in time (it is then aborted)."""

    def __init__(self, message: str, snapshot: Snapshot) -> None:
        super().__init__(message)
        self.snapshot = snapshot


class SnapshotConflict(RuntimeError):
    """Another snapshot of the app, for a different set of queries, is still CREATED."""


@dataclass(frozen=True)
class SnapshotQuery:
    """One streaming query of the app: its name (the snapshot's task id, and ``exactly_once``'s
    ``query_name``), its checkpoint location (as given to Spark), its sink (None: the restore cannot
    roll it back) and the names of the queries whose sinks it reads. ``stream_names`` and
    ``parsers`` name and parse its sources' offsets for the report's committed offsets, as in
    ``sources.offsets_of_sources``."""

    name: str
    checkpoint_location: str
    sink: RestorableSink | UnfencedRestorableSink | None = None
    reads_from: tuple[str, ...] = ()
    stream_names: tuple[str | None, ...] = ()
    parsers: Mapping[int, OffsetParser] = field(default_factory=dict)


def downstream_first(queries: Sequence[SnapshotQuery]) -> list[SnapshotQuery]:
    """The queries ordered so that each comes before every query it reads from."""
    by_name = {q.name: q for q in queries}
    if len(by_name) != len(queries):
        raise ValueError(f"query names repeat: {[q.name for q in queries]}")
    readers: dict[str, list[str]] = {n: [] for n in by_name}
    for q in queries:
        for upstream in q.reads_from:
            if upstream not in by_name:
                raise ValueError(f"{q.name} reads from {upstream!r}, not a query of the snapshot")
            if by_name[upstream].sink is None:
                raise ValueError(f"{q.name} reads from {upstream!r}, which has no sink to cut")
            readers[upstream].append(q.name)
    ordered: list[SnapshotQuery] = []
    placed: set[str] = set()
    pending = [q.name for q in queries]
    while pending:
        ready = [n for n in pending if all(r in placed for r in readers[n])]
        if not ready:
            raise ValueError(f"the queries {pending} read from each other in a cycle: no cut exists")
        for n in ready:
            ordered.append(by_name[n])
            placed.add(n)
        pending = [n for n in pending if n not in placed]
    return ordered


def _wait_for_commit(query: SnapshotQuery, checkpoint: Storage, batch_id: int, deadline: float) -> None:
    """Block until ``checkpoint`` committed ``batch_id`` (see the cut in the module docstring)."""
    while True:
        try:
            if cut_checkpoint(checkpoint).batch_id >= batch_id:
                return
        except CheckpointNotReady:
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"{query.name}: its sink shows batch {batch_id}, which a reader may have read, but its "
                f"checkpoint has not committed it: is the query running?"
            )
        time.sleep(0.05)


@dataclass(frozen=True)
class _Sent:
    """What one attempt of a query's report sent: the upload and the report's other parts."""

    upload_id: str
    offsets: tuple[Offset, ...]
    positions: tuple[Offset, ...]


def _report_query(
    client: CoordinatorClient,
    app_id: str,
    generation: int,
    query: SnapshotQuery,
    checkpoint: Storage,
    must_cover_batch: int | None,
    deadline: float,
    upload_attempts: int = 3,
) -> None:
    if must_cover_batch is not None:
        _wait_for_commit(query, checkpoint, must_cover_batch, deadline)

    def send(cut: CheckpointCut, chunks: Iterable[bytes]) -> _Sent:
        # Before the upload: a source nothing parses fails the snapshot here, saying which.
        offsets = offsets_of_sources(query.name, cut.source_offsets, query.stream_names, query.parsers)
        positions = () if query.sink is None else tuple(query.sink.batch_end_positions(cut.batch_id))
        upload = client.upload_checkpoint(app_id, generation, query.name, ARCHIVE_KEY, chunks)
        return _Sent(upload.upload_id, tuple(offsets), positions)

    for attempt in range(1, upload_attempts + 1):
        try:
            # Streamed from the checkpoint's store: a lost connection cannot replay the stream, so
            # it cuts again (a new upload; the janitor removes one that no report names).
            cut, sent = send_cut(checkpoint, send)
            break
        except Unavailable:
            if attempt == upload_attempts:
                raise
            log.info(
                "%s gen %d: upload of %s lost (attempt %d); again", app_id, generation, query.name, attempt
            )
    small = {
        CHECKPOINT_KEY: query.checkpoint_location.encode(),
        BATCH_ID_KEY: str(cut.batch_id).encode(),
        SOURCES_KEY: json.dumps(list(cut.source_offsets)).encode(),
        SINK_POSITIONS_KEY: json.dumps([[p.stream, p.partition, p.offset] for p in sent.positions]).encode(),
    }
    report = TaskSnapshot(query.name, sent.offsets, small, uploads={ARCHIVE_KEY: sent.upload_id})
    try:
        client.report_task_snapshot(app_id, generation, report)
    except SnapshotFenced as e:
        # Another driver reported this query first (its report stands), or the snapshot ended
        # (the upload is refused up front then): the caller finds out from the snapshot's state.
        log.warning("%s gen %d: report of %s fenced: %s", app_id, generation, query.name, e.details)
    else:
        log.info("%s generation %d: %s reported batch %d", app_id, generation, query.name, cut.batch_id)


def take_snapshot(
    client: CoordinatorClient,
    app_id: str,
    queries: Sequence[SnapshotQuery],
    timeout_s: float,
    *,
    spark: Any | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Snapshot:
    """Create a snapshot of ``app_id`` over ``queries``, report every query (downstream first) and
    return the COMPLETED snapshot (its small keys readable with ``read_checkpoint``).

    Raises ``SnapshotNotCompleted`` when it is aborted or not completed within ``timeout_s`` (it is
    then aborted, so the app can take the next one), and ``SnapshotConflict`` when a CREATED
    snapshot of the app covers other queries. A retry after a failure reports only the queries that
    have not reported yet. ``spark`` and ``storage_options`` say how the checkpoints are reached
    (``storage.open_location``: Spark's Hadoop file system from a classic driver, else fsspec).
    """
    require_driver("take_snapshot")
    ordered = downstream_first(queries)
    if not ordered:
        raise ValueError("queries is empty")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    # Before the snapshot exists: a location no backend reaches is refused with nothing created.
    stores = {
        q.name: open_location(q.checkpoint_location, spark=spark, storage_options=storage_options)
        for q in ordered
    }
    names = [q.name for q in queries]
    deadline = time.monotonic() + timeout_s
    created = client.create_snapshot(app_id, names, timeout_ms=max(1000, math.ceil(timeout_s * 1000)))
    if set(created.task_ids) != set(names):
        raise SnapshotConflict(
            f"{app_id} generation {created.generation} is still CREATED for queries "
            f"{list(created.task_ids)}, not {names}: wait for it or abort it"
        )
    generation = created.generation
    reported = {t.task_id for t in client.get_snapshot(app_id, generation).tasks}
    try:
        for query in ordered:
            if query.name in reported:
                continue
            # Every reader of this query is cut (downstream first): its newest visible output now is
            # the newest any reader can have read; this query's cut must cover it.
            has_readers = any(query.name in q.reads_from for q in queries)
            cover = query.sink.last_batch_id() if has_readers and query.sink is not None else None
            _report_query(client, app_id, generation, query, stores[query.name], cover, deadline)
            if time.monotonic() > deadline:
                raise TimeoutError(f"reporting took longer than {timeout_s}s")
    except (TimeoutError, CheckpointNotReady, LookupError) as e:
        aborted = client.abort_snapshot(app_id, generation, f"take_snapshot: {e}")
        if aborted.state is not SnapshotState.COMPLETED:
            raise SnapshotNotCompleted(f"{app_id} generation {generation} not completed: {e}", aborted) from e
    snapshot = client.get_snapshot(app_id, generation)
    if snapshot.state is not SnapshotState.COMPLETED:
        raise SnapshotNotCompleted(
            f"{app_id} generation {generation} is {snapshot.state.value}: "
            f"{snapshot.abort_reason or 'not every query reported'}",
            snapshot,
        )
    return snapshot
