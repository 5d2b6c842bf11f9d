"""Pure rules of generation snapshots: retention choices, report fingerprints, stored formats."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import (
    KEY_PREFIX_BYTES,
    decode_reported,
    decode_snapshot,
    decode_task_report,
    encode_reported,
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
from snapcoord.coordinator.errors import CorruptRecord

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


INLINE_REPORT = TaskReport(
    task_id="sessions",
    committed_offsets=(Offset("events", 0, 1200),),
    checkpoints=(
        CheckpointRef("big-store", "snapshots/clickstream/7/sessions/00ff", 3, "ab" * 32),
        CheckpointRef("session-store", "", 5, "ef" * 32, inline=b"state"),
    ),
    digest="cd" * 32,
)


def test_task_report_v2_with_an_inline_checkpoint_bytes_are_pinned() -> None:
    golden = (GOLDEN / "task_report_v2.json").read_bytes()
    assert encode_task_report(INLINE_REPORT) == golden
    assert decode_task_report(golden) == INLINE_REPORT
    assert INLINE_REPORT.object_keys == ("snapshots/clickstream/7/sessions/00ff",)


@pytest.mark.parametrize(
    "data",
    [
        b'{"version":2,"task_id":"t","digest":"d","committed_offsets":[],"checkpoints":{"s":{"data":"!!","size":1,"sha256":"x"}}}',
        b'{"version":2,"task_id":"t","digest":"d","committed_offsets":[],"checkpoints":{"s":{"data":"YQ==","size":2,"sha256":"x"}}}',
    ],
)
def test_a_malformed_inline_checkpoint_fails_loudly(data: bytes) -> None:
    with pytest.raises(CorruptRecord, match="stored task report is malformed"):
        decode_task_report(data)


def plain_dump(record: SnapshotRecord) -> bytes:
    """The header as one ``json.dumps`` of the whole document (the stored format's definition)."""
    doc = {
        "version": 1,
        "app_id": record.app_id,
        "generation": record.generation,
        "state": record.state.value,
        "task_ids": list(record.task_ids),
        "reported": record.reported,
        "created_at_ms": record.created_at_ms,
        "completed_at_ms": record.completed_at_ms,
        "ended_at_ms": record.ended_at_ms,
        "deadline_ms": record.deadline_ms,
        "ttl_ms": record.ttl_ms,
        "labels": dict(record.labels),
        "abort_reason": record.abort_reason,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


LARGE = replace(
    RECORD,
    state=State.CREATED,
    task_ids=tuple(f'task-{i}-\u00e9"q' for i in range(1000)),
    reported=17,
    # Label keys that sort around and equal the top-level keys the encoder splices between.
    labels=(("task_ids", "x"), ("ttl_ms", "1"), ("version", '","task_ids":[')),
    abort_reason='"ttl_ms":2,"version":1}',
)


def test_large_headers_are_encoded_byte_for_byte_as_one_json_document() -> None:
    for record in (RECORD, LARGE, replace(LARGE, task_ids=()), replace(LARGE, labels=())):
        assert encode_snapshot(record) == plain_dump(record)
        assert decode_snapshot(plain_dump(record)) == record
    # Again, with the task set's array memoised, and counters moved on as a report moves them.
    for reported in range(18, 25):
        record = replace(LARGE, reported=reported)
        assert encode_snapshot(record) == plain_dump(record)


def test_a_memoised_header_decodes_to_what_its_bytes_say() -> None:
    """Decoding bytes written or read before returns the record they encode; other bytes (one
    counter apart, the same task set) decode afresh, and malformed ones still fail."""
    written = encode_snapshot(replace(LARGE, reported=30))
    assert decode_snapshot(written) == replace(LARGE, reported=30)
    assert decode_snapshot(bytes(written)) == replace(LARGE, reported=30)  # equal bytes, new object
    other = plain_dump(replace(LARGE, reported=31, state=State.ABORTED))
    assert decode_snapshot(other) == replace(LARGE, reported=31, state=State.ABORTED)
    assert decode_snapshot(other) == replace(LARGE, reported=31, state=State.ABORTED)
    with pytest.raises(CorruptRecord, match="newer"):
        decode_snapshot(written.replace(b'"version":1}', b'"version":9}'))
    # An unsorted label order is stored sorted: what is read back is the sorted record.
    unsorted = replace(LARGE, labels=(("z", "1"), ("a", "2")))
    assert decode_snapshot(encode_snapshot(unsorted)) == replace(LARGE, labels=(("a", "2"), ("z", "1")))


def test_headers_sharing_a_memo_key_decode_to_their_own_records() -> None:
    """The memo keys a header by its length and start: labels long enough push the counters past
    that start, so two versions of one header share a key. Each still decodes to its own record,
    whichever the memo holds."""
    long_labels = replace(LARGE, labels=(("a", "x" * (2 * KEY_PREFIX_BYTES)),))
    at_40, at_41 = replace(long_labels, reported=40), replace(long_labels, reported=41, state=State.ABORTED)
    first, second = encode_snapshot(at_40), plain_dump(at_41)  # written here; read from elsewhere
    assert (len(first), first[:KEY_PREFIX_BYTES]) == (len(second), second[:KEY_PREFIX_BYTES])
    for data, record in ((first, at_40), (second, at_41), (bytes(first), at_40), (second, at_41)):
        assert decode_snapshot(data) == record


def test_small_headers_are_memoised_and_still_decode_to_their_own_records() -> None:
    small = replace(RECORD, state=State.CREATED, reported=1)
    written = encode_snapshot(small)
    assert len(written) < 2048 and decode_snapshot(bytes(written)) == small
    for reported in (2, 3, 2, 1):  # the same length, one counter apart: each its own record
        record = replace(small, reported=reported)
        assert decode_snapshot(plain_dump(record)) == record
        assert decode_snapshot(encode_snapshot(record)) == record


def test_the_report_counter_round_trips_and_reads_the_empty_node_as_zero() -> None:
    """CreateSnapshot makes the counter node empty; servers before the counter leave it so."""
    assert decode_reported(b"") == 0
    assert [decode_reported(encode_reported(n)) for n in (0, 1, 100_000)] == [0, 1, 100_000]
    assert encode_reported(3) == b'{"reported":3,"version":1}'


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"reported":-1,"version":1}', "negative"),
        (b'{"reported":"x","version":1}', "malformed"),
        (b'{"version":1}', "malformed"),
        (b'{"reported":1,"version":2}', "newer"),
        (b"not json", "not JSON"),
    ],
)
def test_a_damaged_report_counter_is_a_corrupt_record(data: bytes, match: str) -> None:
    with pytest.raises(CorruptRecord, match=match):
        decode_reported(data)
