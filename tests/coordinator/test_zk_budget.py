"""The worst-case ZooKeeper request calculator: complete, on the registries' layout, and an
upper bound of what the registries really send to a real ZooKeeper."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from harness.isolation import chroot_of
from snapcoord.coordinator import pins
from snapcoord.coordinator.backlog import layout as backlog_layout
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.leases import LeasePolicy, SnapshotRef
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerRecord
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.expiry_index import entry_path
from snapcoord.coordinator.leases import layout as leases_layout
from snapcoord.coordinator.leases.registry import LeaseRegistry
from snapcoord.coordinator.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers import layout as producers_layout
from snapcoord.coordinator.snapshots import layout as snapshots_layout
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.localblobs import LocalBlobStore
from snapcoord.coordinator.storage.metadata import Op
from snapcoord.coordinator.storage.zk_request_size import request_bytes
from snapcoord.coordinator.storage.zookeeper import ZooKeeperMetadataStore
from snapcoord.coordinator.zk_budget import (
    WORST_CASE,
    L,
    Limits,
    acquire_snapshots,
    delete_snapshot,
    worst_case_table,
)
from snapcoord.v1 import backlog_pb2, lease_pb2, producer_pb2, snapshot_pb2

HOUR_MS = 3_600_000


def test_every_rpc_has_a_row() -> None:
    names = {
        f"{service.name}/{m.name}"
        for module in (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
    }
    assert set(WORST_CASE) == names
    rows = worst_case_table()
    assert [r.rpc for r in rows] == list(WORST_CASE)
    # The findings of #11 D5/D6 show up as rows that do not fit at the default limits.
    by_rpc = {r.rpc: r for r in rows}
    assert not by_rpc["LeaseService/AcquireSnapshots"].fits
    assert not by_rpc["SnapshotService/DeleteSnapshot"].fits
    assert by_rpc["ProducerOffsetService/RegisterProducerOffsets"].fits


def test_small_limits_fit() -> None:
    small = Limits(
        snapshots=SnapshotPolicy(max_tasks=10, max_offsets_per_task=10),
        leases=LeasePolicy(max_snapshots=10),
    )
    assert all(r.fits for r in worst_case_table(small))


def test_templates_follow_the_registries() -> None:
    """When a registry moves a node, this fails: change zk_budget's template with it."""
    app, gen, task = "a" * 200, 12, "t" * 200
    assert L.producer(app) == producers_layout.record_path(app)
    record = ProducerRecord(app, f"producers/{app}/{'f' * 32}.json", 0, 7 * HOUR_MS)
    assert L.producer_index(record) == producers_layout.index_path(record)
    assert L.app(app) == snapshots_layout.app_path(app)
    assert L.gens(app) == snapshots_layout.gens_path(app)
    assert L.gen(app, gen) == snapshots_layout.gen_path(app, gen) == pins.snapshot_path(app, gen)
    assert L.tasks(app, gen) == snapshots_layout.tasks_path(app, gen)
    assert L.task(app, gen, task) == snapshots_layout.task_path(app, gen, task)
    assert L.pin(app, gen) == pins.pin_path(app, gen)
    deadlines = entry_path(snapshots_layout.DEADLINES, HOUR_MS, snapshots_layout.ref(app, gen))
    assert L.deadline(HOUR_MS, app, gen) == deadlines
    assert L.retention_entry(HOUR_MS, "x@1") == snapshots_layout.retention_entry(HOUR_MS, "x@1")
    assert L.lease(app) == leases_layout.record_path(app)
    assert L.lease_index(HOUR_MS, app) == entry_path(leases_layout.EXPIRY, HOUR_MS, app)
    assert L.job(app) == backlog_layout.job_path(app)
    assert L.shard(app, "m", 3) == backlog_layout.shard_path(app, "m", 3)
    assert L.marker(app, "m", 3, 9) == backlog_layout.marker_path(app, "m", 3, 9)


# -- against the real registries on a real ZooKeeper --------------------------------------------

SKEW_MS = 5_000
N = 4  # snapshots per lease, tasks per snapshot: small, so that every transaction is legal


@pytest.fixture
def store(zk_uri: str) -> Iterator[ZooKeeperMetadataStore]:
    s = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield s
    s.close()


class Recorder:
    """Wraps ``store.transaction`` to remember the exact size of each request sent."""

    def __init__(self, store: ZooKeeperMetadataStore, chroot: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        inner: Callable[[Sequence[Op]], None] = store.transaction

        def transaction(ops: Sequence[Op]) -> None:
            self.sizes.append(request_bytes(list(ops), chroot=chroot))
            inner(ops)

        monkeypatch.setattr(store, "transaction", transaction)


def _id(tag: str, i: int) -> str:
    head = f"{tag}{i}-"
    return head + "y" * (200 - len(head))


def test_the_calculator_bounds_what_the_registries_send(
    store: ZooKeeperMetadataStore, zk_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AcquireSnapshots (an expired lease re-acquired on other snapshots) and DeleteSnapshot (all
    tasks reported), both at maximum-length ids: what the registries send is at most the computed
    worst case, and close to it (the calculator's generations are 19 digits wider)."""
    chroot = chroot_of(zk_uri)
    clock = ManualClock(SystemClock().now_ms())
    spolicy = SnapshotPolicy(max_tasks=N, max_clock_skew_ms=SKEW_MS)
    lpolicy = LeasePolicy(max_snapshots=N, max_duration_ms=24 * HOUR_MS, max_clock_skew_ms=SKEW_MS)
    blobs = LocalBlobStore.from_uri((tmp_path / "blobs").as_uri())
    metrics = CoordinatorMetrics(new_registry())
    snaps = SnapshotRegistry(store, blobs, clock, spolicy, metrics)
    lease_registry = LeaseRegistry(store, clock, lpolicy, snaps, metrics)
    tasks = [_id("t", i) for i in range(N)]
    old: list[SnapshotRef] = []
    new: list[SnapshotRef] = []
    for i in range(N):
        for tag, refs in (("o", old), ("n", new)):
            app = _id(tag, i)
            created = snaps.create(app, tasks, 0, 0, {})
            refs.append(SnapshotRef(app, created.record.generation))
    lease_id = _id("l", 0)
    lease_registry.acquire(lease_id, HOUR_MS, old)
    clock.advance(HOUR_MS + SKEW_MS + 1)  # expired, not yet removed by a janitor

    recorder = Recorder(store, chroot, monkeypatch)
    lease_registry.acquire(lease_id, HOUR_MS, new)
    limits = Limits(snapshots=spolicy, leases=lpolicy, pin_holders=1, chroot=chroot)
    computed = request_bytes(acquire_snapshots(limits), chroot=chroot)
    assert len(recorder.sizes) == 1
    actual = recorder.sizes[0]
    assert actual <= computed <= actual + 60 * len(acquire_snapshots(limits)), (actual, computed)

    # DeleteSnapshot of a completed snapshot whose every task reported.
    app = old[0].app_id
    created = snaps.create(app, tasks, 0, 0, {})
    for t in tasks:
        snaps.report(app, created.record.generation, t, (Offset("s", 0, 1),), {})
    recorder.sizes.clear()
    assert snaps.delete(app, created.record.generation)
    computed = request_bytes(delete_snapshot(limits), chroot=chroot)
    assert len(recorder.sizes) == 1
    actual = recorder.sizes[0]
    assert actual <= computed <= actual + 60 * len(delete_snapshot(limits)), (actual, computed)
    blobs.close()
