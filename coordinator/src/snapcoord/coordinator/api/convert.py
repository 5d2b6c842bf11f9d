"""Protobuf <-> domain conversions shared by the servicers (the only place that knows both)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from snapcoord.coordinator.domain.backlog import BacklogStatus
from snapcoord.coordinator.domain.leases import Lease, SnapshotRef
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerSnapshot
from snapcoord.coordinator.domain.snapshots import Snapshot, State
from snapcoord.v1 import backlog_pb2, common_pb2, lease_pb2, producer_pb2, snapshot_pb2


def offsets_from_pb(items: Iterable[common_pb2.Offset]) -> list[Offset]:
    return [Offset(stream=o.stream, partition=o.partition, offset=o.offset) for o in items]


def offsets_to_pb(items: Iterable[Offset]) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream=o.stream, partition=o.partition, offset=o.offset) for o in items]


def producer_snapshot_to_pb(snapshot: ProducerSnapshot) -> producer_pb2.ProducerSnapshot:
    return producer_pb2.ProducerSnapshot(
        producer_id=snapshot.producer_id,
        offsets=offsets_to_pb(snapshot.offsets),
        created_at_ms=snapshot.created_at_ms,
        expires_at_ms=snapshot.expires_at_ms,
    )


def backlog_status_to_pb(status: BacklogStatus) -> backlog_pb2.BacklogStatus:
    return backlog_pb2.BacklogStatus(
        job_id=status.job_id,
        processing_backlog=status.processing_backlog,
        partitions=[
            backlog_pb2.PartitionBacklog(
                stream=p.stream,
                partition=p.partition,
                boundary=p.boundary,
                position=p.position,
                finished=p.finished,
            )
            for p in status.partitions
        ],
        added=offsets_to_pb(status.added),
        unmarked_partitions=status.unmarked_partitions,
    )


_STATES = {
    State.EMPTY: snapshot_pb2.Snapshot.EMPTY,
    State.CREATED: snapshot_pb2.Snapshot.CREATED,
    State.COMPLETED: snapshot_pb2.Snapshot.COMPLETED,
    State.ABORTED: snapshot_pb2.Snapshot.ABORTED,
}


def snapshot_to_pb(
    snapshot: Snapshot, payloads: Mapping[tuple[str, str], bytes] | None = None, *, with_task_ids: bool = True
) -> snapshot_pb2.Snapshot:
    """A snapshot as the API shows it; without ``payloads`` the checkpoint values are empty
    (the keys still name each task's state stores). ``with_task_ids=False`` leaves the task set
    out (``snapshot_frames`` encodes it apart)."""
    record = snapshot.record
    return snapshot_pb2.Snapshot(
        app_id=record.app_id,
        generation=record.generation,
        state=_STATES[record.state],
        task_ids=record.task_ids if with_task_ids else (),
        tasks=[
            snapshot_pb2.TaskSnapshot(
                task_id=t.task_id,
                committed_offsets=offsets_to_pb(t.committed_offsets),
                checkpoints={c.store: (payloads or {}).get((t.task_id, c.store), b"") for c in t.checkpoints},
            )
            for t in sorted(snapshot.tasks, key=lambda t: t.task_id)
        ],
        created_at_ms=record.created_at_ms,
        completed_at_ms=record.completed_at_ms,
        expires_at_ms=record.expires_at_ms(),
        labels=dict(record.labels),
        abort_reason=record.abort_reason,
    )


def refs_from_pb(items: Iterable[common_pb2.SnapshotRef]) -> list[SnapshotRef]:
    return [SnapshotRef(app_id=r.app_id, generation=r.generation) for r in items]


def refs_to_pb(items: Iterable[SnapshotRef]) -> list[common_pb2.SnapshotRef]:
    return [common_pb2.SnapshotRef(app_id=r.app_id, generation=r.generation) for r in items]


def lease_to_pb(lease: Lease) -> lease_pb2.Lease:
    return lease_pb2.Lease(
        lease_id=lease.lease_id,
        duration_ms=lease.duration_ms,
        expires_at_ms=lease.expires_at_ms,
        snapshots=refs_to_pb(lease.snapshots),
    )
