"""ReportTaskSnapshot from this process's copies of the header and the report counter: a report to a
snapshot this process created (or last reported to) sends only its commit (and, for a payload bound
for S3, the intent before the put); a stale copy never loses a report, never counts one twice,
never completes a snapshot twice, never stores a report to an ended snapshot, and never deletes a
payload the stored report references.

Two registries on one store stand for two coordinator processes (each has its own copies), so what
one writes makes the other's copies stale.
"""

from __future__ import annotations

import os
import threading

import pytest

from harness.concurrency import run_threads
from harness.snapshot_processes import POLICY, make_registry
from harness.stores import Stores
from harness.zk_requests import Counted, count_requests
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import decode_reported
from snapcoord.coordinator.domain.snapshots import State
from snapcoord.coordinator.errors import FailedPrecondition
from snapcoord.coordinator.snapshots.layout import tasks_path
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry

OFFSETS = (Offset("orders", 0, 100),)
#: Over the inline limit: the payload goes to the blob store, announced by an intent first.
LARGE = POLICY.inline_checkpoint_max_bytes + 1


def counter(stores: Stores, app_id: str, generation: int) -> int:
    node = stores.metadata.get(tasks_path(app_id, generation))
    assert node is not None
    return decode_reported(node.data)


def payloads(registry: SnapshotRegistry, app_id: str, generation: int) -> dict[str, bytes]:
    got = registry.get(app_id, generation, include_checkpoints=True)
    return {task: data for (task, _), data in got.payloads.items()}


def test_reports_on_copies_then_through_another_process_lose_nothing(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """Here reports from its copies; elsewhere reports in between (here's counter copy goes stale);
    here's next report, a payload bound for the blob store, lands after a re-read with its payload
    kept; the last report completes the snapshot once."""
    here.create("app", ["a", "b", "c", "d"], 0, 0, {})
    body = {t: os.urandom(LARGE) for t in "abcd"}
    here.report("app", 1, "a", OFFSETS, {"state": body["a"]})
    elsewhere.report("app", 1, "b", OFFSETS, {"state": body["b"]})
    here.report("app", 1, "c", OFFSETS, {"state": body["c"]})  # from a stale counter copy
    assert counter(stores, "app", 1) == 3
    last = here.report("app", 1, "d", OFFSETS, {"state": body["d"]})
    assert last.record.state is State.COMPLETED and last.record.reported == 4
    assert payloads(elsewhere, "app", 1) == body
    # A repeat of a report after completion is answered from the stored one.
    again = here.report("app", 1, "d", OFFSETS, {"state": body["d"]})
    assert again.record.state is State.COMPLETED
    assert payloads(here, "app", 1) == body


def test_a_copy_of_an_aborted_snapshot_stores_nothing(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """Elsewhere aborts; here's copy still says CREATED. Its report is refused (fenced) and leaves
    neither a task node nor a payload object behind."""
    here.create("app", ["a", "b"], 0, 0, {})
    here.report("app", 1, "a", OFFSETS, {})
    before = sorted(b.key for b in stores.blobs.list())
    elsewhere.abort("app", 1, "test")
    with pytest.raises(FailedPrecondition):
        here.report("app", 1, "b", OFFSETS, {"state": os.urandom(LARGE)})
    assert counter(stores, "app", 1) == 1
    assert [t.task_id for t in elsewhere.get("app", 1, include_checkpoints=False).snapshot.tasks] == ["a"]
    assert sorted(b.key for b in stores.blobs.list()) == before


def test_concurrent_reports_through_two_processes_count_every_one_once(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """16 reports of one snapshot race, 8 through each process (both hold copies): every report is
    stored and counted once, and one of them completes the snapshot."""
    tasks = [f"t{i}" for i in range(16)]
    here.create("app", tasks, 0, 0, {})
    elsewhere.report("app", 1, "t0", OFFSETS, {})  # elsewhere holds copies too
    here.report("app", 1, "t1", OFFSETS, {})
    completed: list[str] = []
    lock = threading.Lock()

    def report(i: int) -> None:
        task = tasks[i + 2]
        snapshot = (here if i % 2 else elsewhere).report("app", 1, task, OFFSETS, {"s": task.encode()})
        if snapshot.record.state is State.COMPLETED:
            with lock:
                completed.append(task)

    run_threads(14, report)
    assert len(completed) == 1
    got = here.get("app", 1, include_checkpoints=True)
    assert got.snapshot.record.state is State.COMPLETED and got.snapshot.record.reported == 16
    assert sorted(t.task_id for t in got.snapshot.tasks) == sorted(tasks)
    assert counter(stores, "app", 1) == 16


# --- ZooKeeper requests per call -----------------------------------------------------------------


@pytest.fixture
def counted(zk_stores: Stores, monkeypatch: pytest.MonkeyPatch) -> Counted:
    return count_requests(zk_stores.metadata, monkeypatch)


def test_reports_on_copies_send_the_commit_and_the_intent_only(zk_stores: Stores, counted: Counted) -> None:
    """The raw path of a report with an S3 payload is a read and a transaction; from copies ours is
    the intent (before the put) and the transaction, and an inline report its transaction."""
    registry = make_registry(zk_stores)
    registry.create("app", ["a", "b", "c", "d"], 0, 0, {})
    registry.report("app", 1, "a", OFFSETS, {"state": os.urandom(LARGE)})  # the intent bucket made
    counted.reset()
    registry.report("app", 1, "b", OFFSETS, {"state": os.urandom(LARGE)})
    assert counted.log == ["Create2", "Transaction"]
    counted.reset()
    registry.report("app", 1, "c", OFFSETS, {"state": b"small"})
    assert counted.log == ["Transaction"]


def test_a_snapshot_reported_through_two_processes_is_read_first(zk_stores: Stores, counted: Counted) -> None:
    """Once a copy went stale (another process reported), the next reports read first: one lost
    transaction, then the reads they made before copies."""
    here, elsewhere = make_registry(zk_stores), make_registry(zk_stores)
    here.create("app", ["a", "b", "c", "d", "e"], 0, 0, {})
    here.report("app", 1, "a", OFFSETS, {})
    elsewhere.report("app", 1, "b", OFFSETS, {})
    counted.reset()
    here.report("app", 1, "c", OFFSETS, {})
    assert counted.log == ["Transaction", "MultiRead", "Transaction"]  # the stale copy's commit lost
    counted.reset()
    here.report("app", 1, "d", OFFSETS, {})
    assert counted.log == ["MultiRead", "Transaction"]
