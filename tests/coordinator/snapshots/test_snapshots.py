"""Generation snapshots on both backends: the embedded defaults and real ZooKeeper + S3."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from harness.concurrency import run_threads
from harness.faults import call_while_blob_deletes_fail
from harness.process import wait_until
from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.leases import encode_pins
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import (
    decode_reported,
    decode_snapshot,
    encode_snapshot,
    encode_task_report,
)
from snapcoord.coordinator.domain.snapshots import TIMEOUT_REASON, Snapshot, SnapshotPolicy, State, TaskReport
from snapcoord.coordinator.errors import CommitOutcomeUnknown, FailedPrecondition, InvalidArgument, NotFound
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.cache import CurrentSnapshotCache
from snapcoord.coordinator.snapshots.layout import gen_path, task_path, tasks_path
from snapcoord.coordinator.snapshots.pins import pin_path
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import Create, Node, Op, SetData

HOUR_MS = 3_600_000
POLICY = SnapshotPolicy(
    default_timeout_ms=10 * 60_000,
    max_report_bytes=1024 * 1024,
    default_keep_last_completed=2,
    default_completed_ttl_ms=24 * HOUR_MS,
    # Every checkpoint in the blob store: these tests follow its objects; test_inline_checkpoints
    # covers checkpoints held in the report.
    inline_checkpoint_max_bytes=0,
)
OFFSETS = (Offset("orders", 0, 100), Offset("orders", 1, 7))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


@pytest.fixture
def snapshots(stores: Stores, clock: ManualClock) -> SnapshotRegistry:
    return SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, CoordinatorMetrics(new_registry()))


def objects(blobs: BlobStore, app_id: str) -> list[str]:
    return [b.key for b in blobs.list(f"snapshots/{app_id}/")]


def complete(snapshots: SnapshotRegistry, app_id: str, tasks: tuple[str, ...] = ("q1", "q2")) -> Snapshot:
    created = snapshots.create(app_id, tasks, 0, 0, {})
    last = created
    for task in tasks:
        last = snapshots.report(app_id, created.record.generation, task, OFFSETS, {"state": task.encode()})
    assert last.record.state is State.COMPLETED
    return last


def test_a_retried_report_is_a_stale_guess_not_a_conflict(stores: Stores, clock: ManualClock) -> None:
    """A report's first round does not read the task's node (nearly always absent) and lets the
    commit's create tell. A retried report finds it there: decided again on a read, and counted as
    a stale guess, not as contention."""
    registry = new_registry()
    snapshots = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, CoordinatorMetrics(registry))

    def sample(name: str) -> float:
        return registry.get_sample_value(name, {"operation": "snapshot_report"}) or 0.0

    snapshots.create("app", ["q1", "q2"], 0, 0, {})
    first = snapshots.report("app", 1, "q1", OFFSETS, {"state": b"s"})
    assert snapshots.report("app", 1, "q1", OFFSETS, {"state": b"s"}) == first
    assert sample("snapcoord_commit_stale_copies_total") == 1
    assert sample("snapcoord_commit_conflicts_total") == 0
    assert len(objects(stores.blobs, "app")) == 1  # the retry's upload was removed


def test_lifecycle(snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock) -> None:
    empty = snapshots.current("app", consistent=True)
    assert (empty.record.generation, empty.record.state) == (0, State.EMPTY)

    created = snapshots.create("app", ["q1", "q2"], 0, 0, {"trigger": "manual"})
    assert (created.record.generation, created.record.state) == (1, State.CREATED)
    assert created.record.task_ids == ("q1", "q2") and dict(created.record.labels) == {"trigger": "manual"}
    assert snapshots.create("app", ["other"], 0, 0, {}) == created  # a retry returns it unchanged

    partial = snapshots.report("app", 1, "q1", OFFSETS, {"store-a": b"\x00\x01", "store-b": b"bb"})
    assert partial.record.state is State.CREATED and [t.task_id for t in partial.tasks] == ["q1"]
    assert [t.task_id for t in snapshots.get("app", 1, include_checkpoints=False).snapshot.tasks] == ["q1"]
    assert snapshots.report(
        "app", 1, "q1", list(reversed(OFFSETS)), {"store-b": b"bb", "store-a": b"\x00\x01"}
    ) == (partial)  # the same report again (any order) is idempotent
    with pytest.raises(FailedPrecondition, match="task 'q1' already reported a different snapshot"):
        snapshots.report("app", 1, "q1", OFFSETS, {"store-a": b"changed"})
    with pytest.raises(InvalidArgument, match="task 'q3' is not in the task set"):
        snapshots.report("app", 1, "q3", OFFSETS, {})

    clock.advance(5)
    done = snapshots.report("app", 1, "q2", (Offset("clicks", 0, 3),), {})
    assert done.record.state is State.COMPLETED and done.record.completed_at_ms == clock.now_ms()
    assert (
        snapshots.report("app", 1, "q2", (Offset("clicks", 0, 3),), {}) == done
    )  # idempotent after completion

    got = snapshots.get("app", 1, include_checkpoints=True)
    assert got.snapshot.record == done.record
    assert [t.task_id for t in got.snapshot.tasks] == ["q1", "q2"]
    assert got.snapshot.tasks[0].committed_offsets == OFFSETS
    assert got.payloads == {("q1", "store-a"): b"\x00\x01", ("q1", "store-b"): b"bb"}
    assert snapshots.get("app", 1, include_checkpoints=False).payloads == {}
    assert len(objects(stores.blobs, "app")) == 2

    second = snapshots.create("app", ["q1"], 0, 0, {})
    assert second.record.generation == 2
    with pytest.raises(
        FailedPrecondition, match="generation 1 of app 'app' is fenced: the current generation is 2"
    ):
        snapshots.report("app", 1, "q1", (Offset("orders", 0, 200),), {})
    with pytest.raises(FailedPrecondition, match="generation 5 of app 'app' does not exist"):
        snapshots.report("app", 5, "q1", OFFSETS, {})
    aborted = snapshots.abort("app", 2, "operator said so")
    assert aborted.record.state is State.ABORTED and aborted.record.abort_reason == "operator said so"
    assert snapshots.abort("app", 2, "again") == aborted  # idempotent
    with pytest.raises(FailedPrecondition, match="is ABORTED, no longer accepting reports"):
        snapshots.report("app", 2, "q1", OFFSETS, {})
    with pytest.raises(FailedPrecondition, match="is COMPLETED; only a CREATED snapshot can be aborted"):
        snapshots.abort("app", 1, "")
    assert snapshots.create("app", ["q1"], 0, 0, {}).record.generation == 3  # after an abort: generation + 1

    page, token = snapshots.list_page("app", 2, "")
    assert [s.record.generation for s in page] == [3, 2] and token
    page, token = snapshots.list_page("app", 2, token)
    assert [s.record.generation for s in page] == [1] and token == ""


def test_delete_removes_payloads_and_refuses_a_created_snapshot(
    snapshots: SnapshotRegistry, stores: Stores
) -> None:
    complete(snapshots, "app")
    assert len(objects(stores.blobs, "app")) == 2
    snapshots.create("app", ["q1"], 0, 0, {})
    with pytest.raises(FailedPrecondition, match="still CREATED: abort it before deleting it"):
        snapshots.delete("app", 2)
    assert snapshots.delete("app", 1) is True
    assert objects(stores.blobs, "app") == []
    with pytest.raises(NotFound, match="app 'app' has no snapshot at generation 1"):
        snapshots.get("app", 1, include_checkpoints=False)
    assert snapshots.delete("app", 1) is False  # idempotent


def test_a_pinned_snapshot_is_never_deleted(
    snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock
) -> None:
    complete(snapshots, "app")
    complete(snapshots, "app")
    # What a lease does: a pin index naming it, with its expiry.
    stores.metadata.create(
        pin_path("app", 1), encode_pins({"restore-job": clock.now_ms() + 100 * HOUR_MS}), make_parents=True
    )
    with pytest.raises(FailedPrecondition, match="held by a lease"):
        snapshots.delete("app", 1)
    clock.advance(48 * HOUR_MS)  # past the TTL too
    assert snapshots.apply_retention(100) == 0
    assert snapshots.get("app", 1, include_checkpoints=False).snapshot.record.generation == 1
    stores.metadata.delete(pin_path("app", 1))
    assert snapshots.delete("app", 1) is True


def test_validation_leaves_state_untouched(snapshots: SnapshotRegistry, stores: Stores) -> None:
    bad: list[tuple[Callable[[], object], str]] = [
        (lambda: snapshots.create("app/x", ["q"], 0, 0, {}), "app_id 'app/x' contains '/'"),
        (lambda: snapshots.create("app", [], 0, 0, {}), "task_ids is empty"),
        (lambda: snapshots.create("app", ["q", "q"], 0, 0, {}), r"task_ids\[1\] repeats 'q'"),
        (lambda: snapshots.create("app", ["q"], -1, 0, {}), "ttl_ms is -1"),
        (lambda: snapshots.create("app", ["q"], 0, -5, {}), "timeout_ms is -5"),
        (lambda: snapshots.report("app", 0, "q", OFFSETS, {}), "generation is 0"),
        (
            lambda: snapshots.report("app", 1, "q", OFFSETS, {"big": b"x" * (1024 * 1024 + 1)}),
            "limit per report",
        ),
        (lambda: snapshots.report("app", 1, "q", [*OFFSETS, OFFSETS[0]], {}), "repeats stream 'orders'"),
        (lambda: snapshots.list_page("app", -1, ""), "page_size is -1"),
        (lambda: snapshots.set_retention("app", -1, 0), "keep_last_completed is -1"),
    ]
    for call, message in bad:
        with pytest.raises(InvalidArgument, match=message):
            call()
    assert stores.metadata.children("/snapshots/apps") == []
    assert list(stores.blobs.list("snapshots/")) == []


def test_fifty_concurrent_reports_complete_exactly_once(snapshots: SnapshotRegistry, stores: Stores) -> None:
    tasks = [f"task-{i:02d}" for i in range(50)]
    snapshots.create("app", tasks, 0, 0, {})
    results: list[Snapshot] = []
    lock = threading.Lock()

    def report(i: int) -> None:
        result = snapshots.report("app", 1, tasks[i], (Offset("in", i, i * 10),), {"s": bytes([i])})
        with lock:
            results.append(result)

    run_threads(50, report)
    completing = [r for r in results if r.record.state is State.COMPLETED]
    assert len(completing) == 1 and completing[0].record.reported == 50
    got = snapshots.get("app", 1, include_checkpoints=True)
    assert got.snapshot.record.state is State.COMPLETED
    assert [t.task_id for t in got.snapshot.tasks] == tasks
    assert all(got.payloads[(f"task-{i:02d}", "s")] == bytes([i]) for i in range(50))


def test_a_report_counts_in_the_counter_node_and_leaves_the_header_alone_until_the_last(
    snapshots: SnapshotRegistry, stores: Stores
) -> None:
    """A report that does not complete the snapshot writes its node and the few bytes of the
    counter, not the header with its whole task set (which it only checks, by version); the
    report that completes it writes the header COMPLETED."""
    snapshots.create("app", ["t0", "t1", "t2"], 0, 0, {})
    before = stores.metadata.get(gen_path("app", 1))
    snapshots.report("app", 1, "t0", OFFSETS, {})
    snapshots.report("app", 1, "t1", OFFSETS, {"s": b"state"})
    assert stores.metadata.get(gen_path("app", 1)) == before
    counter = stores.metadata.get(tasks_path("app", 1))
    assert counter is not None and decode_reported(counter.data) == 2
    assert snapshots.current("app", consistent=True).record.state is State.CREATED
    done = snapshots.report("app", 1, "t2", OFFSETS, {})
    assert done.record.state is State.COMPLETED
    after = stores.metadata.get(gen_path("app", 1))
    assert before is not None and after is not None and after.version == before.version + 1
    assert decode_snapshot(after.data).state is State.COMPLETED


def older_servers_report(stores: Stores, task_id: str) -> None:
    """A report as servers before the counter node committed it: the task's node, and the
    header rewritten with its own count raised (checked by version)."""
    stored = stores.metadata.get(gen_path("app", 1))
    assert stored is not None
    record = decode_snapshot(stored.data)
    stores.metadata.transaction(
        [
            Create(
                task_path("app", 1, task_id), encode_task_report(TaskReport(task_id, OFFSETS, (), task_id))
            ),
            SetData(
                gen_path("app", 1),
                encode_snapshot(replace(record, reported=record.reported + 1)),
                stored.version,
            ),
        ]
    )


def test_reports_counted_in_the_header_by_older_servers_count_toward_completion(
    snapshots: SnapshotRegistry, stores: Stores
) -> None:
    """During an upgrade, servers of both kinds report to one snapshot: each report raises one
    of the two counts, and the snapshot completes with its last report, not one before."""
    tasks = ["t0", "t1", "t2", "t3"]
    snapshots.create("app", tasks, 0, 0, {})
    older_servers_report(stores, "t0")
    assert snapshots.report("app", 1, "t1", OFFSETS, {}).record.state is State.CREATED
    older_servers_report(stores, "t2")
    assert snapshots.current("app", consistent=True).record.state is State.CREATED
    last = snapshots.report("app", 1, "t3", OFFSETS, {})
    assert last.record.state is State.COMPLETED
    got = snapshots.get("app", 1, include_checkpoints=False).snapshot
    assert got.record.state is State.COMPLETED and [t.task_id for t in got.tasks] == tasks


def test_concurrent_creates_yield_one_new_generation(snapshots: SnapshotRegistry) -> None:
    complete(snapshots, "app")
    created: list[int] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        generation = snapshots.create("app", [f"q{i}"], 0, 0, {}).record.generation
        with lock:
            created.append(generation)

    run_threads(10, create)
    assert created == [2] * 10


def test_generations_stay_monotonic_under_contention(snapshots: SnapshotRegistry) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def churn(i: int) -> None:
        for _ in range(5):
            current = snapshots.create("app", ["q"], 0, 0, {})
            with lock:
                seen.append(current.record.generation)
            snapshots.abort("app", current.record.generation, f"churn {i}")  # idempotent if raced

    run_threads(6, churn)
    final = snapshots.current("app", consistent=True).record.generation
    assert sorted(set(seen)) == list(range(1, final + 1))  # no generation skipped or repeated
    listed = [s.record.generation for s in snapshots.list_page("app", 1000, "")[0]]
    assert listed == list(range(final, 0, -1))


def test_timeout_abort_with_an_injected_clock(snapshots: SnapshotRegistry, clock: ManualClock) -> None:
    snapshots.create("slow", ["q1", "q2"], 0, 90_000, {})
    snapshots.create("fast", ["q1"], 0, 0, {})  # default timeout: 10 minutes
    snapshots.report("slow", 1, "q1", OFFSETS, {})
    clock.advance(89_999)
    assert snapshots.abort_timed_out(100) == 0
    clock.advance(1)
    assert snapshots.abort_timed_out(100) == 1
    slow = snapshots.current("slow", consistent=True)
    assert slow.record.state is State.ABORTED and slow.record.abort_reason == TIMEOUT_REASON
    assert snapshots.current("fast", consistent=True).record.state is State.CREATED
    with pytest.raises(FailedPrecondition, match="ABORTED"):
        snapshots.report("slow", 1, "q2", OFFSETS, {})
    assert snapshots.create("slow", ["q1"], 0, HOUR_MS, {}).record.generation == 2
    clock.advance(10 * 60_000)
    assert snapshots.abort_timed_out(100) == 1  # "fast"; "slow" generation 2 is not due yet
    snapshots.report("slow", 2, "q1", OFFSETS, {})  # completing removes it from the deadline index
    clock.advance(HOUR_MS)
    assert snapshots.abort_timed_out(100) == 0
    assert snapshots.current("slow", consistent=True).record.state is State.COMPLETED


def test_retention_keeps_the_newest_completed_and_honours_ttl(
    snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock
) -> None:
    for _ in range(4):
        complete(snapshots, "app")
        clock.advance(1_000)
    snapshots.create("app", ["q1"], 0, 0, {})
    snapshots.abort("app", 5, "")
    assert snapshots.apply_retention(100) == 2  # keep-last 2 (the server default here): 1 and 2 go
    remaining = [s.record.generation for s in snapshots.list_page("app", 100, "")[0]]
    assert remaining == [5, 4, 3]
    assert objects(stores.blobs, "app") == sorted(objects(stores.blobs, "app"))  # listable
    assert {k.split("/")[2] for k in objects(stores.blobs, "app")} == {"3", "4"}  # payloads of 1, 2 gone
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()  # and their intents after them

    policy = snapshots.set_retention("app", 5, HOUR_MS)
    assert (policy.keep_last_completed, policy.completed_ttl_ms) == (5, HOUR_MS)
    assert snapshots.apply_retention(100) == 0  # nothing is an hour old yet
    clock.advance(HOUR_MS)
    assert snapshots.apply_retention(100) == 2  # aborted 5 and completed 3 expired; 4 is the newest completed
    assert [s.record.generation for s in snapshots.list_page("app", 100, "")[0]] == [4]
    clock.advance(100 * HOUR_MS)
    assert snapshots.apply_retention(100) == 0  # never the newest completed one


def test_a_snapshot_ttl_of_its_own_wins(snapshots: SnapshotRegistry, clock: ManualClock) -> None:
    created = snapshots.create("app", ["q1"], 5_000, 0, {})
    snapshots.report("app", created.record.generation, "q1", OFFSETS, {})
    complete(snapshots, "app", ("q1",))
    expiring = snapshots.get("app", 1, include_checkpoints=False).snapshot.record
    assert expiring.expires_at_ms() == expiring.ended_at_ms + 5_000
    snapshots.apply_retention(100)
    clock.advance(5_000)
    assert snapshots.apply_retention(100) == 1
    assert [s.record.generation for s in snapshots.list_page("app", 100, "")[0]] == [2]


def test_orphan_checkpoints_are_swept_after_the_grace(
    snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock
) -> None:
    complete(snapshots, "app")
    stores.blobs.put("snapshots/app/1/q1/0123456789abcdef0123456789abcdef", b"left by a crash")
    assert snapshots.sweep_orphans(HOUR_MS, 100) == 0
    clock.advance(2 * HOUR_MS)
    assert snapshots.sweep_orphans(HOUR_MS, 100) == 1
    assert len(objects(stores.blobs, "app")) == 2  # the referenced payloads stay
    assert snapshots.get("app", 1, include_checkpoints=True).payloads[("q1", "state")] == b"q1"


@pytest.mark.parametrize("failure", ["unavailable", "crash"])
def test_checkpoints_left_behind_by_a_deletion_are_swept_by_their_intent(
    snapshots: SnapshotRegistry,
    stores: Stores,
    clock: ManualClock,
    failure: str,
) -> None:
    """A deletion deletes each batch's objects after the batch's commit. When those deletes fail
    or never run (a crash), the intent the commit made leads the sweep to them (the listing sweep
    is off by default); the checkpoints of the snapshot kept stay."""

    victim = complete(snapshots, "app")
    kept = complete(snapshots, "app")
    doomed = [k for k in objects(stores.blobs, "app") if k.startswith("snapshots/app/1/")]
    assert len(doomed) == 2
    deleted = call_while_blob_deletes_fail(
        stores.blobs, failure, lambda: snapshots.delete("app", victim.record.generation)
    )
    if failure == "crash":
        deleted = snapshots.delete("app", victim.record.generation)  # the next call finishes it
    assert deleted
    with pytest.raises(NotFound):
        snapshots.get("app", victim.record.generation, include_checkpoints=False)
    assert set(doomed) <= set(objects(stores.blobs, "app"))

    assert snapshots.sweep_intents(HOUR_MS, 100) == 0  # too young: may be in flight
    clock.advance(2 * HOUR_MS)
    assert snapshots.sweep_intents(HOUR_MS, 100) == 1
    assert [k for k in objects(stores.blobs, "app") if k.startswith("snapshots/app/1/")] == []
    got = snapshots.get("app", kept.record.generation, include_checkpoints=True)
    assert got.payloads == {("q1", "state"): b"q1", ("q2", "state"): b"q2"}
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()


def test_a_deletion_deletes_the_intent_it_made_once_the_objects_are_gone(
    snapshots: SnapshotRegistry, stores: Stores
) -> None:
    victim = complete(snapshots, "app")
    complete(snapshots, "app")
    assert snapshots.delete("app", victim.record.generation)
    assert len(objects(stores.blobs, "app")) == 2
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()


def test_a_failed_report_removes_its_uploads(
    snapshots: SnapshotRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapcoord.coordinator.errors import StoreUnavailable

    snapshots.create("app", ["q1"], 0, 0, {})

    def down(ops: object) -> None:
        raise StoreUnavailable("metadata store down (test)")

    monkeypatch.setattr(stores.metadata, "transaction", down)
    with pytest.raises(StoreUnavailable):
        snapshots.report("app", 1, "q1", OFFSETS, {"state": b"payload"})
    monkeypatch.undo()
    assert objects(stores.blobs, "app") == []
    assert snapshots.get("app", 1, include_checkpoints=False).snapshot.tasks == ()


def test_a_report_whose_commit_reply_was_lost_keeps_its_payloads(
    snapshots: SnapshotRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit in doubt is re-read, never assumed lost: here it landed, so its payload must stay."""
    snapshots.create("app", ["q1", "q2"], 0, 0, {})
    real = stores.metadata.transaction

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real(ops)
        raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    reported = snapshots.report("app", 1, "q1", OFFSETS, {"state": b"q1"})
    monkeypatch.undo()
    assert [t.task_id for t in reported.tasks] == ["q1"]
    assert len(objects(stores.blobs, "app")) == 1
    assert snapshots.get("app", 1, include_checkpoints=True).payloads == {("q1", "state"): b"q1"}


