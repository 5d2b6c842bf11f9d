"""Checkpoints held in their task's report in ZooKeeper (small ones), next to checkpoints in the blob
store and reports of the earlier format, on both backends (real ZooKeeper + S3)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.documents import load
from snapcoord.coordinator.domain.leases import encode_pins
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy, State
from snapcoord.coordinator.errors import CommitOutcomeUnknown, CorruptRecord
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.layout import task_path
from snapcoord.coordinator.snapshots.pins import pin_path
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import Op

HOUR_MS = 3_600_000
INLINE_MAX = 4096
POLICY = SnapshotPolicy(
    default_keep_last_completed=2,
    default_completed_ttl_ms=24 * HOUR_MS,
    inline_checkpoint_max_bytes=INLINE_MAX,
)
#: What releases before inline checkpoints write: every checkpoint in the blob store.
EARLIER = SnapshotPolicy(
    default_keep_last_completed=2, default_completed_ttl_ms=24 * HOUR_MS, inline_checkpoint_max_bytes=0
)
OFFSETS = (Offset("orders", 0, 100),)
SMALL = b"s" * INLINE_MAX
LARGE = b"L" * (INLINE_MAX + 1)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


def registry(stores: Stores, clock: ManualClock, policy: SnapshotPolicy = POLICY) -> SnapshotRegistry:
    return SnapshotRegistry(stores.metadata, stores.blobs, clock, policy, CoordinatorMetrics(new_registry()))


@pytest.fixture
def snapshots(stores: Stores, clock: ManualClock) -> SnapshotRegistry:
    return registry(stores, clock)


def objects(blobs: BlobStore, app_id: str) -> list[str]:
    return sorted(b.key for b in blobs.list(f"snapshots/{app_id}/"))


def complete(snapshots: SnapshotRegistry, app_id: str, checkpoints: dict[str, bytes]) -> int:
    generation = snapshots.create(app_id, ["q1"], 0, 0, {}).record.generation
    done = snapshots.report(app_id, generation, "q1", OFFSETS, checkpoints)
    assert done.record.state is State.COMPLETED
    return generation


def read(snapshots: SnapshotRegistry, app_id: str, generation: int, store: str) -> bytes:
    ref, pieces = snapshots.read_checkpoint(app_id, generation, "q1", store)
    data = b"".join(pieces)
    assert len(data) == ref.size
    return data


def test_a_small_report_and_its_reads_make_no_blob_call_and_no_intent(
    snapshots: SnapshotRegistry, stores: Stores, blob_calls: list[str]
) -> None:
    g = complete(snapshots, "app", {"state": SMALL, "empty": b""})
    got = snapshots.get("app", g, include_checkpoints=True)
    assert got.payloads == {("q1", "state"): SMALL, ("q1", "empty"): b""}
    assert read(snapshots, "app", g, "state") == SMALL and read(snapshots, "app", g, "empty") == b""
    assert blob_calls == []
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()
    node = stores.metadata.get(task_path("app", g, "q1"))
    assert node is not None and load(node.data, "task report", 2)["version"] == 2


def test_a_report_mixes_inline_and_blob_store_checkpoints(
    snapshots: SnapshotRegistry, stores: Stores, blob_calls: list[str]
) -> None:
    g = complete(snapshots, "app", {"small": SMALL, "large": LARGE})
    # The large one only (the file store's put streams).
    assert set(blob_calls) <= {"put", "put_stream"} and len(objects(stores.blobs, "app")) == 1
    [key] = objects(stores.blobs, "app")
    got = snapshots.get("app", g, include_checkpoints=True)
    assert got.payloads == {("q1", "small"): SMALL, ("q1", "large"): LARGE}
    assert read(snapshots, "app", g, "small") == SMALL and read(snapshots, "app", g, "large") == LARGE
    # The same report again is idempotent and stores nothing more.
    again = snapshots.report("app", g, "q1", OFFSETS, {"small": SMALL, "large": LARGE})
    assert again.tasks == got.snapshot.tasks
    assert objects(stores.blobs, "app") == [key]


def test_a_mixed_report_whose_reply_was_lost_keeps_its_blob_store_payload(
    snapshots: SnapshotRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = snapshots.create("app", ["q1"], 0, 0, {}).record.generation
    real = stores.metadata.transaction

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real(ops)
        if any(op.path == task_path("app", g, "q1") for op in ops):
            raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    reported = snapshots.report("app", g, "q1", OFFSETS, {"small": SMALL, "large": LARGE})
    monkeypatch.undo()
    assert reported.record.state is State.COMPLETED
    assert len(objects(stores.blobs, "app")) == 1  # the landed commit's object, kept
    got = snapshots.get("app", g, include_checkpoints=True)
    assert got.payloads == {("q1", "small"): SMALL, ("q1", "large"): LARGE}


def test_a_report_too_large_with_its_checkpoints_inline_puts_them_in_the_blob_store(
    stores: Stores, clock: ManualClock
) -> None:
    """Inlining never refuses a report that fits with its checkpoints in the blob store."""
    small_budget = SnapshotPolicy(
        max_request_bytes=1_048_575 // 32 + 16 * 1024, inline_checkpoint_max_bytes=INLINE_MAX
    )
    snapshots = SnapshotRegistry(
        stores.metadata, stores.blobs, clock, small_budget, CoordinatorMetrics(new_registry())
    )
    checkpoints = {f"store-{i:02d}": bytes([i]) * INLINE_MAX for i in range(16)}  # ~87 KB as base64
    g = complete(snapshots, "app", checkpoints)
    assert len(objects(stores.blobs, "app")) == 16
    got = snapshots.get("app", g, include_checkpoints=True)
    assert got.payloads == {("q1", s): p for s, p in checkpoints.items()}


def test_reports_of_the_earlier_format_stay_readable_beside_inline_ones(
    snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock
) -> None:
    earlier = registry(stores, clock, EARLIER)
    g1 = complete(earlier, "app", {"state": b"old"})
    node = stores.metadata.get(task_path("app", g1, "q1"))
    assert node is not None and load(node.data, "task report", 1)["version"] == 1  # what old releases read
    g2 = complete(snapshots, "app", {"state": b"new"})
    assert read(snapshots, "app", g1, "state") == b"old" and read(snapshots, "app", g2, "state") == b"new"
    assert snapshots.get("app", g1, include_checkpoints=True).payloads == {("q1", "state"): b"old"}


def test_an_inline_report_is_refused_clearly_by_a_reader_of_the_earlier_format(
    snapshots: SnapshotRegistry, stores: Stores
) -> None:
    """Releases before inline checkpoints decode with ``load(data, "task report", 1)``."""
    g = complete(snapshots, "app", {"state": b"x"})
    node = stores.metadata.get(task_path("app", g, "q1"))
    assert node is not None
    newer = r"format version 2, newer than this snapcoord reads \(1\): upgrade"
    with pytest.raises(CorruptRecord, match=newer):
        load(node.data, "task report", 1)


def test_retention_on_a_mix_of_inline_and_blob_store_snapshots_keeps_what_it_must(
    snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock
) -> None:
    """Data loss check: retention, the orphan sweep and the intent sweep, on snapshots of both
    kinds, delete only the snapshots past keep-last and never an object a kept report references."""
    earlier = registry(stores, clock, EARLIER)
    gens = [
        complete(earlier, "app", {"state": b"g1"}),  # blob store, earlier format
        complete(snapshots, "app", {"state": b"g2"}),  # inline
        complete(snapshots, "app", {"state": LARGE}),  # blob store, this format
        complete(earlier, "app", {"state": b"g4"}),  # blob store, earlier format
        complete(snapshots, "app", {"state": b"g5", "big": LARGE}),  # both
    ]
    clock.advance(1_000)
    assert snapshots.apply_retention(100) == 3  # keep-last 2: 4 and 5 stay
    assert [s.record.generation for s in snapshots.list_page("app", 100, "")[0]] == [5, 4]
    kept = objects(stores.blobs, "app")
    assert {k.split("/")[2] for k in kept} == {"4", "5"} and len(kept) == 2

    clock.advance(2 * HOUR_MS)
    stores.blobs.put("snapshots/app/9/q1/0123456789abcdef0123456789abcdef", b"left by a crash")
    assert snapshots.sweep_orphans(HOUR_MS, 100) == 1
    snapshots.sweep_intents(HOUR_MS, 100)
    assert objects(stores.blobs, "app") == kept
    assert read(snapshots, "app", gens[3], "state") == b"g4"
    assert (
        read(snapshots, "app", gens[4], "state") == b"g5" and read(snapshots, "app", gens[4], "big") == LARGE
    )
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()


def test_a_pinned_inline_snapshot_is_never_deleted(
    snapshots: SnapshotRegistry, stores: Stores, clock: ManualClock
) -> None:
    for i in range(4):
        complete(snapshots, "app", {"state": bytes([i])})
    stores.metadata.create(
        pin_path("app", 1), encode_pins({"restore-job": clock.now_ms() + 100 * HOUR_MS}), make_parents=True
    )
    clock.advance(48 * HOUR_MS)  # past the TTL too
    snapshots.apply_retention(100)
    assert read(snapshots, "app", 1, "state") == bytes([0])  # pinned: kept, payload and all
    # 2 and 3 went (past the TTL, not the newest completed); 4 is the newest, 1 is pinned.
    assert [s.record.generation for s in snapshots.list_page("app", 100, "")[0]] == [4, 1]
