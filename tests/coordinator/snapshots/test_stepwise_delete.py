"""DeleteSnapshot in steps, on both backends: mark DELETING, task nodes in bounded
batches, the header last. What it deletes, what it must keep, how a half-done deletion reads and
is finished, and the retention trigger that survives a failing delete."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.leases import LeasePolicy, SnapshotRef
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import decode_snapshot
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy, State
from snapcoord.coordinator.errors import FailedPrecondition, NotFound, Reason, StoreUnavailable
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots import decide
from snapcoord.coordinator.snapshots.layout import RETENTION, gen_path, tasks_path
from snapcoord.coordinator.snapshots.leases.registry import LeaseRegistry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.metadata import MetadataStore, Op

HOUR_MS = 3_600_000
# Checkpoints in the blob store: the batches follow their objects (test_inline_checkpoints covers
# snapshots whose checkpoints are held in the reports).
POLICY = SnapshotPolicy(
    default_keep_last_completed=1, default_completed_ttl_ms=HOUR_MS, inline_checkpoint_max_bytes=0
)
#: Small deletion steps, so that 40 tasks take several batches (each at most 2 KiB of paths).
BATCH_BYTES = 2048
TASKS = tuple(f"task-{i:03d}" for i in range(40))


class FailingCommits:
    """The metadata store, whose transactions fail (UNAVAILABLE) while ``failing`` is set."""

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self.failing = False
        self.transactions = 0

    def transaction(self, ops: Sequence[Op]) -> None:
        self.transactions += 1
        if self.failing:
            raise StoreUnavailable("injected: the metadata store is unreachable")
        self._inner.transaction(ops)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


def registry(metadata: MetadataStore, stores: Stores, clock: ManualClock) -> SnapshotRegistry:
    return SnapshotRegistry(
        metadata,
        stores.blobs,
        clock,
        POLICY,
        CoordinatorMetrics(new_registry()),
        delete_batch_bytes=BATCH_BYTES,
    )


def complete(snapshots: SnapshotRegistry, app_id: str, tasks: tuple[str, ...] = TASKS) -> int:
    generation = snapshots.create(app_id, tasks, 0, 0, {}).record.generation
    for task in tasks:
        snapshots.report(app_id, generation, task, (Offset("s", 0, 1),), {"state": task.encode()})
    return generation


def objects(stores: Stores, app_id: str, generation: int) -> list[str]:
    return [b.key for b in stores.blobs.list(f"snapshots/{app_id}/{generation}/")]


def state_of(stores: Stores, app_id: str, generation: int) -> State | None:
    node = stores.metadata.get(gen_path(app_id, generation))
    return decode_snapshot(node.data).state if node is not None else None


def test_a_large_snapshot_goes_in_batches_and_nothing_else_goes(stores: Stores, clock: ManualClock) -> None:
    counted = FailingCommits(stores.metadata)
    snapshots = registry(counted, stores, clock)  # type: ignore[arg-type]
    kept_old = complete(snapshots, "app", TASKS[:3])
    victim = complete(snapshots, "app")
    kept_new = complete(snapshots, "app", TASKS[:2])
    other_app = complete(snapshots, "other")
    before = counted.transactions
    assert snapshots.delete("app", victim) is True
    # A mark, at least four batches of about 2 KiB (40 task paths of ~80 bytes + overhead), the header.
    assert counted.transactions - before >= 6
    assert stores.metadata.get(gen_path("app", victim)) is None
    assert stores.metadata.children(tasks_path("app", victim)) == []
    assert objects(stores, "app", victim) == []
    # What it must keep: the app's other snapshots and another app's, nodes and payloads.
    for app_id, generation, tasks in (
        ("app", kept_old, 3),
        ("app", kept_new, 2),
        ("other", other_app, len(TASKS)),
    ):
        got = snapshots.get(app_id, generation, include_checkpoints=True)
        assert got.snapshot.record.state is State.COMPLETED
        assert len(got.snapshot.tasks) == tasks and len(got.payloads) == tasks
        assert len(objects(stores, app_id, generation)) == tasks


def mark_only(snapshots: SnapshotRegistry, clock: ManualClock, app_id: str, generation: int) -> None:
    """A deletion whose caller died after the mark and one batch."""
    now = clock.now_ms()
    kernel = snapshots.kernel
    kernel.run(
        "test_mark",
        {},
        decide.delete_reads(app_id, generation, now),
        lambda reads, pending: decide.delete_mark(
            app_id, generation, reads, pending, now, SnapshotPolicy(max_clock_skew_ms=0)
        ),
    )
    kernel.run(
        "test_step",
        {},
        decide.delete_step_reads(app_id, generation),
        lambda reads, pending: decide.delete_step(app_id, generation, reads, pending, 1024, now),
    )


def test_a_half_done_deletion_reads_as_gone_and_the_janitor_finishes_it(
    stores: Stores, clock: ManualClock
) -> None:
    snapshots = registry(stores.metadata, stores, clock)
    victim = complete(snapshots, "app")
    newest = complete(snapshots, "app", TASKS[:1])
    mark_only(snapshots, clock, "app", victim)
    assert state_of(stores, "app", victim) is State.DELETING
    assert 0 < len(stores.metadata.children(tasks_path("app", victim))) < len(TASKS)
    with pytest.raises(NotFound):
        snapshots.get("app", victim, include_checkpoints=False)
    assert [s.record.generation for s in snapshots.list_page("app", 100, "")[0]] == [newest]
    leases = LeaseRegistry(
        stores.metadata, clock, LeasePolicy(), snapshots.kernel, CoordinatorMetrics(new_registry())
    )
    acquired = leases.acquire("restore", 60_000, [SnapshotRef("app", victim)])
    assert acquired.unavailable == (SnapshotRef("app", victim),)  # a DELETING snapshot is not pinned
    assert acquired.lease.snapshots == ()
    # The mark left a retention trigger: the next pass finishes the deletion.
    assert snapshots.apply_retention(100) == 1
    assert stores.metadata.get(gen_path("app", victim)) is None
    assert objects(stores, "app", victim) == []
    assert snapshots.get("app", newest, include_checkpoints=True).snapshot.record.state is State.COMPLETED


def test_a_pinned_snapshot_is_never_marked(stores: Stores, clock: ManualClock) -> None:
    snapshots = registry(stores.metadata, stores, clock)
    pinned = complete(snapshots, "app")
    complete(snapshots, "app", TASKS[:1])
    leases = LeaseRegistry(
        stores.metadata, clock, LeasePolicy(), snapshots.kernel, CoordinatorMetrics(new_registry())
    )
    assert leases.acquire("restore", 10 * HOUR_MS, [SnapshotRef("app", pinned)]).unavailable == ()
    with pytest.raises(FailedPrecondition) as refused:
        snapshots.delete("app", pinned)
    assert refused.value.reason is Reason.LEASE_HELD
    assert state_of(stores, "app", pinned) is State.COMPLETED  # the deletion never started
    assert len(stores.metadata.children(tasks_path("app", pinned))) == len(TASKS)
    assert len(objects(stores, "app", pinned)) == len(TASKS)
    clock.advance(2 * HOUR_MS)  # past its TTL, and not the newest: retention would take it
    assert snapshots.apply_retention(100) == 0
    assert state_of(stores, "app", pinned) is State.COMPLETED


def test_a_retention_trigger_survives_a_failing_delete(stores: Stores, clock: ManualClock) -> None:
    failing = FailingCommits(stores.metadata)
    snapshots = registry(failing, stores, clock)  # type: ignore[arg-type]
    old = complete(snapshots, "app", TASKS[:2])
    complete(snapshots, "app", TASKS[:2])
    clock.advance(2 * HOUR_MS)
    failing.failing = True
    with pytest.raises(StoreUnavailable):  # the pass ends: every app would fail the same way
        snapshots.apply_retention(100)
    triggers = [
        name
        for bucket in stores.metadata.children(RETENTION)
        for name in stores.metadata.children(f"{RETENTION}/{bucket}")
    ]
    assert any(name.startswith("app@") for name in triggers)
    assert state_of(stores, "app", old) is State.COMPLETED
    failing.failing = False
    clock.advance(60_000)
    assert snapshots.apply_retention(100) == 1
    assert stores.metadata.get(gen_path("app", old)) is None
    assert objects(stores, "app", old) == []
