"""The lease record cache on both backends: a renew is one transaction, and a stale copy never
extends, resurrects or overwrites another incarnation of the lease.

Two registries on one store stand for two coordinator processes: each has its own cache, so what
one writes makes the other's copy stale, which is the race these tests play out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.leases import Lease, LeasePolicy, SnapshotRef, decode_pins, encode_lease
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import decode_snapshot
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy, State
from snapcoord.coordinator.errors import FailedPrecondition, NotFound, Reason
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.layout import gen_path
from snapcoord.coordinator.snapshots.leases.layout import EXPIRY, RECORDS, index_path, record_path
from snapcoord.coordinator.snapshots.leases.registry import LeaseRegistry
from snapcoord.coordinator.snapshots.pins import PINS, pin_path
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.metadata import MetadataStore, Op, SetData

HOUR_MS = 3_600_000
SKEW_MS = 5_000
LEASES = LeasePolicy(max_duration_ms=24 * HOUR_MS, max_snapshots=10, max_clock_skew_ms=SKEW_MS)


@dataclass
class Calls:
    """The metadata store requests made, by kind."""

    reads: int = 0
    transactions: int = 0
    log: list[str] = field(default_factory=list)


@pytest.fixture
def clock() -> ManualClock:
    """At the start of a minute: a renew soon after an acquire keeps its expiry-index entry (a
    moved entry's delete would fail a stale commit by itself, hiding what the tests check)."""
    return ManualClock(SystemClock().now_ms() // 60_000 * 60_000)


@pytest.fixture
def snapshots(stores: Stores, clock: ManualClock) -> SnapshotRegistry:
    policy = SnapshotPolicy(default_keep_last_completed=1, max_clock_skew_ms=SKEW_MS)
    return SnapshotRegistry(stores.metadata, stores.blobs, clock, policy, CoordinatorMetrics(new_registry()))


def registry(stores: Stores, clock: ManualClock, snapshots: SnapshotRegistry) -> LeaseRegistry:
    return LeaseRegistry(stores.metadata, clock, LEASES, snapshots.kernel, CoordinatorMetrics(new_registry()))


@pytest.fixture
def here(stores: Stores, clock: ManualClock, snapshots: SnapshotRegistry) -> LeaseRegistry:
    """The process whose cache is under test."""
    return registry(stores, clock, snapshots)


@pytest.fixture
def elsewhere(stores: Stores, clock: ManualClock, snapshots: SnapshotRegistry) -> LeaseRegistry:
    """Another process on the same store."""
    return registry(stores, clock, snapshots)


@pytest.fixture
def calls(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    counted = Calls()
    store: MetadataStore = stores.metadata
    for name in ("get", "get_many", "synced_get_many", "children", "sync", "transaction"):
        inner = getattr(store, name)

        def wrapper(*args: object, _inner: object = inner, _name: str = name, **kwargs: object) -> object:
            if _name == "transaction":
                counted.transactions += 1
            else:
                counted.reads += 1
            counted.log.append(_name)
            return _inner(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(store, name, wrapper)
    yield counted


def completed(snapshots: SnapshotRegistry, app_id: str) -> SnapshotRef:
    created = snapshots.create(app_id, ["q"], 0, 0, {})
    snapshots.report(app_id, created.record.generation, "q", (Offset("in", 0, 1),), {"store": b"payload"})
    return SnapshotRef(app_id, created.record.generation)


def holders(stores: Stores, ref: SnapshotRef) -> dict[str, int]:
    node = stores.metadata.get(pin_path(ref.app_id, ref.generation))
    return decode_pins(node.data) if node is not None and node.data else {}


def stored(stores: Stores, lease_id: str) -> tuple[Lease, int] | None:
    from snapcoord.coordinator.snapshots.leases.decide import stored as decode

    current = decode(stores.metadata.get(record_path(lease_id)))
    return (current.lease, current.version) if current is not None else None


def test_a_renew_of_a_lease_this_process_wrote_is_one_transaction(
    stores: Stores, here: LeaseRegistry, clock: ManualClock, calls: Calls
) -> None:
    """The pure acquire + renew pair: no read at all, one transaction each (the raw bound)."""
    stores.metadata.ensure_path(RECORDS)
    stores.metadata.ensure_path(PINS)
    here.acquire("warm", 60_000, [])  # makes the expiry bucket of this minute
    calls.reads = calls.transactions = 0
    calls.log.clear()
    acquired = here.acquire("job", 60_000, [])
    clock.advance(1_000)
    renewed = here.renew("job", 60_000)
    assert (calls.reads, calls.transactions) == (0, 2), calls.log
    assert renewed.expires_at_ms == clock.now_ms() + 60_000
    assert renewed.incarnation == acquired.lease.incarnation != ""
    current = stored(stores, "job")
    assert current is not None and current == (renewed, 1)


def test_a_renew_racing_a_drop_and_reacquire_never_extends_the_old_incarnation(
    stores: Stores,
    here: LeaseRegistry,
    elsewhere: LeaseRegistry,
    snapshots: SnapshotRegistry,
    clock: ManualClock,
) -> None:
    """Here holds a copy of the lease at version 0 pinning ``old``. Elsewhere drops it and acquires
    it again on ``new`` for a short term: the record is back at version 0, so only the incarnation
    tells the two apart. Here's renew must not write its copy (which would bring ``old`` back into
    the record, drop ``new`` from it while its pin stays, and put back the expiry here chose)."""
    old, new = completed(snapshots, "old"), completed(snapshots, "new")
    first = here.acquire("job", HOUR_MS, [old]).lease
    assert elsewhere.drop("job") is True
    second = elsewhere.acquire("job", 10_000, [new]).lease
    current = stored(stores, "job")
    assert current is not None and current[1] == 0, "the test needs the version to have restarted"
    assert second.incarnation != first.incarnation

    clock.advance(1_000)
    renewed = here.renew("job", HOUR_MS)
    # The renew read the record and extended what is stored now: the second incarnation.
    assert renewed.snapshots == (new,) and renewed.incarnation == second.incarnation
    assert stored(stores, "job") == (renewed, 1)
    assert holders(stores, old) == {}, "the old incarnation's pin must not come back"
    assert holders(stores, new) == {"job": second.expires_at_ms}, "a renewal leaves the indexes as they are"


def test_a_renew_racing_a_drop_does_not_resurrect_the_lease(
    stores: Stores, here: LeaseRegistry, elsewhere: LeaseRegistry, snapshots: SnapshotRegistry
) -> None:
    ref = completed(snapshots, "app")
    here.acquire("job", HOUR_MS, [ref])
    assert elsewhere.drop("job") is True
    with pytest.raises(NotFound) as raised:
        here.renew("job", HOUR_MS)
    assert raised.value.reason is Reason.NOT_FOUND
    with pytest.raises(NotFound):
        here.release("job", [ref])
    assert stored(stores, "job") is None and holders(stores, ref) == {}
    assert here.drop("job") is False  # from the stale copy: nothing to drop, nothing written
    assert stores.metadata.children(RECORDS) == []


def test_a_renew_after_the_janitor_expired_and_another_process_reacquired(
    stores: Stores, elsewhere: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    """Expiry by the janitor (not a drop) and a re-acquire elsewhere while a process whose clock
    lags still holds the old copy, which to it shows a live lease (replicas' clocks differ)."""
    behind = ManualClock(clock.now_ms())
    lagging = LeaseRegistry(
        stores.metadata, behind, LEASES, snapshots.kernel, CoordinatorMetrics(new_registry())
    )
    old, new = completed(snapshots, "old"), completed(snapshots, "new")
    lagging.acquire("job", 10_000, [old])
    clock.advance(10_000 + SKEW_MS + 1)
    assert elsewhere.expire_due(100) == 1
    second = elsewhere.acquire("job", 10_000, [new]).lease
    current = stored(stores, "job")
    assert current is not None and current[1] == 0
    renewed = lagging.renew("job", 30_000)
    assert renewed.snapshots == (new,) and renewed.incarnation == second.incarnation
    assert holders(stores, old) == {}


def test_a_stale_copy_after_a_renew_elsewhere_costs_one_more_round(
    stores: Stores, here: LeaseRegistry, elsewhere: LeaseRegistry, clock: ManualClock
) -> None:
    here.acquire("job", 60_000, [])
    clock.advance(1_000)
    longer = elsewhere.renew("job", 600_000)  # version 1; here's copy says 0
    clock.advance(1_000)
    assert here.renew("job", 60_000).expires_at_ms == clock.now_ms() + 60_000
    current = stored(stores, "job")
    assert current is not None and current[1] == 2 and current[0].incarnation == longer.incarnation
    # Elsewhere's copy is now stale; its drop reads and drops.
    assert elsewhere.drop("job") is True
    assert stored(stores, "job") is None


def test_an_acquire_of_a_lease_held_elsewhere_keeps_what_it_holds(
    stores: Stores, here: LeaseRegistry, elsewhere: LeaseRegistry, snapshots: SnapshotRegistry
) -> None:
    """With no copy, an acquire guesses "no record"; the record exists, so its create fails and
    the call reads: the lease keeps its snapshots and incarnation, and adds the new one."""
    one, two = completed(snapshots, "one"), completed(snapshots, "two")
    first = elsewhere.acquire("job", HOUR_MS, [one]).lease
    both = here.acquire("job", HOUR_MS, [two]).lease
    assert both.snapshots == (one, two) and both.incarnation == first.incarnation
    assert set(holders(stores, one)) == set(holders(stores, two)) == {"job"}


def test_a_copy_of_an_expired_lease_is_not_used_for_a_refusal(
    here: LeaseRegistry, elsewhere: LeaseRegistry, clock: ManualClock
) -> None:
    """Here's copy shows the lease expired, but elsewhere renewed it: renew reads, and succeeds."""
    here.acquire("job", 10_000, [])
    elsewhere.renew("job", HOUR_MS)
    clock.advance(10_000 + SKEW_MS + 1)
    assert here.renew("job", 60_000).expires_at_ms == clock.now_ms() + 60_000


def test_a_record_without_incarnation_is_renewed_and_dropped_by_reading(
    stores: Stores, here: LeaseRegistry, clock: ManualClock, calls: Calls
) -> None:
    """Records written before incarnations existed: no copy is used for them, every call reads."""
    lease = Lease("legacy", 60_000, clock.now_ms() + 60_000, ())
    for parent in (RECORDS, EXPIRY):
        stores.metadata.ensure_path(parent)
    stores.metadata.create(record_path("legacy"), encode_lease(lease))
    stores.metadata.create(index_path(lease, SKEW_MS), b"", make_parents=True)
    calls.reads = calls.transactions = 0
    renewed = here.renew("legacy", 120_000)
    assert renewed.incarnation == "" and calls.reads >= 1
    reads = calls.reads
    here.renew("legacy", 120_000)
    assert calls.reads > reads
    assert here.drop("legacy") is True
    assert stores.metadata.children(RECORDS) == []


def test_racing_renews_drops_and_reacquires_keep_record_pins_and_incarnation_in_step(
    stores: Stores, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    """Two processes (one registry each, so two caches) hammer one lease id with renews,
    acquires on alternating snapshots, releases and drops from several threads. Whatever
    interleaving, the stored state stays coherent: the record lists exactly the snapshots whose
    pin index names the lease, and its one incarnation child is the one its data names."""
    from harness.concurrency import run_threads

    refs = [completed(snapshots, f"app{i}") for i in range(3)]
    procs = [registry(stores, clock, snapshots) for _ in range(2)]

    def worker(i: int) -> None:
        leases = procs[i % 2]
        for k in range(12):
            step = (i + k) % 4
            try:
                if step == 0:
                    leases.acquire("job", HOUR_MS, [refs[(i + k) % 3]])
                elif step == 1:
                    leases.renew("job", HOUR_MS)
                elif step == 2:
                    leases.release("job", [refs[k % 3]])
                else:
                    leases.drop("job")
            except NotFound:
                pass  # dropped by another thread: the answer, not a failure

    run_threads(6, worker)
    current = stored(stores, "job")
    pinned = {ref for ref in refs if "job" in holders(stores, ref)}
    if current is None:
        assert pinned == set() and stores.metadata.children(RECORDS) == []
        return
    lease, _ = current
    assert set(lease.snapshots) == pinned
    assert lease.incarnation and stores.metadata.children(record_path("job")) == [lease.incarnation]


def test_a_renew_of_a_lease_holding_snapshots_is_one_transaction_and_leaves_the_pins(
    stores: Stores, here: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock, calls: Calls
) -> None:
    """RenewLease writes the lease's record and nothing else: no pin index is read or rewritten,
    however many snapshots it holds (so holders of one snapshot never collide renewing)."""
    refs = [completed(snapshots, f"app{i}") for i in range(3)]
    acquired = here.acquire("job", 60_000, refs).lease
    before = {r: stores.metadata.get(pin_path(r.app_id, r.generation)) for r in refs}
    calls.reads = calls.transactions = 0
    calls.log.clear()
    clock.advance(1_000)
    renewed = here.renew("job", 60_000)
    assert (calls.reads, calls.transactions) == (0, 1), calls.log
    assert renewed.snapshots == acquired.snapshots and renewed.expires_at_ms == clock.now_ms() + 60_000
    assert {r: stores.metadata.get(pin_path(r.app_id, r.generation)) for r in refs} == before


def test_a_holder_another_clock_shows_expired_keeps_its_place_and_renewed_its_snapshot(
    stores: Stores, here: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    """b pins ``ref`` for 10 s, then renews for an hour: the index still lists b with the expiry it
    pinned with. A process whose clock is ahead sees that listed expiry passed; its acquire must
    not take b out (b's own process still sees b alive, and b renews), and once every other
    holder is gone a delete or retention must read b's record and keep the snapshot."""
    ref = completed(snapshots, "app")
    completed(snapshots, "app")  # retention (keep the last 1) would delete ref if nothing pinned it
    ahead = ManualClock(clock.now_ms())
    other = LeaseRegistry(
        stores.metadata, ahead, LEASES, snapshots.kernel, CoordinatorMetrics(new_registry())
    )
    b = here.acquire("b", 10_000, [ref]).lease

    # b is current here for 1 ms more, and listed as expired by the other process's clock (further
    # ahead than --max-clock-skew allows: the mechanism must hold anyway).
    clock.advance(10_000 - 1)
    ahead.advance(10_000 + SKEW_MS)
    c = other.acquire("c", HOUR_MS, [ref]).lease
    assert holders(stores, ref) == {"b": b.expires_at_ms, "c": c.expires_at_ms}
    renewed = here.renew("b", HOUR_MS)
    assert other.drop("c") is True
    assert holders(stores, ref) == {"b": b.expires_at_ms}, "listed with the expiry it pinned with"

    clock.advance(60_000)  # b's listed expiry is a minute past now, its record an hour ahead
    with pytest.raises(FailedPrecondition) as refused:
        snapshots.delete(ref.app_id, ref.generation)
    assert refused.value.reason is Reason.LEASE_HELD
    assert snapshots.apply_retention(100) == 0
    header = stores.metadata.get(gen_path(ref.app_id, ref.generation))
    assert header is not None and decode_snapshot(header.data).state is State.COMPLETED

    clock.advance(renewed.expires_at_ms - clock.now_ms() + SKEW_MS)  # now b is really over
    assert here.expire_due(100) == 1
    assert snapshots.apply_retention(100) == 1
    assert stores.metadata.get(gen_path(ref.app_id, ref.generation)) is None


def test_a_renewal_landing_between_a_deletes_read_and_its_commit_fails_the_delete(
    stores: Stores, here: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    """The race a renewal that no longer rewrites the pin index must still win: the deleting
    process (clock ahead) reads b's record and finds it expired; b's own process (clock behind,
    just before its expiry) renews before the delete's transaction commits. The delete rewrites
    b's record at the version it read, so it fails, reads again, finds b alive and refuses."""
    ref = completed(snapshots, "app")
    completed(snapshots, "app")
    b = here.acquire("b", 10_000, [ref]).lease
    ahead = ManualClock(clock.now_ms() + 10_000 + SKEW_MS + 1)  # b is over by this clock
    deleter = SnapshotRegistry(
        stores.metadata,
        stores.blobs,
        ahead,
        SnapshotPolicy(default_keep_last_completed=1, max_clock_skew_ms=SKEW_MS),
        CoordinatorMetrics(new_registry()),
    )
    clock.advance(10_000 - 1)  # ...and current for 1 ms more by b's
    real = stores.metadata.transaction
    renewed: list[Lease] = []
    started: list[bool] = []

    def renew_first(ops: object, *args: object, **kwargs: object) -> object:
        if not started:  # the delete's first transaction: b's renewal lands just before it
            started.append(True)
            renewed.append(here.renew("b", HOUR_MS))
        return real(ops, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stores.metadata, "transaction", renew_first)
        with pytest.raises(FailedPrecondition) as refused:
            deleter.delete(ref.app_id, ref.generation)
    assert refused.value.reason is Reason.LEASE_HELD
    assert renewed and renewed[0].expires_at_ms > b.expires_at_ms
    header = stores.metadata.get(gen_path(ref.app_id, ref.generation))
    assert header is not None and decode_snapshot(header.data).state is State.COMPLETED


def deleter_at(stores: Stores, ahead: ManualClock) -> SnapshotRegistry:
    """Another process deleting snapshots, by its own clock."""
    policy = SnapshotPolicy(default_keep_last_completed=1, max_clock_skew_ms=SKEW_MS)
    return SnapshotRegistry(stores.metadata, stores.blobs, ahead, policy, CoordinatorMetrics(new_registry()))


@pytest.mark.parametrize("via", ["renew", "acquire"])
def test_a_renewal_decided_before_a_delete_that_commits_first_fails(
    stores: Stores, here: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock, via: str
) -> None:
    """Data loss guard, the other order: b decides its renewal 1 ms before its expiry; before its
    transaction lands, time passes and a process whose clock is ahead (within the margin) finds b
    dead and deletes the snapshot. A delete that only checked b's record left the renewal's write
    at that version to land after it: a live lease holding a deleted snapshot. The delete
    rewrites b's record, so the renewal fails, reads again and finds b expired."""
    ref = completed(snapshots, "app")
    completed(snapshots, "app")
    b = here.acquire("b", 10_000, [ref]).lease
    ahead = ManualClock(b.expires_at_ms + SKEW_MS)  # b is over by this clock...
    deleter = deleter_at(stores, ahead)
    clock.advance(b.expires_at_ms - 1 - clock.now_ms())  # ...and current for 1 ms more by b's
    real = stores.metadata.transaction
    deleted: list[bool] = []

    def delete_first(ops: Sequence[Op]) -> None:
        if not deleted and any(isinstance(op, SetData) and op.path == record_path("b") for op in ops):
            deleted.append(True)  # b's own transaction, decided already: the delete overtakes it
            clock.advance(2)  # b's clock moves on with the deleter's (1 ms apart, within the margin)
            assert deleter.delete(ref.app_id, ref.generation) is True
        real(ops)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stores.metadata, "transaction", delete_first)
        if via == "renew":
            with pytest.raises(NotFound) as refused:
                here.renew("b", HOUR_MS)
            assert refused.value.reason is Reason.EXPIRED
        else:
            again = here.acquire("b", HOUR_MS, [ref])
            assert again.unavailable == (ref,) and again.lease.snapshots == ()
    assert deleted
    with pytest.raises(NotFound):
        snapshots.get(ref.app_id, ref.generation, include_checkpoints=False)
    lease = stored(stores, "b")
    assert lease is None or ref not in lease[0].snapshots or not lease[0].is_current(clock.now_ms())


def test_a_lease_past_its_expiry_is_not_renewed_after_a_delete_by_a_clock_ahead(
    stores: Stores, here: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    """No race needed: the deleting process's clock runs 2 s ahead (the margin is 5 s). It finds b
    dead at b's expiry plus the margin and deletes the snapshot; b, 3 s past its expiry by its own
    clock, then renews. That renewal once succeeded, holding a deleted snapshot: a lease can be
    renewed only before its expiry, and the margin keeps that apart from any deletion."""
    ref = completed(snapshots, "app")
    completed(snapshots, "app")
    b = here.acquire("b", 10_000, [ref]).lease
    clock.advance(b.expires_at_ms + SKEW_MS - 2_000 - clock.now_ms())
    assert deleter_at(stores, ManualClock(clock.now_ms() + 2_000)).delete(ref.app_id, ref.generation) is True
    with pytest.raises(NotFound) as refused:
        here.renew("b", HOUR_MS)
    assert refused.value.reason is Reason.EXPIRED
    with pytest.raises(NotFound):
        here.get("b")
    again = here.acquire("b", HOUR_MS, [ref])
    assert again.unavailable == (ref,) and again.lease.snapshots == ()


def test_an_expired_holder_takes_a_place_until_the_janitor_removes_it(
    stores: Stores, here: LeaseRegistry, snapshots: SnapshotRegistry, clock: ManualClock
) -> None:
    """The holder limit counts every listed lease (so an index never outgrows it): an expired one
    until the janitor's expiry removes it, with its record. An expired lease acquiring its old
    snapshot again pins it anew."""
    ref = completed(snapshots, "app")
    two = LeaseRegistry(
        stores.metadata,
        clock,
        LeasePolicy(max_duration_ms=24 * HOUR_MS, max_holders=2, max_clock_skew_ms=SKEW_MS),
        snapshots.kernel,
        CoordinatorMetrics(new_registry()),
    )
    two.acquire("x", 10_000, [ref])
    two.acquire("y", 10_000, [ref])
    clock.advance(10_000 + SKEW_MS)
    with pytest.raises(FailedPrecondition) as refused:
        two.acquire("z", HOUR_MS, [ref])
    assert refused.value.reason is Reason.TOO_LARGE and "until the janitor removes it" in str(refused.value)
    again = two.acquire("x", HOUR_MS, [ref]).lease  # x's dead term pinned ref: it pins it again
    assert again.snapshots == (ref,)
    assert holders(stores, ref) == {"x": again.expires_at_ms, "y": clock.now_ms() - SKEW_MS}
    assert two.expire_due(100) == 1  # y
    assert two.acquire("z", HOUR_MS, [ref]).lease.snapshots == (ref,)
    assert set(holders(stores, ref)) == {"x", "z"}
