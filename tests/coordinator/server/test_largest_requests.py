"""Every write RPC at its largest legal sizes against a real ZooKeeper with its default
jute.maxbuffer: maximum-length ids, every count at the default maximum or as many as the
byte budgets admit. Each call succeeds, every request sent fits the limit, and one more item is
refused with INVALID_ARGUMENT (TOO_LARGE) before anything is written."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from harness.isolation import chroot_of
from snapcoord.coordinator.backlog.registry import BacklogRegistry
from snapcoord.coordinator.domain.backlog import BacklogPolicy
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.ids import MAX_ID_LENGTH
from snapcoord.coordinator.domain.leases import LeasePolicy, SnapshotRef
from snapcoord.coordinator.domain.offsets import MAX_PARTITION, Offset
from snapcoord.coordinator.domain.producer_codec import inline_offsets_bytes
from snapcoord.coordinator.domain.producers import MAX_INLINE_BYTES, ProducerPolicy, Registration
from snapcoord.coordinator.domain.snapshots import (
    MAX_LABEL_BYTES,
    MAX_LABELS,
    MAX_REASON_CHARS,
    SnapshotPolicy,
)
from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, Reason
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers.registry import ProducerRegistry
from snapcoord.coordinator.server import worst_requests as zk_budget
from snapcoord.coordinator.snapshots.leases.registry import LeaseRegistry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.backends import open_blob_store
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore, Op
from snapcoord.coordinator.storage.zookeeper.request_size import ZK_DEFAULT_MAX_REQUEST_BYTES, request_bytes
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

HOUR_MS = 3_600_000
LIMIT = ZK_DEFAULT_MAX_REQUEST_BYTES


def long_id(tag: str, i: int = 0) -> str:
    head = f"{tag}{i}-"
    return head + "z" * (MAX_ID_LENGTH - len(head))


class Recorder:
    """The metadata store, remembering the exact size of every request it sends, by label."""

    def __init__(self, inner: ZooKeeperMetadataStore, chroot: str) -> None:
        self._inner = inner
        self._chroot = chroot
        self.label = ""
        self.largest: dict[str, int] = {}

    def transaction(self, ops: Sequence[Op]) -> None:
        size = request_bytes(list(ops), chroot=self._chroot)
        self.largest[self.label] = max(size, self.largest.get(self.label, 0))
        self._inner.transaction(ops)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.fixture
def recorder(zk_uri: str) -> Iterator[Recorder]:
    store = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield Recorder(store, chroot_of(zk_uri))
    store.close()


@pytest.fixture
def blobs(s3_uri: str) -> Iterator[BlobStore]:
    store = open_blob_store(s3_uri)
    yield store
    store.close()


def run(recorder: Recorder, label: str, call: Callable[[], object]) -> object:
    recorder.label = label
    result = call()
    assert recorder.largest.get(label, 0) <= LIMIT, (label, recorder.largest[label])
    return result


def test_every_rpc_at_its_largest_legal_sizes_fits_zookeeper(
    recorder: Recorder, blobs: BlobStore, tmp_path: Path
) -> None:
    clock = ManualClock(SystemClock().now_ms())
    metrics = CoordinatorMetrics(new_registry())
    metadata: MetadataStore = recorder  # type: ignore[assignment]
    # Checkpoints as blob store refs, the widest stored form of a small checkpoint (one held in the
    # report is refused beyond the same report budget).
    spolicy = SnapshotPolicy(inline_checkpoint_max_bytes=0)
    lpolicy = LeasePolicy()
    snapshots = SnapshotRegistry(metadata, blobs, clock, spolicy, metrics)
    leases = LeaseRegistry(metadata, clock, lpolicy, snapshots.kernel, metrics)

    # CreateSnapshot: as many 200-character task ids as the header budget admits, every label.
    limits = zk_budget.Limits(snapshots=spolicy, leases=lpolicy)
    n_tasks = zk_budget._legal_tasks(limits)
    assert 0 < n_tasks < spolicy.max_tasks  # the budget binds before the count at 200 characters
    app = long_id("app")
    tasks = [long_id("t", i) for i in range(n_tasks)]
    labels = {f"{i:04d}" + "k" * 96: "v" * (MAX_LABEL_BYTES - 100) for i in range(MAX_LABELS)}
    with pytest.raises(InvalidArgument) as refused:
        snapshots.create(app, [*tasks, long_id("t", n_tasks)], 0, 0, labels)
    assert refused.value.reason is Reason.TOO_LARGE and "use fewer or shorter task ids" in str(refused.value)
    assert metadata.get(f"/snapshots/apps/{app}") is None  # refused before anything was written
    created = run(recorder, "CreateSnapshot", lambda: snapshots.create(app, tasks, 0, 0, labels))
    generation = created.record.generation  # type: ignore[attr-defined]

    # ReportTaskSnapshot: every checkpoint entry, and as many 200-character offsets as fit.
    report = zk_budget._report(limits, app, uploaded=False)
    offsets = [Offset(o.stream, MAX_PARTITION, 2**63 - 1) for o in report.committed_offsets]
    checkpoints = {long_id("c", i): b"x" for i in range(spolicy.max_checkpoints_per_report)}
    too_many = [*offsets, *(Offset(long_id("extra", i), 0, 1) for i in range(20))]
    with pytest.raises(InvalidArgument) as refused:
        snapshots.report(app, generation, tasks[0], too_many, checkpoints)
    assert refused.value.reason is Reason.TOO_LARGE and "report fewer offsets" in str(refused.value)
    run(
        recorder,
        "ReportTaskSnapshot",
        lambda: snapshots.report(app, generation, tasks[0], offsets, checkpoints),
    )
    # The same with every entry uploaded: each retires its intent in the report's transaction.
    uploads = {
        store: snapshots.upload(app, generation, tasks[1], store, [b"u"]).upload_id for store in checkpoints
    }
    report = zk_budget._report(limits, app, uploaded=True)
    offsets = [Offset(o.stream, MAX_PARTITION, 2**63 - 1) for o in report.committed_offsets]
    too_many = [*offsets, *(Offset(long_id("extra", i), 0, 1) for i in range(20))]
    with pytest.raises(InvalidArgument) as refused:
        snapshots.report(app, generation, tasks[1], too_many, {}, uploads)
    assert refused.value.reason is Reason.TOO_LARGE
    run(
        recorder,
        "ReportTaskSnapshot(uploads)",
        lambda: snapshots.report(app, generation, tasks[1], offsets, {}, uploads),
    )

    # AbortSnapshot with the longest reason, then DeleteSnapshot of all of it.
    run(recorder, "AbortSnapshot", lambda: snapshots.abort(app, generation, "r" * MAX_REASON_CHARS))
    assert run(recorder, "DeleteSnapshot", lambda: snapshots.delete(app, generation)) is True

    # DeleteSnapshot with every task reported: more task nodes than one step deletes (about 1,250
    # at these path lengths), with short task ids so that 2,000 reports do not each rewrite a
    # 500 KB header.
    app2 = long_id("app2")
    reported = [f"task-{i:05d}" for i in range(2_000)]
    g2 = snapshots.create(app2, reported, 0, 0, {}).record.generation
    for t in reported:
        snapshots.report(app2, g2, t, (Offset("s", 0, 1),), {})
    assert run(recorder, "DeleteSnapshot(all reported)", lambda: snapshots.delete(app2, g2)) is True
    assert metadata.get(f"/snapshots/apps/{app2}/gens/{g2:020d}") is None

    # Leases: a lease re-acquired after it expired, from max_snapshots old snapshots to as many new
    # ones, each new one already held by max_holders - 1 other leases.
    refs_old = [SnapshotRef(long_id("o", i), 1) for i in range(lpolicy.max_snapshots)]
    refs_new = [SnapshotRef(long_id("n", i), 1) for i in range(lpolicy.max_snapshots)]
    for r in [*refs_old, *refs_new]:
        snapshots.create(r.app_id, ["t"], 0, 0, {})
        snapshots.report(r.app_id, 1, "t", (), {})
    for k in range(lpolicy.max_holders - 1):
        leases.acquire(long_id("other", k), 7 * 24 * HOUR_MS, refs_new)
    with pytest.raises(FailedPrecondition) as held:
        leases.acquire(long_id("one-too-many", 0), HOUR_MS, refs_new[:1]) if lpolicy.max_holders == 1 else (
            leases.acquire(long_id("other", lpolicy.max_holders - 1), HOUR_MS, refs_new[:1]),
            leases.acquire(long_id("one-too-many", 0), HOUR_MS, refs_new[:1]),
        )
    assert held.value.reason is Reason.TOO_LARGE
    leases.release(long_id("other", lpolicy.max_holders - 1), refs_new[:1])
    lease_id = long_id("lease")
    leases.acquire(lease_id, HOUR_MS, refs_old)
    clock.advance(HOUR_MS + lpolicy.max_clock_skew_ms + 1)  # expired, not yet removed
    acquired = run(recorder, "AcquireSnapshots", lambda: leases.acquire(lease_id, 7 * 24 * HOUR_MS, refs_new))
    assert acquired.unavailable == ()  # type: ignore[attr-defined]
    run(recorder, "RenewLease", lambda: leases.renew(lease_id, 7 * 24 * HOUR_MS))
    run(recorder, "ReleaseSnapshots", lambda: leases.release(lease_id, refs_new))
    leases.acquire(lease_id, 7 * 24 * HOUR_MS, refs_new)
    run(recorder, "DropLease", lambda: leases.drop(lease_id))

    # Producers and backlog: their ZooKeeper records are small whatever the payload.
    producers = ProducerRegistry(metadata, blobs, clock, ProducerPolicy(), metrics)
    many = [Offset(long_id("s", i % 100), i // 100, 2**63 - 1) for i in range(ProducerPolicy().max_offsets)]
    run(recorder, "RegisterProducerOffsets", lambda: producers.register(long_id("p"), many, 0))
    run(recorder, "DeleteProducerOffsets", lambda: producers.delete(long_id("p")))
    # Offsets inline at the largest threshold the option allows: registered, then advanced from.
    inline = ProducerRegistry(
        metadata, blobs, clock, ProducerPolicy(inline_max_bytes=MAX_INLINE_BYTES), metrics
    )
    widest: list[Offset] = []
    while (
        inline_offsets_bytes((*widest, Offset(long_id("s", len(widest)), MAX_PARTITION, 2**63 - 1)))
        <= MAX_INLINE_BYTES
    ):
        widest.append(Offset(long_id("s", len(widest)), MAX_PARTITION, 2**63 - 1))
    run(recorder, "RegisterProducerOffsets", lambda: inline.register(long_id("p", 1), widest, 0))
    advanced = run(
        recorder,
        "AdvanceProducerOffsets",
        lambda: inline.advance(long_id("p", 2), widest, 0, long_id("p", 1)),
    )
    assert advanced == (Registration(True, inline.get(long_id("p", 2))), True)
    assert recorder.largest["AdvanceProducerOffsets"] > MAX_INLINE_BYTES  # held in ZooKeeper
    backlog = BacklogRegistry(metadata, blobs, clock, BacklogPolicy(), metrics)
    bounds = [Offset(long_id("s", i), 0, 2**62) for i in range(BacklogPolicy().max_partitions)]
    run(recorder, "MarkBacklog", lambda: backlog.mark(long_id("j"), bounds, False))
    run(recorder, "ReportProgress", lambda: backlog.report(long_id("j"), bounds))
    run(recorder, "ClearBacklog", lambda: backlog.clear(long_id("j")))

    print("\nlargest request per RPC (bytes sent to ZooKeeper / limit):")
    for label, size in recorder.largest.items():
        print(f"  {label:32s} {size:>9,d} / {LIMIT:,d}")