def test_a_report_with_inline_and_uploaded_checkpoints_whose_reply_was_lost_keeps_both(
    snapshots: SnapshotRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The landed report references the inline payload and the upload: the re-read that settles
    the commit in doubt must keep both (it once kept only when the stored refs equalled the
    inline ones, and deleted the inline payload of a COMPLETED snapshot)."""
    snapshots.create("app", ["q1"], 0, 0, {})
    upload = snapshots.upload("app", 1, "q1", "big", iter([b"B" * 1000]))
    real = stores.metadata.transaction

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real(ops)
        if any(op.path.endswith("/tasks/q1") for op in ops):
            raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    reported = snapshots.report("app", 1, "q1", OFFSETS, {"small": b"inline"}, {"big": upload.upload_id})
    monkeypatch.undo()
    assert reported.record.state is State.COMPLETED
    stored = snapshots.get("app", 1, include_checkpoints=True)
    assert stored.payloads == {("q1", "small"): b"inline", ("q1", "big"): b"B" * 1000}
    assert len(objects(stores.blobs, "app")) == 2
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()


def test_a_deletion_batch_whose_commit_reply_was_lost_deletes_its_objects_at_once(
    snapshots: SnapshotRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch in doubt that landed is recognised (its tasks are gone): its objects go now and its
    intent after them, not after the sweep's grace; the snapshot kept keeps its checkpoints."""
    victim = complete(snapshots, "app")
    kept = complete(snapshots, "app")
    real = stores.metadata.transaction

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real(ops)
        if any(op.path.endswith("/tasks/q1") for op in ops):  # the batch step, once
            raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    assert snapshots.delete("app", victim.record.generation)
    monkeypatch.undo()
    assert [k for k in objects(stores.blobs, "app") if k.startswith("snapshots/app/1/")] == []
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()
    got = snapshots.get("app", kept.record.generation, include_checkpoints=True)
    assert got.payloads == {("q1", "state"): b"q1", ("q2", "state"): b"q2"}


def test_retention_keeps_what_a_racing_delete_makes_the_newest_completed_snapshot(
    snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Data loss guard: keeping the last 1, retention picks generation 1 because 2 is newer; an
    operator deletes 2 between retention's read and its mark. The mark checks that 2 is still
    there, so 1 (now the newest completed snapshot) stays, with its payloads."""
    snapshots.set_retention("app", 1, 0)
    complete(snapshots, "app")
    complete(snapshots, "app")
    operator = SnapshotRegistry(
        stores.metadata, stores.blobs, clock, POLICY, CoordinatorMetrics(new_registry())
    )
    real = stores.metadata.transaction
    raced: list[bool] = []

    def operator_first(ops: Sequence[Op]) -> None:
        if not raced and any(op.path == gen_path("app", 1) for op in ops):
            raced.append(True)  # retention's mark of 1, decided on reads that showed 2 COMPLETED
            assert operator.delete("app", 2) is True
        real(ops)

    monkeypatch.setattr(stores.metadata, "transaction", operator_first)
    assert snapshots.apply_retention(100) == 0
    monkeypatch.undo()
    assert raced
    kept = snapshots.get("app", 1, include_checkpoints=True)
    assert kept.snapshot.record.state is State.COMPLETED
    assert kept.payloads == {("q1", "state"): b"q1", ("q2", "state"): b"q2"}
    with pytest.raises(NotFound):
        snapshots.get("app", 2, include_checkpoints=False)
    assert snapshots.apply_retention(100) == 0  # and later passes keep it: the newest completed


def test_a_header_admitted_at_the_budget_stays_within_it_whatever_its_abort_reason(
    snapshots: SnapshotRegistry, stores: Stores
) -> None:
    """The header budget keeps room for the widest abort reason: 1024 characters outside the BMP,
    each stored as an escaped surrogate pair (12 bytes; the room kept was 1 byte per character)."""
    budget = POLICY.header_budget_bytes

    def tasks(n: int) -> tuple[str, ...]:
        return tuple(f"{i:06d}" + "t" * 194 for i in range(n))

    lo, hi = 1, 10_000  # the most tasks a CreateSnapshot admits (its own estimate, found by bisection)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if SnapshotRegistry._largest_header_bytes("app", tasks(mid), ()) <= budget:
            lo = mid
        else:
            hi = mid - 1
    with pytest.raises(InvalidArgument, match="use fewer or shorter task ids"):
        snapshots.create("app", tasks(lo + 1), 0, 0, {})
    snapshots.create("app", tasks(lo), 0, 0, {})
    snapshots.abort("app", 1, "\U0001f600" * 1024)
    header = stores.metadata.get(gen_path("app", 1))
    assert header is not None and decode_snapshot(header.data).abort_reason == "\U0001f600" * 1024
    assert len(header.data) <= budget


def test_the_cache_follows_changes_made_elsewhere(stores: Stores, clock: ManualClock) -> None:
    metrics = CoordinatorMetrics(new_registry())
    reader = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics)
    writer = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics)
    assert reader.current("app", consistent=False).record.state is State.EMPTY
    writer.create("app", ["q1"], 0, 0, {})
    wait_until(
        lambda: reader.current("app", consistent=False).record.generation == 1, timeout=30, what="create"
    )
    writer.report("app", 1, "q1", OFFSETS, {})
    wait_until(
        lambda: reader.current("app", consistent=False).record.state is State.COMPLETED,
        timeout=30,
        what="report",
    )
    assert reader.current("app", consistent=True) == reader.current("app", consistent=False)


def test_reports_refresh_the_cache_instead_of_emptying_it(stores: Stores, clock: ManualClock) -> None:
    """While an app is being snapshotted, each report changes its header: the cache reloads the
    entry in the background, so cached reads keep being answered from memory (no load of their
    own) and end at the state the reports left."""
    metrics = CoordinatorMetrics(new_registry())
    writer = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics)
    loads: list[str] = []
    seen: dict[str, int] = {}

    def present(app_id: str, current: int, header: Node | None) -> Snapshot:
        loads.append(threading.current_thread().name)
        seen[app_id] = current
        return writer._present(app_id, current, header)

    cache = CurrentSnapshotCache(stores.metadata, present, lambda app: seen.get(app, 0), max_apps=10)
    tasks = tuple(f"q{i}" for i in range(5))
    writer.create("app", tasks, 0, 0, {})
    assert cache.get("app").record.generation == 1
    for task in tasks:
        writer.report("app", 1, task, OFFSETS, {})
    wait_until(lambda: cache.get("app").record.state is State.COMPLETED, timeout=30, what="refresh")
    by_readers = [name for name in loads if name != "snapshot-cache-refresh"]
    assert len(by_readers) == 1, loads  # the first get only
    assert cache.get("app") == writer.current("app", consistent=True)
    writer.create("app", ("q9",), 0, 0, {})  # a new generation: its header is watched in turn
    wait_until(lambda: cache.get("app").record.generation == 2, timeout=30, what="new generation")
    writer.report("app", 2, "q9", OFFSETS, {})
    wait_until(lambda: cache.get("app").record.state is State.COMPLETED, timeout=30, what="gen 2 report")
    assert [name for name in loads if name != "snapshot-cache-refresh"] == by_readers


def store_calls(stores: Stores, monkeypatch: pytest.MonkeyPatch, names: Sequence[str]) -> list[str]:
    """The list the metadata store's ``names`` calls are appended to from now on: outer calls only
    (the embedded store's composite reads call its simple ones), not the cache's refresher's."""
    calls: list[str] = []
    depth = threading.local()
    for name in names:
        inner = getattr(stores.metadata, name)

        def counted(*args: object, _inner: Any = inner, _name: str = name, **kwargs: object) -> object:
            outer = getattr(depth, "n", 0) == 0
            if outer and threading.current_thread().name != "snapshot-cache-refresh":
                calls.append(_name)
            depth.n = getattr(depth, "n", 0) + 1
            try:
                return _inner(*args, **kwargs)
            finally:
                depth.n -= 1

        monkeypatch.setattr(stores.metadata, name, counted)
    return calls


@pytest.mark.parametrize("known", [False, True], ids=["app never seen", "generation known"])
def test_a_cold_cached_read_is_one_round_of_overlapped_requests(
    stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, known: bool
) -> None:
    """A cold cache read arms its watches and reads in one call to the store (one ZooKeeper round
    trip), a second only when the pointer names a header it did not guess; and the entry then
    follows the report that completes the snapshot, made elsewhere."""
    metrics = CoordinatorMetrics(new_registry())
    writer = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics)
    reader = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics)
    writer.create("app", ["q1", "q2"], 0, 0, {})
    if known:
        assert reader.current("app", consistent=True).record.generation == 1  # remembers it
    reads = ("get", "get_many", "synced_get_many", "children", "watch", "watch_and_get_many")
    calls = store_calls(stores, monkeypatch, reads)
    assert reader.current("app", consistent=False).record.generation == 1
    assert calls == ["watch_and_get_many"] * (1 if known else 2)
    writer.report("app", 1, "q1", OFFSETS, {})
    writer.report("app", 1, "q2", OFFSETS, {})
    calls.clear()
    wait_until(
        lambda: reader.current("app", consistent=False).record.state is State.COMPLETED,
        timeout=30,
        what="refresh",
    )
    assert calls == [], "cached reads after the first read nothing"


def test_a_consistent_read_guesses_the_generation_this_process_created(
    stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first consistent read after a create here reads the pointer and the header together
    (one store call); a guess outrun by a create through another replica costs one more read and
    still answers the generation the pointer names."""
    metrics = CoordinatorMetrics(new_registry())
    here = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics)
    elsewhere = SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics)
    calls = store_calls(stores, monkeypatch, ("get", "get_many", "synced_get_many"))
    here.create("app", ["q1"], 0, 0, {})
    calls.clear()
    first = here.current("app", consistent=True)
    assert (first.record.generation, first.record.state, calls) == (1, State.CREATED, ["synced_get_many"])
    elsewhere.abort("app", 1, "")
    elsewhere.create("app", ["q2"], 0, 0, {})
    calls.clear()
    moved = here.current("app", consistent=True)  # guessed 1, the pointer names 2
    assert (moved.record.generation, moved.record.task_ids) == (2, ("q2",))
    assert calls == ["synced_get_many", "get_many"]
    calls.clear()
    assert here.current("app", consistent=True) == moved
    assert calls == ["synced_get_many"]
