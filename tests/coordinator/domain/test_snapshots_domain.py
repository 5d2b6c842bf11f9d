"""Pure rules of generation snapshots: retention choices, report fingerprints, stored formats."""

from __future__ import annotations

from pathlib import Path

from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import (
    decode_snapshot,
    decode_task_report,
    encode_snapshot,
    encode_task_report,
)
from snapcoord.coordinator.domain.snapshots import (
    CheckpointRef,
    Retained,
    RetentionPolicy,
    SnapshotRecord,
    State,
    TaskReport,
    report_digest,
    retention_victims,
)

GOLDEN = Path(__file__).parent / "golden"
C, A, R = State.COMPLETED, State.ABORTED, State.CREATED


def test_keep_last_n_completed_and_never_the_newest_completed() -> None:
    items = [Retained(g, C, 1000 + g, 0) for g in range(1, 6)]
    items += [Retained(6, A, 2000, 0), Retained(7, R, 0, 0)]
    keep_two = RetentionPolicy(2, 10**9)
    assert retention_victims(items, keep_two, now_ms=3000) == [1, 2, 3]
    everything_old = RetentionPolicy(10, 1)
    assert retention_victims(items, everything_old, now_ms=10**6) == [1, 2, 3, 4, 6]  # 5: newest completed
    assert retention_victims(items, everything_old, now_ms=10**6, is_pinned=[1, 6]) == [2, 3, 4]


def test_a_snapshots_own_ttl_wins_over_the_apps() -> None:
    items = [Retained(1, C, 1000, 10), Retained(2, C, 1000, 0), Retained(3, C, 1000, 0)]
    assert retention_victims(items, RetentionPolicy(10, 5000), now_ms=1010) == [1]


def test_report_digest_ignores_order_but_not_content() -> None:
    a = report_digest([Offset("s", 0, 1), Offset("s", 1, 2)], {"x": b"1", "y": b"2"})
    b = report_digest([Offset("s", 1, 2), Offset("s", 0, 1)], {"y": b"2", "x": b"1"})
    assert a == b
    assert a != report_digest([Offset("s", 0, 1), Offset("s", 1, 3)], {"x": b"1", "y": b"2"})
    assert a != report_digest([Offset("s", 0, 1), Offset("s", 1, 2)], {"x": b"1", "y": b"3"})


RECORD = SnapshotRecord(
    app_id="clickstream",
    generation=7,
    state=State.COMPLETED,
    task_ids=("enrich", "sessions"),
    reported=2,
    created_at_ms=1_700_000_000_000,
    completed_at_ms=1_700_000_060_000,
    ended_at_ms=1_700_000_060_000,
    deadline_ms=1_700_000_600_000,
    ttl_ms=0,
    labels=(("trigger", "hourly"),),
    abort_reason="",
)
REPORT = TaskReport(
    task_id="sessions",
    committed_offsets=(Offset("events", 0, 1200), Offset("events", 1, -1)),
    checkpoints=(CheckpointRef("session-store", "snapshots/clickstream/7/sessions/00ff", 3, "ab" * 32),),
    digest="cd" * 32,
)


def test_snapshot_record_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "snapshot_record_v1.json").read_bytes()
    assert encode_snapshot(RECORD) == golden
    assert decode_snapshot(golden) == RECORD


def test_task_report_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "task_report_v1.json").read_bytes()
    assert encode_task_report(REPORT) == golden
    assert decode_task_report(golden) == REPORT
