"""Rich error details end to end: a real coordinator sends google.rpc.ErrorInfo, the real client
turns it into the right exception with ``reason`` and ``metadata``, googleapis' own protos read the
same bytes, and grpcurl prints them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest

from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from harness.process import wait_until
from harness.zookeeper import ZooKeeperServer
from snapcoord.client import (
    CoordinatorClient,
    Expired,
    FailedPrecondition,
    InvalidArgument,
    LeaseHeld,
    NotFound,
    Offset,
    RetryPolicy,
    SnapshotFenced,
    SnapshotInProgress,
    TaskSnapshot,
    Unavailable,
)
from snapcoord.client.errors import error_from_rpc
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.local.blob_files import LocalBlobStore
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

GRPCURL = Path(sys.executable).parent / "grpcurl"


def _report(client: CoordinatorClient, app: str, generation: int, task: str, offset: int) -> None:
    client.report_task_snapshot(app, generation, TaskSnapshot(task, (Offset("in", 0, offset),)))


def test_snapshot_fenced_carries_the_current_generation(client: CoordinatorClient, uid: str) -> None:
    client.create_snapshot(uid, ["t0"])
    _report(client, uid, 1, "t0", 1)
    client.create_snapshot(uid, ["t0"])  # generation 2 is current now

    with pytest.raises(SnapshotFenced) as stale:
        _report(client, uid, 1, "t0", 2)
    assert (stale.value.code, stale.value.reason) == ("FAILED_PRECONDITION", "SNAPSHOT_FENCED")
    assert stale.value.metadata == {"app_id": uid, "generation": "1", "current_generation": "2"}
    assert stale.value.current_generation == 2

    with pytest.raises(SnapshotFenced) as future:
        _report(client, uid, 7, "t0", 2)
    assert future.value.reason == "SNAPSHOT_FENCED" and future.value.current_generation == 2
    assert future.value.metadata["generation"] == "7"


def test_report_conflict_and_not_created_are_fenced_too(client: CoordinatorClient, uid: str) -> None:
    client.create_snapshot(uid, ["t0", "t1"])
    _report(client, uid, 1, "t0", 1)
    with pytest.raises(SnapshotFenced) as conflict:
        _report(client, uid, 1, "t0", 99)
    assert conflict.value.reason == "REPORT_CONFLICT"
    assert conflict.value.metadata == {"app_id": uid, "generation": "1", "task_id": "t0"}

    _report(client, uid, 1, "t1", 1)  # completes generation 1
    with pytest.raises(SnapshotFenced) as completed:
        _report(client, uid, 1, "t1", 5)
    assert completed.value.reason == "SNAPSHOT_NOT_CREATED"
    assert completed.value.metadata["state"] == "COMPLETED"
    assert completed.value.current_generation == 1
    with pytest.raises(SnapshotFenced) as abort:
        client.abort_snapshot(uid, 1)
    assert (abort.value.reason, abort.value.metadata["state"]) == ("SNAPSHOT_NOT_CREATED", "COMPLETED")


def test_lease_held_and_in_progress_name_the_snapshot(client: CoordinatorClient, uid: str) -> None:
    first = client.create_snapshot(uid, ["t0"])
    _report(client, uid, 1, "t0", 1)
    client.acquire_snapshots(f"{uid}-lease", [first.ref], duration_ms=600_000)
    with pytest.raises(LeaseHeld) as held:
        client.delete_snapshot(uid, 1)
    assert isinstance(held.value, FailedPrecondition) and not isinstance(held.value, SnapshotFenced)
    assert held.value.reason == "LEASE_HELD"
    assert held.value.metadata == {"app_id": uid, "generation": "1"}

    client.create_snapshot(uid, ["t0"])
    with pytest.raises(SnapshotInProgress) as created:
        client.delete_snapshot(uid, 2)
    assert created.value.reason == "SNAPSHOT_IN_PROGRESS"
    assert created.value.metadata == {"app_id": uid, "generation": "2"}
    # Neither refusal deleted anything.
    assert client.get_snapshot(uid, 1).generation == 1
    assert client.get_snapshot(uid, 2).generation == 2


def test_not_found_and_invalid_argument_carry_their_reason(client: CoordinatorClient, uid: str) -> None:
    with pytest.raises(NotFound) as missing:
        client.get_lease(f"{uid}-none")
    assert type(missing.value) is NotFound
    assert (missing.value.reason, missing.value.code) == ("NOT_FOUND", "NOT_FOUND")

    with pytest.raises(InvalidArgument) as bad:
        client.get_current_snapshot("not a valid id!")
    assert (bad.value.reason, bad.value.code) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    assert "not a valid id!" in bad.value.details


def test_expired_producer_offsets(client: CoordinatorClient, uid: str) -> None:
    client.register_producer_offsets(uid, [Offset("out", 0, 3)], ttl_ms=1)

    def expired() -> Expired | None:
        try:
            client.get_producer_offsets(uid)
        except Expired as e:
            return e
        return None

    error = wait_until(expired, timeout=60, what="the registration to expire")
    assert isinstance(error, NotFound) and error.reason == "EXPIRED"
    assert error.metadata["producer_id"] == uid
    assert int(error.metadata["expires_at_ms"]) > 0


def test_expired_lease(tmp_path: Path, uid: str) -> None:
    # A coordinator of its own: no clock-skew margin and 1 ms leases, so expiry comes quickly.
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, max_clock_skew="0s", lease_min_duration="1ms") as coord,
        CoordinatorClient(coord.target) as client,
    ):
        lease = client.acquire_snapshots(uid, [], duration_ms=1).lease

        def expired() -> Expired | None:
            try:
                client.renew_lease(uid, duration_ms=1)
            except Expired as e:
                return e
            return None

        error = wait_until(expired, timeout=60, what="the lease to expire")
    assert (error.code, error.reason) == ("NOT_FOUND", "EXPIRED")
    assert error.metadata["lease_id"] == uid
    assert int(error.metadata["expires_at_ms"]) >= lease.expires_at_ms


def test_unavailable_from_the_coordinator_carries_details(
    tmp_path: Path, private_zk_server: ZooKeeperServer
) -> None:
    store = ZooKeeperMetadataStore.from_uri(f"zk://{private_zk_server.hosts}/details")
    blobs = LocalBlobStore.from_uri((tmp_path / "blobs").as_uri())
    try:
        with (
            serve_in_process(Deps(metadata=store, blobs=blobs)) as coord,
            CoordinatorClient(coord.target, retry=RetryPolicy(max_attempts=1)) as client,
        ):
            assert client.get_current_snapshot("app", consistent=True).generation == 0
            private_zk_server.stop()
            wait_until(lambda: not store.is_usable(), timeout=60, what="the store to notice")
            with pytest.raises(Unavailable) as down:
                client.get_current_snapshot("app", consistent=True)
    finally:
        store.close()
        blobs.close()
    assert (down.value.code, down.value.reason) == ("UNAVAILABLE", "UNAVAILABLE")
    assert down.value.attempts == 1


def test_a_status_without_details_has_no_reason(coordinator: InProcessCoordinator) -> None:
    """grpc's own statuses (here UNIMPLEMENTED for a method the server does not know) carry no
    ErrorInfo: the class comes from the code alone."""
    with grpc.insecure_channel(coordinator.target) as channel, pytest.raises(grpc.RpcError) as e:
        channel.unary_unary("/snapcoord.v1.LeaseService/NoSuchRpc")(b"", timeout=30)
    error = error_from_rpc(e.value, "NoSuchRpc")
    assert (error.code, error.reason, error.metadata) == ("UNIMPLEMENTED", None, {})


# --- next to googleapis-common-protos ----------------------------------------------------------

_NEXT_TO_GOOGLEAPIS = textwrap.dedent(
    """
    import json, sys
    target, app, order = sys.argv[1:]
    if order == "googleapis-first":
        from google.rpc import error_details_pb2, status_pb2
        import snapcoord.client
    else:
        import snapcoord.client
        from google.rpc import error_details_pb2, status_pb2
    import grpc
    from snapcoord.client import CoordinatorClient, SnapshotFenced
    from snapcoord.v1 import snapshot_pb2, snapshot_pb2_grpc

    with CoordinatorClient(target) as client:
        try:
            client.report_task_snapshot(app, 9, snapcoord.client.TaskSnapshot("t0"))
        except SnapshotFenced as e:
            ours = {"reason": e.reason, "metadata": e.metadata, "cls": type(e).__name__}
    # The same trailer read with googleapis' real messages: the copies are wire-compatible.
    with grpc.insecure_channel(target) as channel:
        stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        request = snapshot_pb2.ReportTaskSnapshotRequest(app_id=app, generation=9)
        request.task.task_id = "t0"
        try:
            stub.ReportTaskSnapshot(request, timeout=30)
        except grpc.RpcError as e:
            raw = dict(e.trailing_metadata())["grpc-status-details-bin"]
            status = status_pb2.Status.FromString(raw)
            info = error_details_pb2.ErrorInfo()
            assert status.details[0].Unpack(info)
            theirs = {"code": status.code, "message": status.message, "call_code": e.code().value[0],
                      "call_message": e.details(), "reason": info.reason, "domain": info.domain,
                      "metadata": dict(info.metadata)}
    print(json.dumps({"ours": ours, "theirs": theirs}))
    """
)


@pytest.mark.parametrize("order", ["googleapis-first", "snapcoord-first"])
@pytest.mark.process
def test_the_client_works_next_to_googleapis_common_protos(
    coordinator: InProcessCoordinator, client: CoordinatorClient, uid: str, order: str
) -> None:
    """Spark Connect imports googleapis-common-protos into the driver; the client's copies live
    under their own names, so either import order works, and both decode the same bytes."""
    client.create_snapshot(uid, ["t0"])
    done = subprocess.run(
        [sys.executable, "-c", _NEXT_TO_GOOGLEAPIS, coordinator.target, uid, order],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    metadata = {"app_id": uid, "generation": "9", "current_generation": "1"}
    assert result["ours"] == {"reason": "SNAPSHOT_FENCED", "metadata": metadata, "cls": "SnapshotFenced"}
    theirs = result["theirs"]
    assert (theirs["reason"], theirs["domain"]) == ("SNAPSHOT_FENCED", "snapcoord.dev")
    assert theirs["metadata"] == metadata
    assert (theirs["code"], theirs["message"]) == (theirs["call_code"], theirs["call_message"])


# --- grpcurl -----------------------------------------------------------------------------------


@pytest.mark.process
def test_grpcurl_prints_the_reason_and_metadata(
    coordinator: InProcessCoordinator, client: CoordinatorClient, uid: str
) -> None:
    """Server reflection describes google.rpc.ErrorInfo, so grpcurl decodes the detail."""
    client.create_snapshot(uid, ["t0"])
    request = json.dumps({"app_id": uid, "generation": 4, "task": {"task_id": "t0"}})
    method = "snapcoord.v1.SnapshotService/ReportTaskSnapshot"
    done = subprocess.run(
        [str(GRPCURL), "-plaintext", "-d", request, coordinator.target, method],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Code: FailedPrecondition" in done.stderr
    assert "not recognized" not in done.stderr, done.stderr  # decoded, not shown as raw bytes
    printed = done.stderr.replace(" ", "")
    assert '"@type":"type.googleapis.com/google.rpc.ErrorInfo"' in printed
    assert '"domain":"snapcoord.dev"' in printed
    assert '"reason":"SNAPSHOT_FENCED"' in printed
    assert '"current_generation":"1"' in printed, done.stderr


def test_a_message_echoing_a_huge_input_keeps_its_code_and_reason(client: CoordinatorClient) -> None:
    """The message travels in trailers; the server clips it so the client's metadata limit never
    turns INVALID_ARGUMENT into RESOURCE_EXHAUSTED."""
    with pytest.raises(InvalidArgument) as bad:
        client.list_producer_offsets(page_token="x" * 50_000)
    assert (bad.value.code, bad.value.reason) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    assert "page_token" in bad.value.details and len(bad.value.details) <= 1024
