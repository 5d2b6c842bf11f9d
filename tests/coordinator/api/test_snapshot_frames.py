"""Snapshot responses with a memoised task set are the bytes protobuf writes for the same message,
and parse back to it: with labels, reports, payloads, at the memo's threshold and after it."""

from __future__ import annotations

import pytest

from snapcoord.coordinator.api.chunk_frames import serialize_chunk
from snapcoord.coordinator.api.convert import snapshot_to_pb
from snapcoord.coordinator.api.snapshot_frames import MEMO_MIN_TASKS, encode_snapshot
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import CheckpointRef, Snapshot, SnapshotRecord, State, TaskReport
from snapcoord.v1 import snapshot_pb2


def snapshot(tasks: int, *, labels: tuple[tuple[str, str], ...] = (), reports: int = 0) -> Snapshot:
    task_ids = tuple(f"task-{i}" for i in range(tasks))
    record = SnapshotRecord(
        "app", 7, State.COMPLETED, task_ids, tasks, 1_000, 2_000, 2_000, 9_000, 60_000, labels, ""
    )
    done = tuple(
        TaskReport(
            task_ids[i],
            (Offset("events", i, 10 + i),),
            (CheckpointRef("state", f"snapshots/app/7/{task_ids[i]}/u", 3, "0" * 64),),
            "d",
        )
        for i in range(reports)
    )
    return Snapshot(record, done)


@pytest.mark.parametrize("tasks", [1, MEMO_MIN_TASKS - 1, MEMO_MIN_TASKS, 2_000])
def test_the_encoding_is_protobufs_own(tasks: int) -> None:
    item = snapshot(tasks, reports=min(tasks, 3))
    encoded = serialize_chunk(encode_snapshot(item))
    assert encoded == snapshot_to_pb(item).SerializeToString()
    assert serialize_chunk(encode_snapshot(item)) == encoded  # again, from the memo


def test_labels_reports_and_payloads_parse_back() -> None:
    item = snapshot(500, labels=(("a", "1"), ("trigger", "manual")), reports=2)
    payloads = {("task-0", "state"): b"abc", ("task-1", "state"): b"xyz"}
    encoded = encode_snapshot(item, payloads)
    assert isinstance(encoded, bytes)
    assert snapshot_pb2.Snapshot.FromString(encoded) == snapshot_to_pb(item, payloads)


def test_two_task_sets_do_not_mix() -> None:
    first, second = snapshot(100), snapshot(101)
    for item in (first, second, first):
        parsed = snapshot_pb2.Snapshot.FromString(serialize_chunk(encode_snapshot(item)))
        assert tuple(parsed.task_ids) == item.record.task_ids
