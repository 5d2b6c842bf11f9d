"""The upload-intent index and its orphan sweep never delete what a committed record references
(data loss is the worst bug), on the embedded store and on ZooKeeper + S3.

The sweep here runs with a time far in the future (every intent is past its grace), which makes it
as aggressive as it can ever be: it claims every intent it finds, including those of calls still in
flight. Whatever it does, every committed report must read back whole.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from harness.concurrency import run_threads
from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.errors import Aborted, CommitOutcomeUnknown, NotFound
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.metadata import Delete, MetadataStore, Op

HOUR_MS = 3_600_000
FAR_FUTURE_MS = 10 * 365 * 24 * HOUR_MS


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


def registry(metadata: MetadataStore, stores: Stores, clock: ManualClock) -> SnapshotRegistry:
    return SnapshotRegistry(
        metadata,
        stores.blobs,
        clock,
        SnapshotPolicy(inline_checkpoint_max_bytes=0),  # payloads in the blob store
        CoordinatorMetrics(new_registry()),
    )


def sweep_all(stores: Stores, clock: ManualClock) -> int:
    """The most aggressive sweep: every intent is past the grace, no upload is spared."""
    return IntentIndex(stores.metadata).sweep(stores.blobs, clock.now_ms() + FAR_FUTURE_MS, HOUR_MS, 10_000)


def referenced(snapshots: SnapshotRegistry, app_id: str, generation: int) -> dict[str, bytes]:
    """Every committed payload of the snapshot, read from the blob store (fails on a dangling one)."""
    found = snapshots.get(app_id, generation, include_checkpoints=True)
    return {f"{task}/{store}": payload for (task, store), payload in found.payloads.items()}


def intent_paths(stores: Stores) -> list[str]:
    return [
        f"{intents.ROOT}/{b}/{n}"
        for b in stores.metadata.children(intents.ROOT)
        for n in stores.metadata.children(f"{intents.ROOT}/{b}")
    ]


class Interposed:
    """The metadata store with a hook run around ``transaction`` (everything else passes through)."""

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self.on_transaction: list[Sequence[Op]] = []
        self.hook_before: object = None
        self.hook_after: object = None

    def transaction(self, ops: Sequence[Op]) -> None:
        self.on_transaction.append(list(ops))
        if callable(self.hook_before):
            self.hook_before()
        self._inner.transaction(ops)
        if callable(self.hook_after):
            hook, self.hook_after = self.hook_after, None
            hook()
            raise CommitOutcomeUnknown("the reply was lost after the commit landed (test)")

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_reports_and_uploads_racing_the_sweep_never_lose_a_committed_payload(
    stores: Stores, clock: ManualClock
) -> None:
    snapshots = registry(stores.metadata, stores, clock)
    tasks = [f"t{i}" for i in range(40)]
    generation = snapshots.create("race", tasks, 0, 0, {}).record.generation
    committed: dict[str, bytes] = {}
    refused: list[str] = []
    swept = [0]
    stop = threading.Event()

    def reporter(worker: int) -> None:
        for task in tasks[worker::4]:
            inline = {"inline": f"{task}-inline".encode()}
            try:
                up = snapshots.upload("race", generation, task, "big", [f"{task}-up".encode()] * 3)
                snapshots.report("race", generation, task, (), inline, {"big": up.upload_id})
            except (Aborted, NotFound) as e:  # the sweep claimed this call's intent first
                refused.append(f"{task}: {e}")
                continue
            committed[f"{task}/inline"] = inline["inline"]
            committed[f"{task}/big"] = f"{task}-up".encode() * 3

    def sweeper() -> None:
        while not stop.is_set():
            swept[0] += sweep_all(stores, clock)

    sweeping = threading.Thread(target=sweeper)
    sweeping.start()
    try:
        run_threads(4, reporter)
    finally:
        stop.set()
        sweeping.join()

    assert swept[0] > 0, "the sweep never overlapped a call: no race was tested"
    assert committed, refused  # some calls got through
    # Every committed report reads back whole (a dangling reference would raise Internal here).
    assert referenced(snapshots, "race", generation) == committed
    # A last sweep leaves exactly the referenced objects: no orphan, nothing committed lost.
    sweep_all(stores, clock)
    assert intent_paths(stores) == []
    stored = {info.key for info in stores.blobs.list("snapshots/race/")}
    reports = snapshots.get("race", generation, include_checkpoints=False).snapshot.tasks
    assert stored == {ref.object_key for report in reports for ref in report.checkpoints}


def test_the_intent_is_retired_in_the_commit_itself(stores: Stores, clock: ManualClock) -> None:
    """The reply of a landed commit is lost, and the sweep runs before the kernel re-reads: the
    intent went with the commit, so the sweep finds nothing to claim and the payload stays."""
    metadata = Interposed(stores.metadata)
    snapshots = registry(metadata, stores, clock)  # type: ignore[arg-type]
    generation = snapshots.create("lost-reply", ["t"], 0, 0, {}).record.generation
    seen: list[int] = []
    metadata.hook_after = lambda: seen.append(sweep_all(stores, clock))

    done = snapshots.report("lost-reply", generation, "t", (), {"s": b"payload"})

    assert seen == [0]  # right after the commit landed, no intent was left to sweep
    assert done.record.state.name == "COMPLETED"
    report_commit = metadata.on_transaction[-1]
    assert [op.path for op in report_commit if isinstance(op, Delete) and op.path.startswith(intents.ROOT)]
    assert referenced(snapshots, "lost-reply", generation) == {"t/s": b"payload"}
    assert intent_paths(stores) == []


def test_a_commit_paused_past_the_grace_loses_to_the_sweep_and_references_nothing(
    stores: Stores, clock: ManualClock
) -> None:
    """A replica stalls between its upload and its commit (a SIGSTOP, a GC pause) long enough for
    the sweep to claim its intent and delete the payload: the commit must then fail, never land a
    report pointing at the deleted object."""
    metadata = Interposed(stores.metadata)
    snapshots = registry(metadata, stores, clock)  # type: ignore[arg-type]
    generation = snapshots.create("stalled", ["t", "u"], 0, 0, {}).record.generation
    paused, resume = threading.Event(), threading.Event()

    def stall() -> None:
        if not paused.is_set():
            paused.set()
            assert resume.wait(120)

    metadata.hook_before = stall
    outcome: list[BaseException | None] = []

    def report() -> None:
        try:
            snapshots.report("stalled", generation, "t", (), {"s": b"stalled payload"})
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    caller = threading.Thread(target=report)
    caller.start()
    assert paused.wait(120)
    assert sweep_all(stores, clock) == 1  # claims the stalled call's intent, deletes its payload
    assert list(stores.blobs.list("snapshots/stalled/")) == []
    metadata.hook_before = None
    resume.set()
    caller.join(120)

    assert len(outcome) == 1 and isinstance(outcome[0], Aborted), outcome
    assert "collected by the orphan sweep" in str(outcome[0])
    assert snapshots.get("stalled", generation, include_checkpoints=False).snapshot.tasks == ()
    assert intent_paths(stores) == []
    # The task can report again (a new upload, a new intent).
    snapshots.report("stalled", generation, "t", (), {"s": b"second try"})
    assert referenced(snapshots, "stalled", generation) == {"t/s": b"second try"}


def test_an_upload_claimed_before_its_report_is_refused_and_never_referenced(
    stores: Stores, clock: ManualClock
) -> None:
    snapshots = registry(stores.metadata, stores, clock)
    generation = snapshots.create("claimed", ["t"], 0, 0, {}).record.generation
    up = snapshots.upload("claimed", generation, "t", "s", [b"abc"])
    assert sweep_all(stores, clock) == 1
    with pytest.raises(NotFound, match="collected by the janitor"):
        snapshots.report("claimed", generation, "t", (), {}, {"s": up.upload_id})
    assert snapshots.get("claimed", generation, include_checkpoints=False).snapshot.tasks == ()
    assert list(stores.blobs.list("snapshots/claimed/")) == []


def test_the_janitor_keeps_uploads_while_their_snapshot_may_be_reported(
    stores: Stores, clock: ManualClock
) -> None:
    """Past the grace, an unreported upload stays while its snapshot is CREATED (a report may still
    come) and goes once the snapshot ended; a call's own stale intent goes at once."""
    snapshots = registry(stores.metadata, stores, clock)
    generation = snapshots.create("waiting", ["t"], 0, 0, {}).record.generation
    up = snapshots.upload("waiting", generation, "t", "s", [b"kept"])
    # A crash between a call's put and its commit: an intent without upload info, and its object.
    crashed_key = f"snapshots/waiting/{generation}/t/{'f' * 32}"
    IntentIndex(stores.metadata).announce([crashed_key], clock.now_ms())
    stores.blobs.put(crashed_key, b"orphan")

    assert snapshots.sweep_intents(HOUR_MS, 100) == 0  # both younger than the grace
    clock.advance(2 * HOUR_MS)
    assert snapshots.sweep_intents(HOUR_MS, 100) == 1  # the crashed call's, not the upload
    remaining = [i.key for i in stores.blobs.list("snapshots/waiting/")]
    assert len(remaining) == 1 and crashed_key not in remaining
    assert stores.blobs.get(remaining[0]) == b"kept"
    assert len(intent_paths(stores)) == 1

    snapshots.abort("waiting", generation, "")
    assert snapshots.sweep_intents(HOUR_MS, 100) == 1
    assert list(stores.blobs.list("snapshots/waiting/")) == [] and intent_paths(stores) == []
    # Its id names nothing any more: a report on a new generation finds no such upload.
    generation2 = snapshots.create("waiting", ["t"], 0, 0, {}).record.generation
    with pytest.raises(NotFound):
        snapshots.report("waiting", generation2, "t", (), {}, {"s": up.upload_id})


def test_the_sweep_costs_the_intents_not_the_payloads(stores: Stores, clock: ManualClock) -> None:
    """Many committed payloads, no orphans: the sweep reads no object listing and finds nothing."""
    snapshots = registry(stores.metadata, stores, clock)
    tasks = [f"t{i}" for i in range(30)]
    generation = snapshots.create("many", tasks, 0, 0, {}).record.generation
    for task in tasks:
        snapshots.report("many", generation, task, (), {"a": b"1", "b": b"2"})

    class NoListing:
        def __getattr__(self, name: str) -> object:
            if name == "list":
                raise AssertionError("the intent sweep listed the payload objects")
            return getattr(stores.blobs, name)

    clock.advance(2 * HOUR_MS)
    assert IntentIndex(stores.metadata).sweep(NoListing(), clock.now_ms(), HOUR_MS, 100) == 0  # type: ignore[arg-type]
    assert len(referenced(snapshots, "many", generation)) == 60
