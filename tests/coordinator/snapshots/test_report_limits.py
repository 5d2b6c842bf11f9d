"""On both backends: checkpoint entries per report are capped with a precise refusal, a
report's payloads are put in parallel (all before the commit), and a failed put leaves no object
behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy, State
from snapcoord.coordinator.errors import InvalidArgument, Reason, StoreUnavailable
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.blobs import BlobStore

# Every checkpoint in the blob store (the path these limits guard); test_inline_checkpoints covers
# the ones held in the report.
POLICY = SnapshotPolicy(max_checkpoints_per_report=32, inline_checkpoint_max_bytes=0)


class CountingBlobs:
    """The blob store, counting puts running at once; fails puts of keys containing ``fail_on``."""

    def __init__(self, inner: BlobStore) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._running = 0
        self.most_at_once = 0
        self.fail_on = ""
        #: When set, every put waits until that many puts run at once: serial puts never get there.
        self.barrier: threading.Barrier | None = None

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            if self.fail_on and self.fail_on in key:
                raise StoreUnavailable("injected: S3 is unreachable")
            self._inner.put(key, data)
        finally:
            with self._lock:
                self._running -= 1

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.fixture
def blobs(stores: Stores) -> Iterator[CountingBlobs]:
    yield CountingBlobs(stores.blobs)


@pytest.fixture
def snapshots(stores: Stores, blobs: CountingBlobs) -> SnapshotRegistry:
    return SnapshotRegistry(
        stores.metadata,
        blobs,  # type: ignore[arg-type]
        SystemClock(),
        POLICY,
        CoordinatorMetrics(new_registry()),
    )


def objects(stores: Stores) -> list[str]:
    return [b.key for b in stores.blobs.list("snapshots/app/")]


def test_too_many_checkpoints_are_refused_before_any_upload(
    snapshots: SnapshotRegistry, stores: Stores
) -> None:
    g = snapshots.create("app", ["t"], 0, 0, {}).record.generation
    with pytest.raises(InvalidArgument) as refused:
        snapshots.report("app", g, "t", (), {f"s{i}": b"" for i in range(33)})
    assert refused.value.reason is Reason.TOO_LARGE
    assert str(refused.value) == (
        "task.checkpoints has 33 entries; the limit per report is 32 (--snapshot-max-checkpoints)"
    )
    assert refused.value.metadata == {"field": "task.checkpoints", "limit": "32"}
    assert objects(stores) == []
    assert snapshots.get("app", g, include_checkpoints=False).snapshot.tasks == ()


def test_a_reports_payloads_go_in_parallel_and_all_read_back(
    snapshots: SnapshotRegistry, blobs: CountingBlobs
) -> None:
    g = snapshots.create("app", ["t"], 0, 0, {}).record.generation
    payloads = {f"store-{i:02d}": bytes([i]) * (64 * 1024) for i in range(32)}
    blobs.barrier = threading.Barrier(4, timeout=120)  # 8 rounds of 4 puts running together
    done = snapshots.report("app", g, "t", (Offset("s", 0, 1),), payloads)
    assert done.record.state is State.COMPLETED
    got = snapshots.get("app", g, include_checkpoints=True).payloads
    assert got == {("t", store): data for store, data in payloads.items()}
    assert blobs.most_at_once >= 4


def test_a_failed_put_leaves_no_object_and_no_report(
    snapshots: SnapshotRegistry, blobs: CountingBlobs, stores: Stores
) -> None:
    g = snapshots.create("app", ["t"], 0, 0, {}).record.generation
    payloads = {f"store-{i:02d}": b"x" * 1024 for i in range(16)}
    blobs.fail_on = "/"  # every put fails; some may have landed before the failure in real S3
    with pytest.raises(StoreUnavailable):
        snapshots.report("app", g, "t", (), payloads)
    assert objects(stores) == []
    assert snapshots.get("app", g, include_checkpoints=False).snapshot.tasks == ()
    blobs.fail_on = ""
    assert snapshots.report("app", g, "t", (), payloads).record.state is State.COMPLETED
    assert len(objects(stores)) == 16


def test_an_oversized_task_set_is_refused_every_time_even_with_a_snapshot_open(stores: Stores) -> None:
    """The largest header a request shape can make is remembered (an app's creates repeat their
    shape), and the refusal it causes with it: again, and also while the app has a CREATED
    snapshot that a fitting create would just return."""
    policy = SnapshotPolicy(max_request_bytes=64 * 1024 + 16 * 1024)  # a 32 KiB header budget
    snapshots = SnapshotRegistry(
        stores.metadata, stores.blobs, SystemClock(), policy, CoordinatorMetrics(new_registry())
    )
    fits = [f"t{i}" for i in range(100)]
    too_many = [f"task-{i:04d}-{'x' * 40}" for i in range(1000)]
    created = snapshots.create("app", fits, 0, 0, {})
    for _ in range(3):
        with pytest.raises(InvalidArgument, match="make a snapshot header of up to") as refused:
            snapshots.create("app", too_many, 0, 0, {})
        assert refused.value.reason is Reason.TOO_LARGE
    assert snapshots.create("app", fits, 0, 0, {}) == created
    assert snapshots.current("app", consistent=True).record.task_ids == tuple(fits)
