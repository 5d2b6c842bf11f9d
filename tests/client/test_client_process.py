"""Process boundaries: lazy channels, no pickling, fork safety; and the client against a real
``snapcoord serve`` process on ZooKeeper and S3."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from multiprocessing.queues import Queue
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, NotFound, Offset, SnapshotRef, SnapshotState, TaskSnapshot


def test_the_channel_is_created_on_the_first_call(client: CoordinatorClient) -> None:
    with CoordinatorClient("127.0.0.1:1") as idle:  # nothing listens there: nothing is dialled either
        assert idle._channel._open is None
    assert client._channel._open is None
    client.get_current_snapshot("app")
    assert client._channel._open is not None and client._channel._open.pid == os.getpid()


def test_pickling_is_refused_with_a_clear_error(client: CoordinatorClient) -> None:
    with pytest.raises(TypeError, match="create a CoordinatorClient"):
        pickle.dumps(client)
    client.get_current_snapshot("app")  # with a live channel too
    with pytest.raises(TypeError, match="create a CoordinatorClient"):
        pickle.dumps({"captured": client})
    with pytest.raises(TypeError, match="LeaseKeeper cannot be pickled"):
        pickle.dumps(client.lease("lease", [], 10))


def _in_child(client: CoordinatorClient, app_id: str, results: Queue[tuple[str, object]]) -> None:
    try:
        snapshot = client.get_current_snapshot(app_id, consistent=True)
        opened = client._channel._open
        results.put(("ok", (snapshot.generation, opened is not None and opened.pid == os.getpid())))
    except BaseException as e:
        results.put(("error", repr(e)))


@pytest.mark.process
def test_a_forked_child_makes_its_own_channel(client: CoordinatorClient, uid: str) -> None:
    client.create_snapshot(uid, ["t"])  # the parent's channel is open and has been used
    ctx = multiprocessing.get_context("fork")
    results: Queue[tuple[str, object]] = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(client, uid, results))  # inherited, never pickled
    child.start()
    try:
        outcome = results.get(timeout=60)
    finally:
        child.join(60)
    assert outcome == ("ok", (1, True))
    assert child.exitcode == 0
    # The parent's channel is untouched by the child's.
    assert client.get_current_snapshot(uid, consistent=True).generation == 1


def test_against_a_coordinator_process_on_zookeeper_and_s3(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    with (
        CoordinatorProcess(tmp_path, args=["--metadata", zk_uri, "--blobs", s3_uri]) as coordinator,
        CoordinatorClient(coordinator.target, timeout_s=30) as client,
    ):
        registered = client.register_producer_offsets("sink", [Offset("out", 0, 3)])
        assert registered.registered and registered.snapshot.offsets == (Offset("out", 0, 3),)

        created = client.create_snapshot("app", ["t0"])
        checkpoint = os.urandom(256 * 1024)
        done = client.report_task_snapshot(
            "app", created.generation, TaskSnapshot("t0", (), {"s": checkpoint})
        )
        assert done.state is SnapshotState.COMPLETED
        with client.lease("restore", [done.ref], duration_s=30) as keeper:
            assert keeper.healthy and keeper.lease is not None
            assert keeper.lease.snapshots == (SnapshotRef("app", created.generation),)
            assert client.get_snapshot("app", 1, include_checkpoints=True).tasks[0].checkpoints == {
                "s": checkpoint
            }
        with pytest.raises(NotFound):
            client.get_lease("restore")

        client.mark_backlog("job", [Offset("in", 0, 5)])
        assert client.report_progress("job", [Offset("in", 0, 5)]).newly_finished == (Offset("in", 0, 5),)
