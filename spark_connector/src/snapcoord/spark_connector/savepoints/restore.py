"""Restore an app's queries from a COMPLETED snapshot taken by ``app_snapshots.take_snapshot``.

``restore_snapshot`` holds a lease on the snapshot for the whole restore (retention cannot delete it
meanwhile) and, for the queries to restore:

1. streams each query's archive from the coordinator into its *new* checkpoint location (any
   location Spark can use, reached through ``storage.open_location``), with a new query id in
   ``metadata``, up to but not including the completion point (``restore_target``: until then the
   location holds a placeholder offsets entry that makes Spark refuse to start on it): everything the
   restore needs from the coordinator is read before any sink is changed;
2. checks every sink against its recorded positions (``RestoreCheckedSink.check_restore``): a sink
   that no longer holds the output the snapshot recorded below its cut (another restore, of an older
   snapshot, cut it back further since) refuses the whole restore with ``RestoreRefused``, before any
   sink is fenced or cut;
3. rolls each sink back to the snapshot's positions: it claims a new epoch (``epochs``), fences the
   sink with it (a still-running old driver can no longer make anything visible) and removes every
   write at or after the positions, of any run, keeping everything before them
   (``RestorableSink.restore_to``, which checks again after its fence);
4. completes each new checkpoint: deletes its placeholder, after which the snapshot's
   ``offsets/<N>`` is the offsets log's latest entry (``restore_target.complete``, the completion
   point).

A query started on that checkpoint runs batch ``N+1`` next, from the snapshot's source offsets and
state, into a sink that holds exactly the output of batches ``<= N``: no loss, no duplicate. The
new query id keeps ``exactly_once`` honest: every batch record of the old checkpoint (the same batch
numbers, still in the coordinator) is another query's, so it is replaced and never rolls anything
back; the restored run claims an epoch above the restore's, so it is never fenced by it.

Every new checkpoint location must be empty, or hold an unfinished restore of the same snapshot's
same query (which this restore then takes over and completes); anything else is refused before the
lease is taken. No sink is cut before every archive is written and every sink passed its check: a
failed read (a lost connection, the stream's deadline ``archive_timeout_s``) or a refused sink leaves
the sinks and the old checkpoints as they were, and the new locations are removed again (the
placeholder last). (A sink whose content changes between the check and its fence, which takes a
query still writing to it, can still refuse after an earlier sink was cut: stop the queries first.)
A crash before a checkpoint's completion point leaves a location Spark refuses to start; running the
same restore again completes it and cuts the sinks at the same positions (idempotent). A completed
checkpoint is never overwritten: after a crash between two completions, restore the remaining
queries. Restore every query of a pipeline from one snapshot, with their readers stopped, so the
cut between them holds.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from snapcoord.client import CoordinatorClient, Offset, SnapshotRef, SnapshotState
from snapcoord.spark_connector.driver import require_driver
from snapcoord.spark_connector.savepoints.app_snapshots import (
    ARCHIVE_KEY,
    BATCH_ID_KEY,
    SINK_POSITIONS_KEY,
)
from snapcoord.spark_connector.savepoints.restore_target import (
    PendingRestore,
    RestoreMarker,
    abandon,
    check_target,
    claim_target,
    complete,
    write_archive,
)
from snapcoord.spark_connector.savepoints.spark_file_sink import UnfencedRestorableSink
from snapcoord.spark_connector.sink.epochs import claim_epoch, epoch_producer_id
from snapcoord.spark_connector.sink.protocols import CoordinatedSink, RestorableSink, RestoreCheckedSink
from snapcoord.spark_connector.storage import Storage, open_location

log = logging.getLogger(__name__)

_EPOCH_TTL_MS = 3_600_000


class SnapshotUnavailable(RuntimeError):
    """The snapshot is not COMPLETED, or was deleted before it could be leased."""


@dataclass(frozen=True)
class RestoreTarget:
    """Where one query of the snapshot is restored: a new checkpoint directory (must not exist) and
    the query's sink (None: leave the sink alone; the restored query then writes the batches after
    the snapshot a second time)."""

    query_name: str
    checkpoint_location: str
    sink: RestorableSink | UnfencedRestorableSink | None = None


@dataclass(frozen=True)
class RestoredQuery:
    query_name: str
    checkpoint_location: str
    #: The snapshot's last batch: the restored query runs ``batch_id + 1`` next.
    batch_id: int
    sink_positions: tuple[Offset, ...]
    query_id: str


def _roll_back_sink(client: CoordinatorClient, target: RestoreTarget, positions: Sequence[Offset]) -> None:
    sink = target.sink
    assert sink is not None
    if not isinstance(sink, RestorableSink):
        # Spark's own file sink (UnfencedRestorableSink): no epoch can fence it, so it is cut without
        # one; its query must be stopped (restore_to checks that nothing wrote past the cut).
        sink.restore_to(positions)
        log.info("%s: sink %r restored to %s (unfenced)", target.query_name, sink, list(positions))
        return
    epoch = claim_epoch(
        client, target.query_name, floor=sink.max_epoch(), ttl_ms=_EPOCH_TTL_MS, query_id=None
    )
    if isinstance(sink, CoordinatedSink):
        sink.use_coordinator(client)  # the commit point where the sink's store has no atomic create
    sink.fence(epoch)  # from here on no older run can make a write visible
    sink.restore_to(positions)
    # The fence keeps epoch numbers growing; the claim record protects nothing any more.
    client.delete_producer_offsets(epoch_producer_id(target.query_name, epoch))
    log.info("%s: sink %r restored to %s as epoch %d", target.query_name, sink, list(positions), epoch)


def _check_sink(target: RestoreTarget, positions: Sequence[Offset]) -> None:
    """Raise, changing nothing, when the target's sink would refuse the cut (``RestoreRefused``)."""
    if target.sink is None:
        return
    if not positions:
        raise ValueError(
            f"the snapshot has no sink positions of {target.query_name}: cannot restore its sink"
        )
    if isinstance(target.sink, (RestoreCheckedSink, UnfencedRestorableSink)):
        target.sink.check_restore(positions)


