"""Snapshots of a Spark app made of several streaming queries, taken from the driver.

``take_snapshot`` starts a generation snapshot whose tasks are the app's query names and reports
every query itself, from the checkpoints, without waiting for Spark's progress events: so idle,
just-restarted, ``AvailableNow`` and stopped queries complete a snapshot at once, and it works the
same under Spark Connect. For each query it

1. cuts the checkpoint at its last committed batch ``N`` and copies what a restart from ``N``
   needs (``checkpoint_archive``: metadata, offsets, commits, source logs, state up to ``N+1``);
2. reads the sink's positions right after batch ``N`` (``RestorableSink.batch_end_positions``);
3. streams the copy to the coordinator as the task's ``archive`` checkpoint (``store_archive``,
   the coordinator's chunked upload: no single gRPC message limits it) and reports it with the small
   keys ``checkpoint``, ``batch_id``, ``sources`` and ``sink_positions``.

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
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from snapcoord.client import (
    CoordinatorClient,
    Offset,
    Snapshot,
    SnapshotFenced,
    SnapshotState,
    TaskSnapshot,
    Unavailable,
)
from snapcoord.spark_connector.checkpoint_archive import (
    CheckpointNotReady,
    archive_chunks,
    cut_checkpoint,
    local_checkpoint,
    stage_cut,
)
from snapcoord.spark_connector.driver import require_driver
from snapcoord.spark_connector.sinks import RestorableSink
from snapcoord.spark_connector.sources import OffsetParser, offsets_of_sources
from snapcoord.spark_connector.spark_file_sink import UnfencedRestorableSink

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
    ``query_name``), its local checkpoint, its sink (None: the restore cannot roll it back) and the
    names of the queries whose sinks it reads. ``stream_names`` and ``parsers`` name and parse its
    sources' offsets for the report's committed offsets, as in ``sources.offsets_of_sources``."""

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


def store_archive(
    client: CoordinatorClient,
    app_id: str,
    generation: int,
    task_id: str,
    small: dict[str, bytes],
    staged: Path,
    *,
    offsets: Sequence[Offset] = (),
    attempts: int = 3,
) -> TaskSnapshot:
    """Stream one query's staged copy to the coordinator (``upload_checkpoint``: pieces of 1 MiB,
    never whole in memory, up to ``--snapshot-max-upload-size``); returns the query's report.

    The client cannot replay a stream, so a lost connection (``Unavailable``) uploads again from
    the staged copy, as a new upload: the janitor removes one that no report names.
    """
    for attempt in range(1, attempts + 1):
        try:
            chunks = archive_chunks(staged)
            upload = client.upload_checkpoint(app_id, generation, task_id, ARCHIVE_KEY, chunks)
        except Unavailable:
            if attempt == attempts:
                raise
            log.info("%s gen %d: upload of %s lost (attempt %d); again", app_id, generation, task_id, attempt)
            continue
        return TaskSnapshot(task_id, tuple(offsets), small, uploads={ARCHIVE_KEY: upload.upload_id})
    raise AssertionError("unreachable")


def _wait_for_commit(query: SnapshotQuery, checkpoint: Path, batch_id: int, deadline: float) -> None:
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


def _report_query(
    client: CoordinatorClient,
    app_id: str,
    generation: int,
    query: SnapshotQuery,
    staging_root: Path | None,
    must_cover_batch: int | None,
    deadline: float,
) -> None:
    checkpoint = local_checkpoint(query.checkpoint_location)
    if must_cover_batch is not None:
        _wait_for_commit(query, checkpoint, must_cover_batch, deadline)
    root = staging_root if staging_root is not None else checkpoint.parent
    # Next to the checkpoint by default, so that the copy is made of hard links, not of bytes.
    staging = Path(tempfile.mkdtemp(prefix=f".snapcoord-{query.name}-", dir=root)) / "checkpoint"
    try:
        cut = stage_cut(checkpoint, staging)
        # Before the upload: a source nothing parses fails the snapshot here, saying which.
        offsets = offsets_of_sources(query.name, cut.source_offsets, query.stream_names, query.parsers)
        positions: list[Offset] = (
            [] if query.sink is None else list(query.sink.batch_end_positions(cut.batch_id))
        )
        small = {
            CHECKPOINT_KEY: query.checkpoint_location.encode(),
            BATCH_ID_KEY: str(cut.batch_id).encode(),
            SOURCES_KEY: json.dumps(list(cut.source_offsets)).encode(),
            SINK_POSITIONS_KEY: json.dumps([[p.stream, p.partition, p.offset] for p in positions]).encode(),
        }
        try:
            report = store_archive(client, app_id, generation, query.name, small, staging, offsets=offsets)
            client.report_task_snapshot(app_id, generation, report)
        except SnapshotFenced as e:
            # Another driver reported this query first (its report stands), or the snapshot ended
            # (the upload is refused up front then): the caller finds out from the snapshot's state.
            log.warning("%s gen %d: report of %s fenced: %s", app_id, generation, query.name, e.details)
        else:
            log.info("%s generation %d: %s reported batch %d", app_id, generation, query.name, cut.batch_id)
    finally:
        shutil.rmtree(staging.parent, ignore_errors=True)


def take_snapshot(
    client: CoordinatorClient,
    app_id: str,
    queries: Sequence[SnapshotQuery],
    timeout_s: float,
    *,
    staging_dir: str | Path | None = None,
) -> Snapshot:
    """Create a snapshot of ``app_id`` over ``queries``, report every query (downstream first) and
    return the COMPLETED snapshot (its small keys readable with ``read_checkpoint``).

    Raises ``SnapshotNotCompleted`` when it is aborted or not completed within ``timeout_s`` (it is
    then aborted, so the app can take the next one), and ``SnapshotConflict`` when a CREATED
    snapshot of the app covers other queries. A retry after a failure reports only the queries that
    have not reported yet. ``staging_dir``: where the copies are made (default: next to each
    checkpoint, so that they are hard links).
    """
    require_driver("take_snapshot")
    ordered = downstream_first(queries)
    if not ordered:
        raise ValueError("queries is empty")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
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
    staging_root = None if staging_dir is None else Path(staging_dir)
    try:
        for query in ordered:
            if query.name in reported:
                continue
            # Every reader of this query is cut (downstream first): its newest visible output now is
            # the newest any reader can have read; this query's cut must cover it.
            has_readers = any(query.name in q.reads_from for q in queries)
            cover = query.sink.last_batch_id() if has_readers and query.sink is not None else None
            _report_query(client, app_id, generation, query, staging_root, cover, deadline)
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
