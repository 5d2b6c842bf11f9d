"""Consistent snapshots of a Spark app made of several streaming queries, and restore plans.

``take_snapshot`` starts a generation snapshot whose tasks are the app's query names and waits
until every query's ``SnapcoordListener`` reported its committed offsets (COMPLETED).
``restore_plan`` turns a completed snapshot back into one ``RestorePoint`` per query: the
checkpoint location, the committed batch id and the source offsets. ``materialize_checkpoint``
copies a local checkpoint and cuts it back to that batch, so a query started on the copy resumes
right after the snapshot: without loss (later batches run again) or duplication (earlier ones don't).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from snapcoord.client import CoordinatorClient, Offset, Snapshot, SnapshotState
from snapcoord.spark_connector.driver import require_driver
from snapcoord.spark_connector.listener import BATCH_ID_KEY, CHECKPOINT_KEY, SOURCES_KEY


class SnapshotNotCompleted(RuntimeError):
    """The snapshot was aborted, or did not complete in time (it is then aborted)."""

    def __init__(self, message: str, snapshot: Snapshot) -> None:
        super().__init__(message)
        self.snapshot = snapshot


class SnapshotConflict(RuntimeError):
    """Another snapshot of the app, for a different set of queries, is still CREATED."""


@dataclass(frozen=True)
class RestorePoint:
    """Where one query of a completed snapshot resumes."""

    query_name: str
    checkpoint_location: str
    #: The last batch the snapshot includes (committed in ``checkpoint_location``).
    batch_id: int
    offsets: tuple[Offset, ...]
    #: ``(description, endOffset JSON or None)`` per source, as Spark reported them.
    sources: tuple[tuple[str, str | None], ...] = ()


def take_snapshot(
    client: CoordinatorClient,
    app_id: str,
    query_names: Iterable[str],
    timeout_s: float,
    *,
    poll_interval_s: float = 0.1,
) -> Snapshot:
    """Create a snapshot of ``app_id`` over ``query_names`` and wait until it is COMPLETED.

    Returns the snapshot with every query's report, checkpoint payloads included (what
    ``restore_plan`` needs). Raises ``SnapshotNotCompleted`` when it is aborted, or when it is not
    completed within ``timeout_s`` (then it is aborted, so the app can take the next one), and
    ``SnapshotConflict`` when a CREATED snapshot of the app covers other queries.
    The queries' listeners report on their next progress or idle event.
    """
    require_driver("take_snapshot")
    names = tuple(dict.fromkeys(query_names))
    if not names:
        raise ValueError("query_names is empty")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    deadline = time.monotonic() + timeout_s
    created = client.create_snapshot(app_id, names, timeout_ms=max(1000, math.ceil(timeout_s * 1000)))
    if set(created.task_ids) != set(names):
        raise SnapshotConflict(
            f"{app_id} generation {created.generation} is still CREATED for queries "
            f"{list(created.task_ids)}, not {list(names)}: wait for it or abort it"
        )
    while True:
        remaining = deadline - time.monotonic()
        snapshot = client.get_snapshot(
            app_id, created.generation, include_checkpoints=True, timeout_s=max(1.0, min(10.0, remaining))
        )
        if snapshot.state is SnapshotState.COMPLETED:
            return snapshot
        if snapshot.state is SnapshotState.ABORTED:
            raise SnapshotNotCompleted(
                f"{app_id} generation {snapshot.generation} was aborted: "
                f"{snapshot.abort_reason or 'no reason given'}",
                snapshot,
            )
        if remaining <= 0:
            missing = sorted(set(names) - {t.task_id for t in snapshot.tasks})
            aborted = client.abort_snapshot(
                app_id, created.generation, f"take_snapshot timed out; missing {missing}"
            )
            if aborted.state is SnapshotState.COMPLETED:  # the last report won the race
                return client.get_snapshot(app_id, created.generation, include_checkpoints=True)
            raise SnapshotNotCompleted(
                f"{app_id} generation {created.generation} not completed within {timeout_s}s; "
                f"no report from {missing} (is a SnapcoordListener registered, are the queries running?)",
                aborted,
            )
        time.sleep(min(poll_interval_s, max(remaining, 0.0)))


def restore_plan(snapshot: Snapshot) -> dict[str, RestorePoint]:
    """One ``RestorePoint`` per query of a COMPLETED snapshot read with its checkpoint payloads
    (``take_snapshot``'s result, or ``get_snapshot(..., include_checkpoints=True)``)."""
    if snapshot.state is not SnapshotState.COMPLETED:
        raise ValueError(
            f"{snapshot.app_id} generation {snapshot.generation} is {snapshot.state.value}, not COMPLETED"
        )
    plan: dict[str, RestorePoint] = {}
    for task in snapshot.tasks:
        checkpoint = task.checkpoints.get(CHECKPOINT_KEY, b"")
        batch_id = task.checkpoints.get(BATCH_ID_KEY, b"")
        if not checkpoint or not batch_id:
            raise ValueError(
                f"the report of {task.task_id} has no checkpoint location or batch id: read the snapshot "
                "with include_checkpoints=True, and report with SnapcoordListener"
            )
        raw_sources = json.loads(task.checkpoints.get(SOURCES_KEY, b"[]") or b"[]")
        plan[task.task_id] = RestorePoint(
            query_name=task.task_id,
            checkpoint_location=checkpoint.decode(),
            batch_id=int(batch_id.decode()),
            offsets=task.committed_offsets,
            sources=tuple((str(d), None if e is None else str(e)) for d, e in raw_sources),
        )
    missing = set(snapshot.task_ids) - set(plan)
    if missing:
        raise ValueError(f"the snapshot has no report from {sorted(missing)}")
    return plan


def _local_path(location: str) -> Path:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else location)
    raise ValueError(f"materialize_checkpoint copies local checkpoints only, not {location!r}")


def _batch_files(directory: Path) -> Iterable[tuple[int, Path]]:
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        name = entry.name.removeprefix(".").removesuffix(".crc").removesuffix(".compact")
        if name.isdigit():
            yield int(name), entry


def materialize_checkpoint(point: RestorePoint, target: str | Path) -> str:
    """Copy the query's (local) checkpoint to ``target`` (which must not exist) and remove every
    batch after ``point.batch_id`` from its offsets and commit logs; returns ``target``.

    A query started on the copy runs batch ``batch_id + 1`` next. The source metadata logs stay
    as they are: the next batch plans from the last committed offsets, so data seen by the cut
    batches is read again, once. Stop the original query first if it runs in the same session
    (the copy keeps the query id).
    """
    source = _local_path(point.checkpoint_location)
    if not (source / "commits" / str(point.batch_id)).exists():
        raise ValueError(f"{source} has no committed batch {point.batch_id}: not the snapshot's checkpoint")
    destination = Path(target)
    shutil.copytree(source, destination)
    for log in ("offsets", "commits"):
        for batch, path in _batch_files(destination / log):
            if batch > point.batch_id:
                path.unlink()
    return str(destination)
