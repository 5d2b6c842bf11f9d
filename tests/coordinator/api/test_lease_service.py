"""LeaseService over gRPC: status codes, the acquire/delete race through two processes, restarts."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from harness.coordinator import CoordinatorProcess, embedded_deps, serve_in_process
from snapcoord.v1 import common_pb2, lease_pb2, lease_pb2_grpc, snapshot_pb2, snapshot_pb2_grpc


def ref(app_id: str, generation: int) -> common_pb2.SnapshotRef:
    return common_pb2.SnapshotRef(app_id=app_id, generation=generation)


def complete(snapshots: snapshot_pb2_grpc.SnapshotServiceStub, app_id: str) -> int:
    created = snapshots.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(app_id=app_id, task_ids=["q"]), timeout=30
    )
    snapshots.ReportTaskSnapshot(
        snapshot_pb2.ReportTaskSnapshotRequest(
            app_id=app_id, generation=created.generation, task=snapshot_pb2.TaskSnapshot(task_id="q")
        ),
        timeout=30,
    )
    return int(created.generation)


def code_of(error: grpc.RpcError) -> grpc.StatusCode:
    assert isinstance(error, grpc.Call)
    return error.code()


def test_status_codes(tmp_path: Path) -> None:
    with embedded_deps(tmp_path) as deps, serve_in_process(deps) as coord, coord.channel() as channel:
        leases = lease_pb2_grpc.LeaseServiceStub(channel)
        snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        generation = complete(snapshots, "app")
        acquired = leases.AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(
                lease_id="restore", duration_ms=60_000, snapshots=[ref("app", generation), ref("app", 7)]
            ),
            timeout=10,
        )
        assert list(acquired.lease.snapshots) == [ref("app", generation)]
        assert list(acquired.unavailable) == [ref("app", 7)]
        with pytest.raises(grpc.RpcError) as e:
            snapshots.DeleteSnapshot(
                snapshot_pb2.DeleteSnapshotRequest(app_id="app", generation=1), timeout=10
            )
        assert code_of(e.value) == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as e:
            leases.GetLease(lease_pb2.GetLeaseRequest(lease_id="nope"), timeout=10)
        assert code_of(e.value) == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            leases.AcquireSnapshots(
                lease_pb2.AcquireSnapshotsRequest(lease_id="x", duration_ms=5), timeout=10
            )
        assert code_of(e.value) == grpc.StatusCode.INVALID_ARGUMENT
        assert leases.DropLease(lease_pb2.DropLeaseRequest(lease_id="restore"), timeout=10).dropped
        assert snapshots.DeleteSnapshot(
            snapshot_pb2.DeleteSnapshotRequest(app_id="app", generation=1), timeout=10
        ).deleted


def test_acquire_and_delete_race_never_both_win(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    with (
        CoordinatorProcess(tmp_path / "a", args=args) as a,
        CoordinatorProcess(tmp_path / "b", args=args) as b,
        grpc.insecure_channel(a.target) as ca,
        grpc.insecure_channel(b.target) as cb,
    ):
        snapshots_a = snapshot_pb2_grpc.SnapshotServiceStub(ca)
        snapshots_b = snapshot_pb2_grpc.SnapshotServiceStub(cb)
        leases_a = lease_pb2_grpc.LeaseServiceStub(ca)
        outcomes = [
            race_once(leases_a, snapshots_b, trial, complete(snapshots_a, "race")) for trial in range(20)
        ]
        pinned = sum(p for p, _ in outcomes)
        print(f"\nacquire/delete race: {pinned} pinned, {len(outcomes) - pinned} deleted")


def race_once(
    leases: lease_pb2_grpc.LeaseServiceStub,
    snapshots: snapshot_pb2_grpc.SnapshotServiceStub,
    trial: int,
    generation: int,
) -> tuple[bool, bool]:
    """Acquire (through one process) and delete (through the other) one snapshot at the same
    instant; check that exactly one of them won and that the store agrees."""
    barrier = threading.Barrier(2)
    result: dict[str, object] = {}

    def acquire() -> None:
        barrier.wait()
        result["acquired"] = leases.AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(
                lease_id=f"lease-{trial}", duration_ms=600_000, snapshots=[ref("race", generation)]
            ),
            timeout=30,
        )

    def delete() -> None:
        barrier.wait()
        try:
            request = snapshot_pb2.DeleteSnapshotRequest(app_id="race", generation=generation)
            result["deleted"] = snapshots.DeleteSnapshot(request, timeout=30).deleted
        except grpc.RpcError as e:
            assert code_of(e) == grpc.StatusCode.FAILED_PRECONDITION  # pinned first
            result["deleted"] = False

    threads = [threading.Thread(target=acquire), threading.Thread(target=delete)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acquired = result["acquired"]
    assert isinstance(acquired, lease_pb2.AcquireSnapshotsResponse)
    pinned = ref("race", generation) in acquired.lease.snapshots
    deleted = bool(result["deleted"])
    assert pinned != deleted, f"trial {trial}: pinned={pinned} deleted={deleted}"  # never both, never neither
    try:
        snapshots.GetSnapshot(
            snapshot_pb2.GetSnapshotRequest(app_id="race", generation=generation), timeout=30
        )
        still_there = True
    except grpc.RpcError as e:
        assert code_of(e) == grpc.StatusCode.NOT_FOUND
        still_there = False
    assert still_there == pinned
    return pinned, deleted


def test_a_lease_survives_a_coordinator_restart(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    with (
        CoordinatorProcess(tmp_path / "first", args=args) as first,
        grpc.insecure_channel(first.target) as channel,
    ):
        generation = complete(snapshot_pb2_grpc.SnapshotServiceStub(channel), "app")
        lease = lease_pb2_grpc.LeaseServiceStub(channel).AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(
                lease_id="restore", duration_ms=600_000, snapshots=[ref("app", generation)]
            ),
            timeout=30,
        )
        assert first.terminate() == 0
    with (
        CoordinatorProcess(tmp_path / "second", args=args) as second,
        grpc.insecure_channel(second.target) as channel,
    ):
        got = lease_pb2_grpc.LeaseServiceStub(channel).GetLease(
            lease_pb2.GetLeaseRequest(lease_id="restore"), timeout=30
        )
        assert got == lease.lease
        with pytest.raises(grpc.RpcError) as e:
            snapshot_pb2_grpc.SnapshotServiceStub(channel).DeleteSnapshot(
                snapshot_pb2.DeleteSnapshotRequest(app_id="app", generation=generation), timeout=30
            )
        assert code_of(e.value) == grpc.StatusCode.FAILED_PRECONDITION
