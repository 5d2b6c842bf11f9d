"""Restore an app's queries from a COMPLETED snapshot taken by ``app_snapshots.take_snapshot``.

``restore_snapshot`` holds a lease on the snapshot for the whole restore (retention cannot delete it
meanwhile) and, for the queries to restore:

1. streams each query's archive from the coordinator into a hidden directory next to its *new*
   checkpoint directory and gives it a new query id in ``metadata``: everything the restore needs
   from the coordinator is read before anything is changed;
2. checks every sink against its recorded positions (``RestoreCheckedSink.check_restore``): a sink
   that no longer holds the output the snapshot recorded below its cut (another restore, of an older
   snapshot, cut it back further since) refuses the whole restore with ``RestoreRefused``, before any
   sink is fenced or cut;
3. rolls each sink back to the snapshot's positions: it claims a new epoch (``epochs``), fences the
   sink with it (a still-running old driver can no longer make anything visible) and removes every
   write at or after the positions, of any run, keeping everything before them
   (``RestorableSink.restore_to``, which checks again after its fence);
4. renames each unpacked copy to its checkpoint directory, which so appears only when complete.

A query started on that checkpoint runs batch ``N+1`` next, from the snapshot's source offsets and
state, into a sink that holds exactly the output of batches ``<= N``: no loss, no duplicate. The
new query id keeps ``exactly_once`` honest: every batch record of the old checkpoint (the same batch
numbers, still in the coordinator) is another query's, so it is replaced and never rolls anything
back; the restored run claims an epoch above the restore's, so it is never fenced by it.

No sink is cut before every archive is on local disk and every sink passed its check: a failed read
(a lost connection, the stream's deadline ``archive_timeout_s``) or a refused sink leaves the sinks and
the old checkpoints as they were. (A sink whose content changes between the check and its fence, which
takes a query still writing to it, can still refuse after an earlier sink was cut: stop the queries
first.) A crash
after a cut and before the rename leaves no new checkpoint to start from; running the restore again
cuts at the same positions (idempotent). Restore every query of a pipeline from one snapshot, with
their readers stopped, so the cut between them holds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from snapcoord.client import CoordinatorClient, Offset, SnapshotRef, SnapshotState
from snapcoord.spark_connector.app_snapshots import (
    ARCHIVE_KEY,
    BATCH_ID_KEY,
    SINK_POSITIONS_KEY,
)
from snapcoord.spark_connector.checkpoint_archive import local_checkpoint, unpack_archive
from snapcoord.spark_connector.driver import require_driver
from snapcoord.spark_connector.epochs import claim_epoch, epoch_producer_id
from snapcoord.spark_connector.sinks import RestorableSink, RestoreCheckedSink
from snapcoord.spark_connector.spark_file_sink import UnfencedRestorableSink

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


def _new_query_id(checkpoint: Path) -> str:
    """Give the rebuilt checkpoint its own query id (its checksum, written for the old content by
    Hadoop's local file system, goes: Spark would refuse the file)."""
    metadata = checkpoint / "metadata"
    doc = json.loads(metadata.read_text("utf-8").splitlines()[0])
    doc["id"] = str(uuid.uuid4())
    metadata.write_text(json.dumps(doc) + "\n", "utf-8")
    (checkpoint / ".metadata.crc").unlink(missing_ok=True)
    return str(doc["id"])


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


def _stage_one(
    client: CoordinatorClient, app_id: str, generation: int, t: RestoreTarget, archive_timeout_s: float
) -> tuple[RestoredQuery, Path]:
    """Read one query's keys and unpack its archive next to its new checkpoint; changes nothing."""

    def small(key: str) -> str:
        return b"".join(client.read_checkpoint(app_id, generation, t.query_name, key)).decode("utf-8")

    batch_id = int(small(BATCH_ID_KEY))
    positions = tuple(Offset(s, p, o) for s, p, o in json.loads(small(SINK_POSITIONS_KEY)))
    _check_sink(t, positions)  # early: before the archive's stream
    target = local_checkpoint(t.checkpoint_location)
    archive = client.read_checkpoint(
        app_id, generation, t.query_name, ARCHIVE_KEY, timeout_s=archive_timeout_s
    )
    partial = unpack_archive(archive, target, prepare=_new_query_id)
    query_id = str(json.loads((partial / "metadata").read_text("utf-8").splitlines()[0])["id"])
    return RestoredQuery(t.query_name, t.checkpoint_location, batch_id, positions, query_id), partial


def restore_snapshot(
    client: CoordinatorClient,
    app_id: str,
    generation: int,
    targets: Iterable[RestoreTarget],
    *,
    lease_s: float = 600.0,
    archive_timeout_s: float = 3600.0,
) -> dict[str, RestoredQuery]:
    """Restore ``targets`` (a subset of the snapshot's queries) from ``app_id`` generation
    ``generation``; see the module docstring. Returns what was restored, by query name.
    ``archive_timeout_s`` bounds the read of each query's archive (one stream, the whole copy)."""
    require_driver("restore_snapshot")
    wanted = list(targets)
    if not wanted:
        raise ValueError("targets is empty")
    for t in wanted:
        if local_checkpoint(t.checkpoint_location).exists():
            raise FileExistsError(f"{t.checkpoint_location} exists: restore {t.query_name} into a new one")
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
        staged: list[tuple[RestoreTarget, RestoredQuery, Path]] = []
        try:
            for t in wanted:  # 1. every archive unpacked; nothing changed yet
                staged.append((t, *_stage_one(client, app_id, generation, t, archive_timeout_s)))
            for t, r, _ in staged:  # 2. every sink still holds what its cut keeps; nothing changed yet
                _check_sink(t, r.sink_positions)
            for t, r, _ in staged:  # 3. the sinks cut
                if t.sink is not None:
                    _roll_back_sink(client, t, r.sink_positions)
            for t, r, partial in staged:  # 4. the checkpoints appear
                os.rename(partial, local_checkpoint(t.checkpoint_location))
                restored[t.query_name] = r
                log.info("%s: restored from %s at batch %d", t.query_name, what, r.batch_id)
        finally:
            for _, _, partial in staged:
                shutil.rmtree(partial, ignore_errors=True)  # those not renamed
    return restored
