"""LeaseKeeper against a real coordinator: renewal, drop on exit, re-acquiring an expired lease,
lease ids that survive a driver crash, and degrading on a coordinator without leases."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.queues import SimpleQueue
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from harness.faults import TcpProxy
from snapcoord.client import (
    CoordinatorClient,
    FailedPrecondition,
    Lease,
    NotFound,
    SnapcoordError,
    SnapshotRef,
    TaskSnapshot,
    Unavailable,
    load_or_create_lease_id,
    save_lease_id,
)
from snapcoord.v1 import lease_pb2_grpc, snapshot_pb2_grpc

T = TypeVar("T")


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCoordinator]:
    """Leases as short as 1 s are allowed, so a 3 s lease renews every second."""
    with (
        embedded_deps(tmp_path_factory.mktemp("coordinator")) as deps,
        serve_in_process(deps, lease_min_duration="1s") as coord,
    ):
        yield coord


def wait_for(probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def lease_or_none(client: CoordinatorClient, lease_id: str) -> Lease | None:
    try:
        return client.get_lease(lease_id)
    except NotFound:
        return None


def completed(client: CoordinatorClient, app_id: str) -> SnapshotRef:
    created = client.create_snapshot(app_id, ["t"])
    return client.report_task_snapshot(app_id, created.generation, TaskSnapshot("t")).ref


def test_keeper_renews_inside_the_block_and_drops_on_exit(client: CoordinatorClient, uid: str) -> None:
    ref = completed(client, uid)
    with client.lease(uid, [ref, SnapshotRef(uid, 99)], duration_s=3) as keeper:
        first = keeper.lease
        assert first is not None and first.snapshots == (ref,)
        assert keeper.unavailable == (SnapshotRef(uid, 99),)
        assert keeper.healthy and keeper.supported
        # Past the first expiry the lease is still there, with a later expiry: it was renewed. (A
        # renewal may fail now and then on a loaded machine, as its deadline is the 1 s interval: the
        # keeper retries sooner, so wait for the outcome rather than assume every attempt made it.)
        wait_for(lambda: time.time() * 1000 > first.expires_at_ms + 500, "the first expiry to pass")

        def renewed() -> Lease | None:
            lease = lease_or_none(client, uid)
            return lease if lease is not None and lease.expires_at_ms > first.expires_at_ms else None

        held = wait_for(renewed, "a renewed lease")
        assert held.snapshots == (ref,)
        with pytest.raises(FailedPrecondition):
            client.delete_snapshot(uid, ref.generation)
        wait_for(lambda: keeper.healthy, "the keeper to be healthy")  # held, renewing, nothing lost
    with pytest.raises(NotFound):
        client.get_lease(uid)
    assert client.delete_snapshot(uid, ref.generation)


def test_keeper_drops_when_the_block_raises(client: CoordinatorClient, uid: str) -> None:
    ref = completed(client, uid)
    with pytest.raises(RuntimeError, match="boom"), client.lease(uid, [ref], duration_s=30):
        assert client.get_lease(uid).snapshots == (ref,)
        raise RuntimeError("boom")
    with pytest.raises(NotFound):
        client.get_lease(uid)


def test_keeper_acquires_again_a_lease_that_vanished(client: CoordinatorClient, uid: str) -> None:
    ref = completed(client, uid)
    with client.lease(uid, [ref], duration_s=3) as keeper:
        assert client.drop_lease(uid)  # as if it had expired and the janitor had removed it
        back = wait_for(lambda: lease_or_none(client, uid), "the keeper to acquire the lease again")
        assert back.snapshots == (ref,)
        assert keeper.lost == ()
        wait_for(lambda: keeper.healthy, "the keeper to report healthy")
    assert lease_or_none(client, uid) is None


def test_a_snapshot_deleted_while_the_lease_was_gone_is_reported_lost(
    coordinator: InProcessCoordinator, client: CoordinatorClient, uid: str
) -> None:
    gone, kept = completed(client, uid), completed(client, uid)
    proxy = TcpProxy("127.0.0.1", coordinator.port)
    try:
        with (
            CoordinatorClient(proxy.address, timeout_s=30) as keepers_client,
            keepers_client.lease(uid, [gone, kept], duration_s=3, renew_every_s=2) as keeper,
        ):
            assert keeper.lease is not None
            # Lose the lease and a snapshot while the keeper cannot reach the coordinator, so no
            # renewal can come in between (a gap of 2 s between renewals is not a guarantee on a
            # loaded machine).
            proxy.cut()
            assert client.drop_lease(uid)
            assert client.delete_snapshot(uid, gone.generation)
            proxy.restore()
            wait_for(lambda: keeper.lost, "the keeper to notice")
            assert keeper.lost == (gone,)
            assert not keeper.healthy
            assert keeper.lease is not None and keeper.lease.snapshots == (kept,)
    finally:
        proxy.close()


def test_renewal_failures_show_and_heal(coordinator: InProcessCoordinator, uid: str) -> None:
    proxy = TcpProxy("127.0.0.1", coordinator.port)
    try:
        with CoordinatorClient(proxy.address, timeout_s=30) as client:
            ref = completed(client, uid)
            with client.lease(uid, [ref], duration_s=3) as keeper:
                proxy.cut()
                wait_for(lambda: keeper.last_error is not None, "a failed renewal")
                assert isinstance(keeper.last_error, SnapcoordError)
                assert keeper.last_error.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
                assert not keeper.healthy
                proxy.restore()
                wait_for(lambda: keeper.healthy, "a successful renewal")
            assert lease_or_none(client, uid) is None
    finally:
        proxy.close()


def test_a_lease_past_its_duration_is_not_healthy_while_a_renewal_hangs(
    coordinator: InProcessCoordinator, uid: str
) -> None:
    """Renewing every 1.9 s of a 2 s lease, with the coordinator cut off: the renewal hangs up to
    its 1.9 s deadline, so for a while the latest renewal has not failed yet, but the lease has
    run out. ``healthy`` must say so (it once looked only at the latest renewal's outcome)."""
    proxy = TcpProxy("127.0.0.1", coordinator.port)
    try:
        with CoordinatorClient(proxy.address, timeout_s=30) as client:
            ref = completed(client, uid)
            with client.lease(uid, [ref], duration_s=2, renew_every_s=1.9) as keeper:
                entered = time.monotonic()
                assert keeper.healthy
                proxy.cut()
                wait_for(lambda: time.monotonic() > entered + 2.0, "the lease's duration to pass")
                assert not keeper.healthy
                proxy.restore()
                wait_for(lambda: keeper.healthy, "a lease held again")
    finally:
        proxy.close()


def test_entering_fails_when_the_coordinator_is_unreachable(coordinator: InProcessCoordinator) -> None:
    proxy = TcpProxy("127.0.0.1", coordinator.port)
    proxy.cut()
    try:
        with CoordinatorClient(proxy.address, timeout_s=1) as client:
            keeper = client.lease("unreachable", [], duration_s=3)
            with pytest.raises(Unavailable):
                keeper.__enter__()
            assert keeper.lease is None
    finally:
        proxy.close()


# --- lease ids in a file -----------------------------------------------------------------------------


def _crash_inside_the_block(target: str, path: Path, ref: SnapshotRef, results: SimpleQueue[str]) -> None:
    client = CoordinatorClient(target)
    lease_id = load_or_create_lease_id(path, "restore")
    with client.lease(lease_id, [ref], duration_s=60):
        results.put(lease_id)
        os._exit(3)  # the driver dies holding the lease: no exit, no drop


@pytest.mark.process
def test_a_restarted_driver_reuses_its_lease(
    client: CoordinatorClient, coordinator: InProcessCoordinator, uid: str, tmp_path: Path
) -> None:
    ref = completed(client, uid)
    path = tmp_path / "driver" / "lease-id"
    ctx = multiprocessing.get_context("fork")
    results: SimpleQueue[str] = ctx.SimpleQueue()  # written synchronously: the child dies right after
    first = ctx.Process(target=_crash_inside_the_block, args=(coordinator.target, path, ref, results))
    first.start()
    first.join(60)
    assert first.exitcode == 3
    crashed_id = results.get()
    assert client.get_lease(crashed_id).snapshots == (ref,)  # left behind until it expires

    lease_id = load_or_create_lease_id(path, "restore")
    assert lease_id == crashed_id
    with client.lease(lease_id, [ref], duration_s=60):
        ours = [x.lease_id for x in client.list_leases(page_size=1000).items if x.snapshots == (ref,)]
        assert ours == [crashed_id]  # taken over, not a second lease next to the leaked one
    assert lease_or_none(client, crashed_id) is None


def test_lease_id_file(tmp_path: Path) -> None:
    path = tmp_path / "lease-id"
    created = load_or_create_lease_id(path, "restore")
    assert created.startswith("restore-")
    assert load_or_create_lease_id(path, "other") == created
    save_lease_id(path, "mine")
    assert load_or_create_lease_id(path) == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["lease-id"]  # no temporary files left
    with pytest.raises(ValueError, match="not a valid lease id"):
        save_lease_id(path, "no spaces")
    path.write_text("../escape\n")
    with pytest.raises(ValueError, match="holds"):
        load_or_create_lease_id(path)
    with pytest.raises(ValueError, match="prefix"):
        load_or_create_lease_id(tmp_path / "fresh", "bad prefix")


def test_racing_drivers_agree_on_one_lease_id(tmp_path: Path) -> None:
    path = tmp_path / "lease-id"
    barrier = threading.Barrier(8)

    def race(_: int) -> str:
        barrier.wait()
        return load_or_create_lease_id(path, "race")

    with ThreadPoolExecutor(max_workers=8) as pool:
        ids = set(pool.map(race, range(8)))
    assert ids == {path.read_text().strip()}


# --- a coordinator without leases ---------------------------------------------------------------------


@pytest.mark.parametrize("lease_service", ["unimplemented methods", "no service"])
def test_keeper_degrades_to_one_warning(lease_service: str, caplog: pytest.LogCaptureFixture) -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    # An older coordinator: snapshots served (here: the generated base, enough to be a server), and
    # LeaseService either registered with every method unimplemented or not there at all.
    snapshot_pb2_grpc.add_SnapshotServiceServicer_to_server(
        snapshot_pb2_grpc.SnapshotServiceServicer(), server
    )
    if lease_service == "unimplemented methods":
        lease_pb2_grpc.add_LeaseServiceServicer_to_server(lease_pb2_grpc.LeaseServiceServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ran = False
    try:
        with (
            caplog.at_level(logging.WARNING, logger="snapcoord.client"),
            CoordinatorClient(f"127.0.0.1:{port}", timeout_s=10) as client,
            client.lease("old", [SnapshotRef("app", 1)], duration_s=3) as keeper,
        ):
            ran = True
            assert not keeper.supported
            assert keeper.lease is None and not keeper.healthy
    finally:
        server.stop(None)
    assert ran
    # (The bare server logs its own error for the unimplemented method; only ours count here.)
    warnings = [r for r in caplog.records if r.name == "snapcoord.client" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "does not support leases" in warnings[0].getMessage()
