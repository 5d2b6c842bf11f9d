"""Every RPC through CoordinatorClient against a real coordinator: results, and errors mapped to the
client's exceptions with the server's message."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import FrozenInstanceError, is_dataclass

import grpc
import pytest

from harness.claims import assert_claims_unsupported
from harness.coordinator import InProcessCoordinator
from snapcoord.client import (
    AcquireResult,
    AdvanceResult,
    BacklogStatus,
    CoordinatorClient,
    FailedPrecondition,
    InvalidArgument,
    Lease,
    NotFound,
    Offset,
    Page,
    PartitionBacklog,
    ProducerSnapshot,
    Registration,
    ResourceExhausted,
    RetentionPolicy,
    Snapshot,
    SnapshotFenced,
    SnapshotRef,
    SnapshotState,
    TaskSnapshot,
    Unimplemented,
)
from snapcoord.v1 import producer_pb2_grpc


def test_advance_producer_offsets(client: CoordinatorClient, uid: str) -> None:
    first = client.register_producer_offsets(f"{uid}.b0", [Offset("orders", 0, 1)])
    advanced = client.advance_producer_offsets(
        f"{uid}.b1", [Offset("orders", 0, 2)], previous_producer_id=f"{uid}.b0", ttl_ms=60_000
    )
    assert isinstance(advanced, AdvanceResult)
    assert advanced.registered and advanced.previous_deleted
    assert advanced.snapshot.offsets == (Offset("orders", 0, 2),)
    assert advanced.snapshot.expires_at_ms - advanced.snapshot.created_at_ms == 60_000
    with pytest.raises(NotFound):
        client.get_producer_offsets(first.snapshot.producer_id)
    again = client.advance_producer_offsets(
        f"{uid}.b1", [Offset("orders", 0, 3)], previous_producer_id=f"{uid}.b0"
    )
    assert (again.registered, again.snapshot, again.previous_deleted) == (False, advanced.snapshot, False)
    with pytest.raises(InvalidArgument, match="previous_producer_id equals producer_id"):
        client.advance_producer_offsets(
            f"{uid}.b1", [Offset("orders", 0, 3)], previous_producer_id=f"{uid}.b1"
        )
    assert client.get_producer_offsets(f"{uid}.b1") == advanced.snapshot


def test_producer_offsets_round_trip(client: CoordinatorClient, uid: str) -> None:
    offsets = (Offset("orders", 0, 42), Offset("orders", 1, 17))
    first = client.register_producer_offsets(uid, offsets)
    assert isinstance(first, Registration) and isinstance(first.snapshot, ProducerSnapshot)
    assert first.registered
    assert first.snapshot.producer_id == uid
    assert first.snapshot.offsets == offsets
    assert first.snapshot.expires_at_ms > first.snapshot.created_at_ms > 0

    second = client.register_producer_offsets(uid, [Offset("orders", 0, 99)], ttl_ms=60_000)
    assert not second.registered
    assert second.snapshot == first.snapshot  # the stored record, to roll back to

    assert client.get_producer_offsets(uid) == first.snapshot
    page = client.list_producer_offsets(page_size=1000)
    assert isinstance(page, Page)
    assert first.snapshot in page.items
    assert client.delete_producer_offsets(uid) is True
    assert client.delete_producer_offsets(uid) is False
    with pytest.raises(NotFound) as e:
        client.get_producer_offsets(uid)
    assert e.value.code == "NOT_FOUND"
    assert e.value.method == "GetProducerOffsets"
    assert uid in e.value.details


def test_list_pages_through_tokens(client: CoordinatorClient, uid: str) -> None:
    for i in range(3):
        client.register_producer_offsets(f"{uid}-{i}", [Offset("s", 0, i)])
    seen: list[str] = []
    token = ""
    while True:
        page = client.list_producer_offsets(page_size=2, page_token=token)
        assert len(page.items) <= 2
        seen += [p.producer_id for p in page]
        token = page.next_page_token
        if not token:
            break
    assert {f"{uid}-{i}" for i in range(3)} <= set(seen)


def test_snapshot_lifecycle(client: CoordinatorClient, uid: str) -> None:
    empty = client.get_current_snapshot(uid)
    assert (empty.generation, empty.state, empty.task_ids) == (0, SnapshotState.EMPTY, ())

    created = client.create_snapshot(uid, ["t0", "t1"], labels={"run": "1"}, timeout_ms=600_000)
    assert isinstance(created, Snapshot)
    assert (created.generation, created.state, created.task_ids) == (1, SnapshotState.CREATED, ("t0", "t1"))
    assert created.labels == {"run": "1"}
    assert created.ref == SnapshotRef(uid, 1)
    # CREATED already: returned unchanged, which is what makes CreateSnapshot safe to retry.
    assert client.create_snapshot(uid, ["other"]) == created

    t0 = TaskSnapshot("t0", (Offset("in", 0, 5),), {"agg": b"state-0"})
    after_t0 = client.report_task_snapshot(uid, 1, t0)
    assert after_t0.state is SnapshotState.CREATED
    assert [t.task_id for t in after_t0.tasks] == ["t0"]
    assert client.report_task_snapshot(uid, 1, t0).state is SnapshotState.CREATED  # same report: accepted

    done = client.report_task_snapshot(uid, 1, TaskSnapshot("t1", (Offset("in", 1, 7),)))
    assert done.state is SnapshotState.COMPLETED
    assert done.completed_at_ms >= done.created_at_ms

    full = client.get_snapshot(uid, 1, include_checkpoints=True)
    assert [t.task_id for t in full.tasks] == ["t0", "t1"]
    assert full.tasks[0] == t0
    assert full.tasks[1].committed_offsets == (Offset("in", 1, 7),)
    without = client.get_snapshot(uid, 1)
    assert without.tasks[0].checkpoints == {"agg": b""}  # store names only

    assert client.get_current_snapshot(uid, consistent=True).generation == 1
    aborted = client.abort_snapshot(uid, client.create_snapshot(uid, ["t0"]).generation, "operator")
    assert (aborted.generation, aborted.state, aborted.abort_reason) == (2, SnapshotState.ABORTED, "operator")
    assert client.abort_snapshot(uid, 2, "again").abort_reason == "operator"  # idempotent

    listed = client.list_snapshots(uid)
    assert [s.generation for s in listed.items] == [2, 1]  # newest first
    assert listed.next_page_token == ""

    policy = client.set_retention_policy(uid, keep_last_completed=5, completed_ttl_ms=3_600_000)
    assert policy == RetentionPolicy(uid, 5, 3_600_000)

    assert client.delete_snapshot(uid, 2) is True
    assert client.delete_snapshot(uid, 2) is False
    with pytest.raises(NotFound, match="generation 2"):
        client.get_snapshot(uid, 2)


def test_report_errors_map_to_fenced_and_invalid_argument(client: CoordinatorClient, uid: str) -> None:
    client.create_snapshot(uid, ["t0"])
    client.report_task_snapshot(uid, 1, TaskSnapshot("t0", (Offset("in", 0, 1),)))
    second = client.create_snapshot(uid, ["t0", "t1"])
    assert second.generation == 2

    # Fenced: generation 1 is no longer the current one.
    with pytest.raises(SnapshotFenced) as fenced:
        client.report_task_snapshot(uid, 1, TaskSnapshot("t0", (Offset("in", 0, 2),)))
    assert fenced.value.code == "FAILED_PRECONDITION"
    assert "fenced" in fenced.value.details
    assert fenced.value.current_generation == 2
    assert isinstance(fenced.value, FailedPrecondition)

    # A different report from a task that already reported can never be accepted either.
    client.report_task_snapshot(uid, 2, TaskSnapshot("t0", (Offset("in", 0, 3),)))
    with pytest.raises(SnapshotFenced, match="already reported a different snapshot"):
        client.report_task_snapshot(uid, 2, TaskSnapshot("t0", (Offset("in", 0, 4),)))

    with pytest.raises(InvalidArgument, match="not in the task set") as bad:
        client.report_task_snapshot(uid, 2, TaskSnapshot("stranger"))
    assert bad.value.code == "INVALID_ARGUMENT"

    # The same code from another RPC is a plain FailedPrecondition, not a fence.
    with pytest.raises(FailedPrecondition, match="still CREATED") as created:
        client.delete_snapshot(uid, 2)
    assert not isinstance(created.value, SnapshotFenced)


def test_invalid_identifiers_are_invalid_argument(client: CoordinatorClient) -> None:
    with pytest.raises(InvalidArgument) as e:
        client.get_current_snapshot("not a valid id!")
    assert e.value.details  # the server's explanation travels along
    assert "INVALID_ARGUMENT" in str(e.value) and "GetCurrentSnapshot" in str(e.value)
    with pytest.raises(InvalidArgument):
        client.register_producer_offsets("..", [Offset("s", 0, 1)])


def test_leases(client: CoordinatorClient, uid: str) -> None:
    client.create_snapshot(uid, ["t"])
    client.report_task_snapshot(uid, 1, TaskSnapshot("t"))
    pinned, missing = SnapshotRef(uid, 1), SnapshotRef(uid, 7)

    acquired = client.acquire_snapshots(uid, [pinned, missing], duration_ms=60_000)
    assert isinstance(acquired, AcquireResult) and isinstance(acquired.lease, Lease)
    assert acquired.lease.snapshots == (pinned,)
    assert acquired.unavailable == (missing,)
    assert acquired.lease.duration_ms == 60_000

    with pytest.raises(FailedPrecondition, match="lease"):
        client.delete_snapshot(uid, 1)

    renewed = client.renew_lease(uid, duration_ms=120_000)
    assert renewed.duration_ms == 120_000 and renewed.expires_at_ms >= acquired.lease.expires_at_ms
    assert client.get_lease(uid) == renewed
    assert renewed in client.list_leases(page_size=1000).items
    released = client.release_snapshots(uid, [pinned])
    assert released.snapshots == ()
    assert client.delete_snapshot(uid, 1) is True

    assert client.drop_lease(uid) is True
    assert client.drop_lease(uid) is False
    with pytest.raises(NotFound):
        client.get_lease(uid)
    with pytest.raises(NotFound):
        client.renew_lease(uid, duration_ms=60_000)
    with pytest.raises(InvalidArgument, match="duration"):
        client.acquire_snapshots(uid, [], duration_ms=5)


def test_backlog(client: CoordinatorClient, uid: str) -> None:
    with pytest.raises(NotFound):
        client.get_backlog_status(uid)
    marked = client.mark_backlog(uid, [Offset("in", 0, 10), Offset("in", 1, 20)])
    assert isinstance(marked, BacklogStatus)
    assert marked.processing_backlog
    assert marked.partitions[0] == PartitionBacklog("in", 0, 10, marked.partitions[0].position, False)

    again = client.mark_backlog(uid, [Offset("in", 0, 99)])  # first mark wins
    assert [p.boundary for p in again.partitions] == [10, 20]

    progress = client.report_progress(uid, [Offset("in", 0, 10), Offset("in", 1, 5)])
    assert progress.newly_finished == (Offset("in", 0, 10),)
    assert progress.status.processing_backlog
    assert client.report_progress(uid, [Offset("in", 0, 11)]).newly_finished == ()  # exactly once
    last = client.report_progress(uid, [Offset("in", 1, 20)])
    assert last.newly_finished == (Offset("in", 1, 20),)
    assert not last.status.processing_backlog

    status = client.get_backlog_status(uid)
    assert [(p.position, p.finished) for p in status.partitions] == [(11, True), (20, True)]
    assert status.added == ()
    unmarked = client.report_progress(uid, [Offset("in", 1, 20), Offset("in", 2, 3)])
    assert unmarked.unmarked == (Offset("in", 2, 3),)  # answered: the mark lacks it
    grown = client.mark_backlog(uid, [Offset("in", 1, 90), Offset("in", 2, 8)])
    assert grown.added == (Offset("in", 2, 8),)
    assert [(p.boundary, p.finished) for p in grown.partitions] == [(10, True), (20, True), (8, False)]
    assert grown.processing_backlog
    reset = client.mark_backlog(uid, [Offset("in", 0, 50)], reset=True)
    assert [p.boundary for p in reset.partitions] == [50]
    assert client.clear_backlog(uid) is True
    assert client.clear_backlog(uid) is False


def test_results_are_frozen_dataclasses(client: CoordinatorClient, uid: str) -> None:
    snapshot = client.create_snapshot(uid, ["t"])
    assert is_dataclass(snapshot)
    with pytest.raises(FrozenInstanceError):
        snapshot.generation = 5  # type: ignore[misc]
    assert hash(snapshot) == hash(client.get_current_snapshot(uid, consistent=True))


def test_large_checkpoints_and_the_receive_limit(
    client: CoordinatorClient, coordinator: InProcessCoordinator, uid: str
) -> None:
    # 4 MiB, the coordinator's inline cap: with its framing, beyond gRPC's 4 MiB default receive limit
    payload = bytes(range(256)) * (4 * 4096)
    client.create_snapshot(uid, ["t"])
    client.report_task_snapshot(uid, 1, TaskSnapshot("t", checkpoints={"big": payload}))
    assert client.get_snapshot(uid, 1, include_checkpoints=True).tasks[0].checkpoints["big"] == payload

    with CoordinatorClient(coordinator.target, max_receive_message_bytes=1024 * 1024) as small:
        with pytest.raises(ResourceExhausted) as e:
            small.get_snapshot(uid, 1, include_checkpoints=True)
        assert e.value.code == "RESOURCE_EXHAUSTED"


@contextlib.contextmanager
def producer_only_server() -> Iterator[str]:
    """A server with only the producer service, every method unimplemented (an older coordinator
    stands in the same way for services it lacks); yields its target."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    producer_pb2_grpc.add_ProducerOffsetServiceServicer_to_server(
        producer_pb2_grpc.ProducerOffsetServiceServicer(), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def test_unimplemented_service() -> None:
    """A server that lacks a service (an older coordinator) answers UNIMPLEMENTED."""
    with producer_only_server() as target, CoordinatorClient(target, timeout_s=10) as client:
        with pytest.raises(Unimplemented) as missing:
            client.get_lease("any")
        assert missing.value.code == "UNIMPLEMENTED" and type(missing.value) is Unimplemented
        with pytest.raises(Unimplemented, match="Method not implemented"):
            client.get_producer_offsets("any")


def test_a_coordinator_without_commit_claims_is_refused_naming_the_release() -> None:
    """An older coordinator (no CommitClaimService) answers UNIMPLEMENTED; the client raises
    Unsupported naming 0.4.0, for every claim RPC, at once (never retried, no weaker fallback)."""
    with producer_only_server() as target, CoordinatorClient(target, timeout_s=10) as client:
        assert_claims_unsupported(client)


def test_closed_client_refuses_calls(coordinator: InProcessCoordinator) -> None:
    with CoordinatorClient(coordinator.target) as client:
        assert client.get_current_snapshot("app").generation == 0
    with pytest.raises(ValueError, match="closed"):
        client.get_current_snapshot("app")
    client.close()  # idempotent
