"""SnapshotService over gRPC: status codes, payload bytes, 50 tasks through two processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from harness.coordinator import CoordinatorProcess, embedded_deps, serve_in_process
from harness.process import wait_until
from snapcoord.v1 import common_pb2, snapshot_pb2, snapshot_pb2_grpc

Snap = snapshot_pb2.Snapshot
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[snapshot_pb2_grpc.SnapshotServiceStub]:
    with embedded_deps(tmp_path) as deps, serve_in_process(deps) as coord, coord.channel() as channel:
        yield snapshot_pb2_grpc.SnapshotServiceStub(channel)


def report(
    app_id: str, generation: int, task_id: str, offset: int, **checkpoints: bytes
) -> snapshot_pb2.ReportTaskSnapshotRequest:
    return snapshot_pb2.ReportTaskSnapshotRequest(
        app_id=app_id,
        generation=generation,
        task=snapshot_pb2.TaskSnapshot(
            task_id=task_id,
            committed_offsets=[common_pb2.Offset(stream="events", partition=0, offset=offset)],
            checkpoints=checkpoints,
        ),
    )


def rpc_error(call: object) -> tuple[grpc.StatusCode, str]:
    assert isinstance(call, grpc.RpcError) and isinstance(call, grpc.Call)
    return call.code(), call.details() or ""


def test_round_trip_and_status_codes(stub: snapshot_pb2_grpc.SnapshotServiceStub) -> None:
    empty = stub.GetCurrentSnapshot(snapshot_pb2.GetCurrentSnapshotRequest(app_id="clicks"), timeout=10)
    assert (empty.generation, empty.state) == (0, Snap.EMPTY)
    created = stub.CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(app_id="clicks", task_ids=["a", "b"], labels={"by": "test"}),
        timeout=10,
    )
    assert (created.generation, created.state, list(created.task_ids)) == (1, Snap.CREATED, ["a", "b"])
    partial = stub.ReportTaskSnapshot(report("clicks", 1, "a", 10, store=b"\x00state"), timeout=10)
    assert partial.state == Snap.CREATED and [t.task_id for t in partial.tasks] == ["a"]
    done = stub.ReportTaskSnapshot(report("clicks", 1, "b", 20), timeout=10)
    assert done.state == Snap.COMPLETED and done.completed_at_ms >= done.created_at_ms

    cheap = stub.GetSnapshot(snapshot_pb2.GetSnapshotRequest(app_id="clicks", generation=1), timeout=10)
    assert [t.task_id for t in cheap.tasks] == ["a", "b"] and dict(cheap.tasks[0].checkpoints) == {
        "store": b""
    }
    full = stub.GetSnapshot(
        snapshot_pb2.GetSnapshotRequest(app_id="clicks", generation=1, include_checkpoints=True), timeout=10
    )
    assert dict(full.tasks[0].checkpoints) == {"store": b"\x00state"}
    assert full.tasks[1].committed_offsets[0].offset == 20
    current = stub.GetCurrentSnapshot(
        snapshot_pb2.GetCurrentSnapshotRequest(app_id="clicks", consistent=True), timeout=10
    )
    assert (current.generation, current.state, dict(current.labels)) == (1, Snap.COMPLETED, {"by": "test"})

    stub.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id="clicks", task_ids=["a"]), timeout=10)

    def rpc(method: str, request: object) -> object:
        return getattr(stub, method)(request, timeout=10)

    get_missing = snapshot_pb2.GetSnapshotRequest(app_id="clicks", generation=9)
    delete_created = snapshot_pb2.DeleteSnapshotRequest(app_id="clicks", generation=2)
    bad_app = snapshot_pb2.CreateSnapshotRequest(app_id="x y", task_ids=["a"])
    cases: list[tuple[str, object, grpc.StatusCode, str]] = [
        ("ReportTaskSnapshot", report("clicks", 1, "a", 11), FAILED_PRECONDITION, "current generation is 2"),
        ("ReportTaskSnapshot", report("clicks", 2, "zzz", 1), INVALID_ARGUMENT, "not in the task set"),
        ("GetSnapshot", get_missing, NOT_FOUND, "no snapshot at generation 9"),
        ("DeleteSnapshot", delete_created, FAILED_PRECONDITION, "abort it before deleting it"),
        ("CreateSnapshot", bad_app, INVALID_ARGUMENT, "app_id 'x y' contains ' '"),
    ]
    for method, request, code, message in cases:
        with pytest.raises(grpc.RpcError) as e:
            rpc(method, request)
        got_code, details = rpc_error(e.value)
        assert got_code == code and message in details, details

    aborted = stub.AbortSnapshot(
        snapshot_pb2.AbortSnapshotRequest(app_id="clicks", generation=2, reason="drill"), timeout=10
    )
    assert (aborted.state, aborted.abort_reason) == (Snap.ABORTED, "drill")
    deleted = stub.DeleteSnapshot(
        snapshot_pb2.DeleteSnapshotRequest(app_id="clicks", generation=2), timeout=10
    )
    assert deleted.deleted
    listed = stub.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(app_id="clicks"), timeout=10)
    assert [s.generation for s in listed.snapshots] == [1]
    policy = stub.SetRetentionPolicy(
        snapshot_pb2.SetRetentionPolicyRequest(app_id="clicks", keep_last_completed=4), timeout=10
    )
    assert (policy.app_id, policy.keep_last_completed, policy.completed_ttl_ms) == (
        "clicks",
        4,
        7 * 86_400_000,
    )


def test_fifty_tasks_through_two_processes_complete_once(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    tasks = [f"query-{i:02d}" for i in range(50)]
    with (
        CoordinatorProcess(tmp_path / "a", args=args) as a,
        CoordinatorProcess(tmp_path / "b", args=args) as b,
        grpc.insecure_channel(a.target) as ca,
        grpc.insecure_channel(b.target) as cb,
    ):
        stubs = [snapshot_pb2_grpc.SnapshotServiceStub(c) for c in (ca, cb)]
        created = stubs[0].CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=tasks), timeout=30
        )
        assert created.generation == 1
        current = snapshot_pb2.GetCurrentSnapshotRequest(app_id="app")
        assert stubs[1].GetCurrentSnapshot(current, timeout=30).state == Snap.CREATED  # b caches it now
        barrier = threading.Barrier(50)

        def send(i: int) -> Snap:
            barrier.wait()
            reply: Snap = stubs[i % 2].ReportTaskSnapshot(
                report("app", 1, tasks[i], i, cp=bytes([i]) * 100), timeout=60
            )
            return reply

        with ThreadPoolExecutor(50) as pool:
            replies = list(pool.map(send, range(50)))
        assert [r.state for r in replies].count(Snap.COMPLETED) == 1
        full = stubs[1].GetSnapshot(
            snapshot_pb2.GetSnapshotRequest(app_id="app", generation=1, include_checkpoints=True), timeout=30
        )
        assert full.state == Snap.COMPLETED
        assert [t.task_id for t in full.tasks] == tasks
        assert all(t.committed_offsets[0].offset == i and t.checkpoints["cp"] == bytes([i]) * 100
                   for i, t in enumerate(full.tasks))  # fmt: skip
        # Replica b's cache learns of the completion from its ZooKeeper watches.
        wait_until(
            lambda: stubs[1].GetCurrentSnapshot(current, timeout=30).state == Snap.COMPLETED,
            timeout=30,
            what="replica b's cached current snapshot to complete",
        )