@dataclass(frozen=True)
class _Staged:
    target: RestoreTarget
    storage: Storage
    restored: RestoredQuery
    pending: PendingRestore


def _stage_one(
    client: CoordinatorClient,
    app_id: str,
    generation: int,
    t: RestoreTarget,
    storage: Storage,
    archive_timeout_s: float,
    claimed: list[tuple[Storage, RestoreMarker]],
) -> _Staged:
    """Read one query's keys and write its archive into its new checkpoint, up to the completion
    point (``restore_target``); changes nothing else."""

    def small(key: str) -> str:
        return b"".join(client.read_checkpoint(app_id, generation, t.query_name, key)).decode("utf-8")

    batch_id = int(small(BATCH_ID_KEY))
    positions = tuple(Offset(s, p, o) for s, p, o in json.loads(small(SINK_POSITIONS_KEY)))
    _check_sink(t, positions)  # early: before the archive's stream
    marker = RestoreMarker.new(app_id, generation, t.query_name, batch_id)
    archive = client.read_checkpoint(
        app_id, generation, t.query_name, ARCHIVE_KEY, timeout_s=archive_timeout_s
    )
    claim_target(storage, marker)
    claimed.append((storage, marker))
    pending = write_archive(storage, archive, marker)
    restored = RestoredQuery(t.query_name, t.checkpoint_location, batch_id, positions, pending.query_id)
    return _Staged(t, storage, restored, pending)


def restore_snapshot(
    client: CoordinatorClient,
    app_id: str,
    generation: int,
    targets: Iterable[RestoreTarget],
    *,
    lease_s: float = 600.0,
    archive_timeout_s: float = 3600.0,
    spark: Any | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, RestoredQuery]:
    """Restore ``targets`` (a subset of the snapshot's queries) from ``app_id`` generation
    ``generation``; see the module docstring. Returns what was restored, by query name.
    ``archive_timeout_s`` bounds the read of each query's archive (one stream, the whole copy).
    ``spark`` and ``storage_options`` say how the new checkpoints are reached
    (``storage.open_location``)."""
    require_driver("restore_snapshot")
    wanted = list(targets)
    if not wanted:
        raise ValueError("targets is empty")
    stores = {
        t.query_name: open_location(t.checkpoint_location, spark=spark, storage_options=storage_options)
        for t in wanted
    }
    for t in wanted:  # a location that is not empty and not this snapshot's restore: refused up front
        check_target(stores[t.query_name], RestoreMarker.new(app_id, generation, t.query_name, -1))
    ref = SnapshotRef(app_id, generation)
    lease_id = f"restore-{app_id}-{generation}-{uuid.uuid4().hex[:12]}"
    restored: dict[str, RestoredQuery] = {}
    what = f"{app_id} generation {generation}"
    with client.lease(lease_id, [ref], lease_s) as lease:
        if lease.unavailable:
            raise SnapshotUnavailable(f"{what} does not exist (deleted by retention?)")
        snapshot = client.get_snapshot(app_id, generation)
        if snapshot.state is not SnapshotState.COMPLETED:
            raise SnapshotUnavailable(f"{what} is {snapshot.state.value}, not COMPLETED")
        reported = {t.task_id for t in snapshot.tasks}
        missing = [t.query_name for t in wanted if t.query_name not in reported]
        if missing:
            raise ValueError(f"{what} has no query {missing} (it has {sorted(reported)})")
        claimed: list[tuple[Storage, RestoreMarker]] = []
        staged: list[_Staged] = []
        try:
            for t in wanted:  # 1. every archive written, short of its completion point
                staged.append(
                    _stage_one(
                        client, app_id, generation, t, stores[t.query_name], archive_timeout_s, claimed
                    )
                )
            for s in staged:  # 2. every sink still holds what its cut keeps; nothing changed yet
                _check_sink(s.target, s.restored.sink_positions)
            for s in staged:  # 3. the sinks cut
                if s.target.sink is not None:
                    _roll_back_sink(client, s.target, s.restored.sink_positions)
            for s in staged:  # 4. the checkpoints complete
                complete(s.storage, s.pending)
                restored[s.target.query_name] = s.restored
                log.info("%s: restored from %s at batch %d", s.target.query_name, what, s.restored.batch_id)
        except BaseException:
            for storage, marker in claimed:
                if marker.query_name not in restored:
                    try:
                        abandon(storage, marker)
                    except Exception:  # the placeholder stays: Spark refuses it, a retry completes it
                        log.warning(
                            "%s: could not remove the unfinished restore", storage.location, exc_info=True
                        )
            raise
    return restored
