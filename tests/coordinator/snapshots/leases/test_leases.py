"""Snapshot leases on both backends: the embedded defaults and real ZooKeeper + S3."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.leases import LeasePolicy, SnapshotRef
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy, State
from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, NotFound
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.leases.layout import RECORDS
from snapcoord.coordinator.snapshots.leases.registry import LeaseRegistry
from snapcoord.coordinator.snapshots.pins import PINS
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry

HOUR_MS = 3_600_000
SKEW_MS = 5_000
SNAPSHOTS = SnapshotPolicy(
    default_keep_last_completed=1, default_completed_ttl_ms=HOUR_MS, max_clock_skew_ms=SKEW_MS
)
LEASES = LeasePolicy(
    min_duration_ms=1_000, max_duration_ms=24 * HOUR_MS, max_snapshots=10, max_clock_skew_ms=SKEW_MS
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


@pytest.fixture
def snapshots(stores: Stores, clock: ManualClock) -> SnapshotRegistry:
    return SnapshotRegistry(
        stores.metadata, stores.blobs, clock, SNAPSHOTS, CoordinatorMetrics(new_registry())
    )


@pytest.fixture
def leases(stores: Stores, clock: ManualClock, snapshots: SnapshotRegistry) -> LeaseRegistry:
    return LeaseRegistry(stores.metadata, clock, LEASES, snapshots.kernel, CoordinatorMetrics(new_registry()))


def completed(snapshots: SnapshotRegistry, app_id: str = "app") -> SnapshotRef:
    created = snapshots.create(app_id, ["q"], 0, 0, {})
    snapshots.report(app_id, created.record.generation, "q", (Offset("in", 0, 1),), {"store": b"payload"})
    return SnapshotRef(app_id, created.record.generation)


def exists(snapshots: SnapshotRegistry, ref: SnapshotRef) -> bool:
    try:
        snapshots.get(ref.app_id, ref.generation, include_checkpoints=False)
    except NotFound:
        return False
    return True


def test_lifecycle(leases: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock) -> None:
    one, two = completed(snapshots), completed(snapshots)
    missing = SnapshotRef("app", 99)
    acquired = leases.acquire("restore-1", 60_000, [one, missing])
    assert acquired.unavailable == (missing,)
    assert acquired.lease.snapshots == (one,) and acquired.lease.expires_at_ms == clock.now_ms() + 60_000
    assert leases.get("restore-1") == acquired.lease

    clock.advance(30_000)
    renewed = leases.acquire("restore-1", 60_000, [two])  # every acquire renews, and adds
    assert renewed.lease.snapshots == (one, two) and renewed.lease.expires_at_ms == clock.now_ms() + 60_000
    assert leases.renew("restore-1", 120_000).expires_at_ms == clock.now_ms() + 120_000

    released = leases.release("restore-1", [one, SnapshotRef("other", 1)])  # not held: ignored
    assert released.snapshots == (two,)
    assert leases.release("restore-1", [one]).snapshots == (two,)  # idempotent
    assert [x.lease_id for x in leases.list_page(0, "")[0]] == ["restore-1"]

    assert leases.drop("restore-1") is True
    assert leases.drop("restore-1") is False  # idempotent
    calls: list[Callable[[], object]] = [
        lambda: leases.get("restore-1"),
        lambda: leases.release("restore-1", []),
        lambda: leases.renew("restore-1", 60_000),
    ]
    for call in calls:
        with pytest.raises(NotFound, match="no lease 'restore-1'"):
            call()


def test_validation(leases: LeaseRegistry, stores: Stores) -> None:
    ref = SnapshotRef("app", 1)
    bad: list[tuple[Callable[[], object], str]] = [
        (lambda: leases.acquire("l 1", 60_000, [ref]), "lease_id 'l 1' contains ' '"),
        (lambda: leases.acquire("l1", 999, [ref]), "duration_ms is 999; leases last 1000-86400000 ms"),
        (lambda: leases.acquire("l1", 25 * HOUR_MS, [ref]), "duration_ms is 90000000"),
        (lambda: leases.acquire("l1", 60_000, [SnapshotRef("app", 0)]), r"snapshots\[0\].generation is 0"),
        (lambda: leases.acquire("l1", 60_000, [ref, ref]), r"snapshots\[1\] repeats app@1"),
        (lambda: leases.acquire("l1", 60_000, [SnapshotRef("app", g) for g in range(1, 12)]), "limit is 10"),
    ]
    for call, message in bad:
        with pytest.raises(InvalidArgument, match=message):
            call()
    assert stores.metadata.children(RECORDS) == []


def test_a_leased_snapshot_survives_delete_retention_and_ttl(
    leases: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    old = completed(snapshots)
    leases.acquire("restore", 10 * HOUR_MS, [old])
    completed(snapshots)  # now `old` is beyond keep-last-1
    with pytest.raises(FailedPrecondition, match="held by a lease"):
        snapshots.delete(old.app_id, old.generation)
    assert snapshots.apply_retention(100) == 0
    clock.advance(2 * HOUR_MS)  # past the TTL too
    assert snapshots.apply_retention(100) == 0
    assert exists(snapshots, old)

    leases.release("restore", [old])
    assert snapshots.apply_retention(100) == 1  # the first pass after the release collects it
    assert not exists(snapshots, old)


def test_an_expired_lease_pins_nothing_even_before_the_janitor(
    leases: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock, stores: Stores
) -> None:
    ref = completed(snapshots)
    leases.acquire("short", 10_000, [ref])
    clock.advance(10_000 + SKEW_MS - 1)
    assert snapshots.pin_state(ref.app_id, ref.generation)[0] is True  # within the skew margin
    clock.advance(1)
    assert snapshots.pin_state(ref.app_id, ref.generation)[0] is False
    with pytest.raises(NotFound, match="expired"):
        leases.get("short")
    assert leases.list_page(0, "") == ([], "")
    assert snapshots.delete(ref.app_id, ref.generation) is True  # not blocked by the dead lease

    assert leases.expire_due(100) == 1  # the janitor removes the record and its pins
    assert stores.metadata.children(RECORDS) == [] and stores.metadata.children(PINS) == []


def test_expiry_releases_for_retention_on_the_first_pass(
    leases: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    old = completed(snapshots)
    leases.acquire("backfill", 60_000, [old])
    completed(snapshots)
    assert snapshots.apply_retention(100) == 0
    clock.advance(60_000 + SKEW_MS)
    assert leases.expire_due(100) == 1
    assert snapshots.apply_retention(100) == 1
    assert not exists(snapshots, old)


def test_reacquiring_an_expired_lease_starts_a_new_term(
    leases: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    a, b = completed(snapshots, "a"), completed(snapshots, "b")
    leases.acquire("job", 10_000, [a])
    clock.advance(60_000)
    again = leases.acquire("job", 10_000, [b])
    assert again.lease.snapshots == (b,)  # the dead term's pins are gone, not revived
    assert snapshots.pin_state("a", a.generation)[0] is False
    assert snapshots.pin_state("b", b.generation)[0] is True


def test_an_expired_lease_acquiring_a_snapshot_of_its_dead_term_pins_it_again(
    leases: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock, stores: Stores
) -> None:
    """The new term holds the snapshot again: its index is rewritten once (it used to be written
    and emptied in one transaction, which no store commits)."""
    ref = completed(snapshots)
    completed(snapshots)
    leases.acquire("job", 10_000, [ref])
    clock.advance(10_000 + SKEW_MS)
    again = leases.acquire("job", 60_000, [ref]).lease
    assert again.snapshots == (ref,) and again.expires_at_ms == clock.now_ms() + 60_000
    assert snapshots.pin_state(ref.app_id, ref.generation)[0] is True
    with pytest.raises(FailedPrecondition, match="held by a lease"):
        snapshots.delete(ref.app_id, ref.generation)
    assert stores.metadata.children(PINS) == [f"{ref.app_id}@{ref.generation}"]


def test_acquire_reports_deleted_snapshots_unavailable(
    leases: LeaseRegistry, snapshots: SnapshotRegistry
) -> None:
    ref = completed(snapshots)
    completed(snapshots)
    assert snapshots.delete(ref.app_id, ref.generation) is True
    acquired = leases.acquire("late", 60_000, [ref])
    assert acquired.unavailable == (ref,) and acquired.lease.snapshots == ()


def test_two_leases_on_one_snapshot(leases: LeaseRegistry, snapshots: SnapshotRegistry) -> None:
    ref = completed(snapshots)
    completed(snapshots)
    leases.acquire("a", 60_000, [ref])
    leases.acquire("b", 60_000, [ref])
    leases.drop("a")
    with pytest.raises(FailedPrecondition, match="held by a lease"):
        snapshots.delete(ref.app_id, ref.generation)
    leases.release("b", [ref])
    assert snapshots.delete(ref.app_id, ref.generation) is True


def test_a_created_snapshot_can_be_leased_and_completes(
    leases: LeaseRegistry, snapshots: SnapshotRegistry
) -> None:
    created = snapshots.create("app", ["q"], 0, 0, {})
    acquired = leases.acquire("early", 60_000, [SnapshotRef("app", 1)])
    assert acquired.unavailable == ()
    done = snapshots.report("app", 1, "q", (Offset("in", 0, 1),), {})
    assert created.record.state is State.CREATED and done.record.state is State.COMPLETED
