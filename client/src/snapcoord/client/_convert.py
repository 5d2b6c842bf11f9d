"""Protobuf messages <-> the client's dataclasses: the only module that builds or reads them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from snapcoord.client._types import (
    AcquireResult,
    AdvanceResult,
    BacklogStatus,
    CheckpointUpload,
    CommitClaim,
    CommitClaimResult,
    CommitClaims,
    Lease,
    Offset,
    Page,
    PartitionBacklog,
    ProducerSnapshot,
    ProgressResult,
    Registration,
    RetentionPolicy,
    Snapshot,
    SnapshotRef,
    SnapshotState,
    TableFence,
    TaskSnapshot,
)
from snapcoord.v1 import backlog_pb2, commit_pb2, common_pb2, lease_pb2, producer_pb2, snapshot_pb2

# --- shared ---------------------------------------------------------------------------------------


def offsets_to_pb(items: Iterable[Offset]) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream=o.stream, partition=o.partition, offset=o.offset) for o in items]


def offsets_from_pb(items: Iterable[common_pb2.Offset]) -> tuple[Offset, ...]:
    return tuple(Offset(o.stream, o.partition, o.offset) for o in items)


def refs_to_pb(items: Iterable[SnapshotRef]) -> list[common_pb2.SnapshotRef]:
    return [common_pb2.SnapshotRef(app_id=r.app_id, generation=r.generation) for r in items]


def refs_from_pb(items: Iterable[common_pb2.SnapshotRef]) -> tuple[SnapshotRef, ...]:
    return tuple(SnapshotRef(r.app_id, r.generation) for r in items)


# --- ProducerOffsetService ------------------------------------------------------------------------


def register_request(
    producer_id: str, offsets: Iterable[Offset], ttl_ms: int
) -> producer_pb2.RegisterProducerOffsetsRequest:
    return producer_pb2.RegisterProducerOffsetsRequest(
        producer_id=producer_id, offsets=offsets_to_pb(offsets), ttl_ms=ttl_ms
    )


def advance_request(
    producer_id: str, offsets: Iterable[Offset], ttl_ms: int, previous_producer_id: str
) -> producer_pb2.AdvanceProducerOffsetsRequest:
    return producer_pb2.AdvanceProducerOffsetsRequest(
        producer_id=producer_id,
        offsets=offsets_to_pb(offsets),
        ttl_ms=ttl_ms,
        previous_producer_id=previous_producer_id,
    )


def advanced_from_pb(pb: producer_pb2.AdvanceProducerOffsetsResponse) -> AdvanceResult:
    return AdvanceResult(pb.registered, producer_snapshot_from_pb(pb.snapshot), pb.previous_deleted)


def producer_snapshot_from_pb(pb: producer_pb2.ProducerSnapshot) -> ProducerSnapshot:
    return ProducerSnapshot(pb.producer_id, offsets_from_pb(pb.offsets), pb.created_at_ms, pb.expires_at_ms)


def registration_from_pb(pb: producer_pb2.RegisterProducerOffsetsResponse) -> Registration:
    return Registration(pb.registered, producer_snapshot_from_pb(pb.snapshot))


def get_producer_request(producer_id: str) -> producer_pb2.GetProducerOffsetsRequest:
    return producer_pb2.GetProducerOffsetsRequest(producer_id=producer_id)


def delete_producer_request(producer_id: str) -> producer_pb2.DeleteProducerOffsetsRequest:
    return producer_pb2.DeleteProducerOffsetsRequest(producer_id=producer_id)


def list_producers_request(page_size: int, page_token: str) -> producer_pb2.ListProducerOffsetsRequest:
    return producer_pb2.ListProducerOffsetsRequest(page_size=page_size, page_token=page_token)


def producer_page_from_pb(pb: producer_pb2.ListProducerOffsetsResponse) -> Page[ProducerSnapshot]:
    return Page(tuple(producer_snapshot_from_pb(s) for s in pb.snapshots), pb.next_page_token)


# --- SnapshotService ------------------------------------------------------------------------------


def task_to_pb(task: TaskSnapshot) -> snapshot_pb2.TaskSnapshot:
    return snapshot_pb2.TaskSnapshot(
        task_id=task.task_id,
        committed_offsets=offsets_to_pb(task.committed_offsets),
        checkpoints=dict(task.checkpoints),
        uploaded_checkpoints=dict(task.uploads),
    )


def task_from_pb(pb: snapshot_pb2.TaskSnapshot) -> TaskSnapshot:
    return TaskSnapshot(
        pb.task_id, offsets_from_pb(pb.committed_offsets), dict(pb.checkpoints), dict(pb.uploaded_checkpoints)
    )


def upload_header(
    app_id: str, generation: int, task_id: str, store: str, data: bytes
) -> snapshot_pb2.UploadCheckpointRequest:
    return snapshot_pb2.UploadCheckpointRequest(
        app_id=app_id, generation=generation, task_id=task_id, store=store, data=data
    )


def upload_data(data: bytes) -> snapshot_pb2.UploadCheckpointRequest:
    return snapshot_pb2.UploadCheckpointRequest(data=data)


def checkpoint_upload_from_pb(pb: snapshot_pb2.CheckpointUpload) -> CheckpointUpload:
    return CheckpointUpload(pb.upload_id, pb.size, pb.sha256)


def state_from_pb(value: int) -> SnapshotState:
    try:
        return SnapshotState(snapshot_pb2.Snapshot.State.Name(value))
    except ValueError:  # a state a newer coordinator added, or STATE_UNSPECIFIED
        return SnapshotState.UNSPECIFIED


def snapshot_from_pb(pb: snapshot_pb2.Snapshot) -> Snapshot:
    return Snapshot(
        app_id=pb.app_id,
        generation=pb.generation,
        state=state_from_pb(pb.state),
        task_ids=tuple(pb.task_ids),
        tasks=tuple(task_from_pb(t) for t in pb.tasks),
        created_at_ms=pb.created_at_ms,
        completed_at_ms=pb.completed_at_ms,
        expires_at_ms=pb.expires_at_ms,
        labels=dict(pb.labels),
        abort_reason=pb.abort_reason,
    )


def create_snapshot_request(
    app_id: str, task_ids: Iterable[str], ttl_ms: int, timeout_ms: int, labels: Mapping[str, str]
) -> snapshot_pb2.CreateSnapshotRequest:
    return snapshot_pb2.CreateSnapshotRequest(
        app_id=app_id, task_ids=list(task_ids), ttl_ms=ttl_ms, timeout_ms=timeout_ms, labels=dict(labels)
    )


def get_current_request(app_id: str, consistent: bool) -> snapshot_pb2.GetCurrentSnapshotRequest:
    return snapshot_pb2.GetCurrentSnapshotRequest(app_id=app_id, consistent=consistent)


def read_checkpoint_request(
    app_id: str, generation: int, task_id: str, store: str
) -> snapshot_pb2.ReadCheckpointRequest:
    return snapshot_pb2.ReadCheckpointRequest(
        app_id=app_id, generation=generation, task_id=task_id, store=store
    )


def get_snapshot_request(
    app_id: str, generation: int, include_checkpoints: bool
) -> snapshot_pb2.GetSnapshotRequest:
    return snapshot_pb2.GetSnapshotRequest(
        app_id=app_id, generation=generation, include_checkpoints=include_checkpoints
    )


def list_snapshots_request(app_id: str, page_size: int, page_token: str) -> snapshot_pb2.ListSnapshotsRequest:
    return snapshot_pb2.ListSnapshotsRequest(app_id=app_id, page_size=page_size, page_token=page_token)


def snapshot_page_from_pb(pb: snapshot_pb2.ListSnapshotsResponse) -> Page[Snapshot]:
    return Page(tuple(snapshot_from_pb(s) for s in pb.snapshots), pb.next_page_token)


def report_request(
    app_id: str, generation: int, task: TaskSnapshot
) -> snapshot_pb2.ReportTaskSnapshotRequest:
    return snapshot_pb2.ReportTaskSnapshotRequest(app_id=app_id, generation=generation, task=task_to_pb(task))


def abort_request(app_id: str, generation: int, reason: str) -> snapshot_pb2.AbortSnapshotRequest:
    return snapshot_pb2.AbortSnapshotRequest(app_id=app_id, generation=generation, reason=reason)


def delete_snapshot_request(app_id: str, generation: int) -> snapshot_pb2.DeleteSnapshotRequest:
    return snapshot_pb2.DeleteSnapshotRequest(app_id=app_id, generation=generation)


def retention_request(
    app_id: str, keep_last_completed: int, completed_ttl_ms: int
) -> snapshot_pb2.SetRetentionPolicyRequest:
    return snapshot_pb2.SetRetentionPolicyRequest(
        app_id=app_id, keep_last_completed=keep_last_completed, completed_ttl_ms=completed_ttl_ms
    )


def retention_from_pb(pb: snapshot_pb2.RetentionPolicy) -> RetentionPolicy:
    return RetentionPolicy(pb.app_id, pb.keep_last_completed, pb.completed_ttl_ms)


# --- LeaseService ---------------------------------------------------------------------------------


def lease_from_pb(pb: lease_pb2.Lease) -> Lease:
    return Lease(pb.lease_id, pb.duration_ms, pb.expires_at_ms, refs_from_pb(pb.snapshots))


def acquire_request(
    lease_id: str, duration_ms: int, snapshots: Iterable[SnapshotRef]
) -> lease_pb2.AcquireSnapshotsRequest:
    return lease_pb2.AcquireSnapshotsRequest(
        lease_id=lease_id, duration_ms=duration_ms, snapshots=refs_to_pb(snapshots)
    )


def acquire_from_pb(pb: lease_pb2.AcquireSnapshotsResponse) -> AcquireResult:
    return AcquireResult(lease_from_pb(pb.lease), refs_from_pb(pb.unavailable))


def release_request(lease_id: str, snapshots: Iterable[SnapshotRef]) -> lease_pb2.ReleaseSnapshotsRequest:
    return lease_pb2.ReleaseSnapshotsRequest(lease_id=lease_id, snapshots=refs_to_pb(snapshots))


def renew_request(lease_id: str, duration_ms: int) -> lease_pb2.RenewLeaseRequest:
    return lease_pb2.RenewLeaseRequest(lease_id=lease_id, duration_ms=duration_ms)


def drop_request(lease_id: str) -> lease_pb2.DropLeaseRequest:
    return lease_pb2.DropLeaseRequest(lease_id=lease_id)


def get_lease_request(lease_id: str) -> lease_pb2.GetLeaseRequest:
    return lease_pb2.GetLeaseRequest(lease_id=lease_id)


def list_leases_request(page_size: int, page_token: str) -> lease_pb2.ListLeasesRequest:
    return lease_pb2.ListLeasesRequest(page_size=page_size, page_token=page_token)


def lease_page_from_pb(pb: lease_pb2.ListLeasesResponse) -> Page[Lease]:
    return Page(tuple(lease_from_pb(x) for x in pb.leases), pb.next_page_token)


# --- BacklogService -------------------------------------------------------------------------------


def backlog_status_from_pb(pb: backlog_pb2.BacklogStatus) -> BacklogStatus:
    return BacklogStatus(
        pb.job_id,
        pb.processing_backlog,
        tuple(
            PartitionBacklog(p.stream, p.partition, p.boundary, p.position, p.finished) for p in pb.partitions
        ),
        offsets_from_pb(pb.added),
        pb.unmarked_partitions,
    )


def mark_request(job_id: str, boundaries: Iterable[Offset], reset: bool) -> backlog_pb2.MarkBacklogRequest:
    return backlog_pb2.MarkBacklogRequest(job_id=job_id, boundaries=offsets_to_pb(boundaries), reset=reset)


def progress_request(
    job_id: str, positions: Iterable[Offset], report_id: str = ""
) -> backlog_pb2.ReportProgressRequest:
    return backlog_pb2.ReportProgressRequest(
        job_id=job_id, positions=offsets_to_pb(positions), report_id=report_id
    )


def progress_from_pb(pb: backlog_pb2.ReportProgressResponse) -> ProgressResult:
    return ProgressResult(
        offsets_from_pb(pb.newly_finished), backlog_status_from_pb(pb.status), offsets_from_pb(pb.unmarked)
    )


def get_backlog_request(job_id: str) -> backlog_pb2.GetBacklogStatusRequest:
    return backlog_pb2.GetBacklogStatusRequest(job_id=job_id)


def clear_backlog_request(job_id: str) -> backlog_pb2.ClearBacklogRequest:
    return backlog_pb2.ClearBacklogRequest(job_id=job_id)


# --- bool answers ---------------------------------------------------------------------------------


def deleted_producer_from_pb(pb: producer_pb2.DeleteProducerOffsetsResponse) -> bool:
    return pb.deleted


def deleted_snapshot_from_pb(pb: snapshot_pb2.DeleteSnapshotResponse) -> bool:
    return pb.deleted


def dropped_from_pb(pb: lease_pb2.DropLeaseResponse) -> bool:
    return pb.dropped


def cleared_from_pb(pb: backlog_pb2.ClearBacklogResponse) -> bool:
    return pb.cleared


def lease_of_pb(pb: lease_pb2.ReleaseSnapshotsResponse | lease_pb2.RenewLeaseResponse) -> Lease:
    return lease_from_pb(pb.lease)


# --- CommitClaimService ---------------------------------------------------------------------------


def fence_table_request(table_id: str, epoch: int, seq: int) -> commit_pb2.FenceTableRequest:
    return commit_pb2.FenceTableRequest(table_id=table_id, epoch=epoch, seq=seq)


def table_fence_from_pb(pb: commit_pb2.FenceTableResponse) -> TableFence:
    return TableFence(pb.fence_epoch, pb.from_seq)


def claim_commit_request(table_id: str, seq: int, epoch: int, attempt: str) -> commit_pb2.ClaimCommitRequest:
    return commit_pb2.ClaimCommitRequest(table_id=table_id, seq=seq, epoch=epoch, attempt=attempt)


def commit_claim_from_pb(pb: commit_pb2.CommitClaim) -> CommitClaim:
    return CommitClaim(pb.seq, pb.epoch, pb.attempt, pb.claimed_at_ms)


def claim_result_from_pb(pb: commit_pb2.ClaimCommitResponse) -> CommitClaimResult:
    return CommitClaimResult(pb.granted, commit_claim_from_pb(pb.holder), pb.fence_epoch)


def get_claims_request(table_id: str, from_seq: int, limit: int) -> commit_pb2.GetCommitClaimsRequest:
    return commit_pb2.GetCommitClaimsRequest(table_id=table_id, from_seq=from_seq, limit=limit)


def commit_claims_from_pb(pb: commit_pb2.GetCommitClaimsResponse) -> CommitClaims:
    return CommitClaims(pb.fence_epoch, tuple(commit_claim_from_pb(c) for c in pb.claims), pb.next_seq)
