"""The stored backlog formats are pinned: today's writer produces exactly the golden bytes, and every
golden file (each format version ever written) stays readable. Also the pure backlog rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapcoord.coordinator.domain.backlog import (
    BacklogPolicy,
    Boundaries,
    JobRecord,
    Positions,
    ShardProgress,
    apply_positions,
    boundaries_digest,
    carry_progress,
    empty_shard,
    grow,
    is_finished,
    job_of_object,
    remaining,
    validate_mark,
    validate_report,
)
from snapcoord.coordinator.domain.backlog_codec import (
    decode_boundaries,
    decode_job_record,
    decode_shard,
    encode_boundaries,
    encode_job_record,
    encode_shard,
)
from snapcoord.coordinator.domain.offsets import Offset, validate_offsets
from snapcoord.coordinator.errors import CorruptRecord, InvalidArgument

GOLDEN = Path(__file__).parent / "golden"
MARK = "0f8e7a6b5c4d4e3f9a1b2c3d4e5f6a7b"
RECORD = JobRecord("orders-job", MARK, 5, 1024, 1_700_000_000_000)
BOUNDARIES = Boundaries(
    "orders-job",
    MARK,
    (
        Offset("clicks", 0, -1),
        Offset("clicks", 3, 17),
        Offset("orders", 0, 42),
        Offset("orders", 1, 0),
        Offset("orders", 2, 9_000_000_000),
    ),
)
SHARD = ShardProgress((7, None, 42, None, None), {2: "a1b2c3d4e5f60718"})


def test_job_record_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "backlog_job_record_v1.json").read_bytes()
    assert encode_job_record(RECORD) == golden
    assert decode_job_record(golden) == RECORD
    assert RECORD.object_key == f"backlog/orders-job/{MARK}.json"


def test_job_record_v1_with_the_boundaries_digest_is_pinned() -> None:
    """The digest is an optional field of version 1: a record without it (above) reads as before,
    one with it carries the SHA-256 of the boundaries object, and a malformed one is refused."""
    golden = (GOLDEN / "backlog_job_record_v1_digest.json").read_bytes()
    boundaries = (GOLDEN / "backlog_boundaries_v1.json").read_bytes()
    record = JobRecord("orders-job", MARK, 5, 1024, 1_700_000_000_000, boundaries_digest(boundaries))
    assert encode_job_record(record) == golden
    assert decode_job_record(golden) == record
    for bad in ('"XYZ"', '"' + "0" * 63 + '"', '"' + "A" * 64 + '"'):
        edited = golden.replace(f'"{record.boundaries_digest}"'.encode(), bad.encode())
        with pytest.raises(CorruptRecord, match="malformed boundaries_sha256"):
            decode_job_record(edited)


def test_a_grown_mark_keeps_each_first_boundary_and_carries_positions_and_tags() -> None:
    old = Boundaries("j", "m1", (Offset("b", 0, 10), Offset("b", 1, 10), Offset("d", 0, 10)))
    shards = {0: ShardProgress((10, 4), {0: "tag-b0"}), 1: ShardProgress((None,), {})}
    requested = [Offset("b", 0, 99), Offset("a", 0, 5), Offset("c", 3, 7), Offset("d", 0, 1)]
    growth = grow(old, requested, "m2")
    assert growth is not None
    assert growth.added == (Offset("a", 0, 5), Offset("c", 3, 7))
    assert growth.boundaries == Boundaries(
        "j",
        "m2",
        (Offset("a", 0, 5), Offset("b", 0, 10), Offset("b", 1, 10), Offset("c", 3, 7), Offset("d", 0, 10)),
    )
    carried = carry_progress(old, shards, 2, growth.boundaries, 2)
    # a/0 | b/0 (10, tagged), b/1 (4) | c/3, d/0: every index moved, across shards.
    assert carried == (
        ShardProgress((None, 10), {1: "tag-b0"}),
        ShardProgress((4, None), {}),
        ShardProgress((None,), {}),
    )
    assert grow(old, [Offset("d", 0, 3), Offset("b", 1, 1)], "m3") is None


def test_boundaries_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "backlog_boundaries_v1.json").read_bytes()
    assert encode_boundaries(BOUNDARIES) == golden
    decoded = decode_boundaries(golden)
    assert decoded == BOUNDARIES
    assert decoded.index_of("orders", 1) == 3 and decoded.index_of("orders", 9) is None


def test_shard_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "backlog_shard_v1.json").read_bytes()
    assert encode_shard(SHARD) == golden  # trailing partitions without a position are left out
    assert decode_shard(golden, 5) == SHARD


def test_shards_round_trip_with_many_tags() -> None:
    # Tags under keys 4 and 10 order differently as text than as numbers: the bytes stay canonical.
    shard = ShardProgress(
        tuple(None if i % 3 == 0 else 10**12 + i for i in range(1024)),
        {i: f"{i:016x}" for i in range(1, 1024, 3)},
    )
    data = encode_shard(shard)
    assert decode_shard(data, 1024) == shard
    assert encode_shard(decode_shard(data, 1024)) == data
    assert data.index(b'"4":') > data.index(b'"10":')
    # Whatever order the tags were added in.
    backwards = ShardProgress(shard.positions, dict(reversed(list(shard.finished_by.items()))))
    assert encode_shard(backwards) == data
    assert decode_shard(encode_shard(empty_shard(3)), 3) == empty_shard(3)


@pytest.mark.parametrize(
    ("data", "positions"),
    [
        # Not what this coordinator writes, but readable as before: numbers convert to ints.
        (b'{"version":1,"positions":[7,null,42.0],"finished_by":{}}', (7, None, 42)),
        (b'{"version":1,"positions":[true,3],"finished_by":{}}', (1, 3)),
    ],
)
def test_shard_positions_that_are_not_plain_ints_still_decode_to_ints(
    data: bytes, positions: tuple[int | None, ...]
) -> None:
    decoded = decode_shard(data, len(positions))
    assert decoded.positions == positions
    assert all(type(p) is int for p in decoded.positions if p is not None)


def test_version_1_stays_readable_with_fields_added_later() -> None:
    data = b'{"version":1,"positions":[1],"finished_by":{},"compacted":true}'
    assert decode_shard(data, 2) == ShardProgress((1, None), {})


@pytest.mark.parametrize(
    ("decode", "data", "message"),
    [
        (
            decode_job_record,
            b'{"version":2,"job_id":"j"}',
            "format version 2, newer than this snapcoord reads",
        ),
        (decode_job_record, b'{"version":1,"job_id":"j"}', "malformed"),
        (
            decode_job_record,
            b'{"version":1,"job_id":"j","mark_id":"m","partition_count":0,"shard_size":4,"marked_at_ms":1}',
            "has no partitions",
        ),
        (decode_boundaries, b"not json", "not JSON"),
        (
            decode_boundaries,
            b'{"version":1,"job_id":"j","mark_id":"m","streams":[{"stream":"a","partitions":[0,1],"boundaries":[5]}]}',
            "2 partitions, 1 boundaries",
        ),
        (
            decode_boundaries,
            b'{"version":1,"job_id":"j","mark_id":"m","streams":[{"stream":"a","partitions":[1,0],"boundaries":[5,6]}]}',
            r"not in \(stream, partition\) order",
        ),
        (
            lambda d: decode_shard(d, 2),
            b'{"version":1,"positions":[1,2,3],"finished_by":{}}',
            "more than its 2",
        ),
        (
            lambda d: decode_shard(d, 2),
            b'{"version":1,"positions":[],"finished_by":{"5":"x"}}',
            "more than its 2",
        ),
        (lambda d: decode_shard(d, 2), b'{"positions":[]}', "no version field"),
        (lambda d: decode_shard(d, 2), b'{"version":1,"positions":["x"],"finished_by":{}}', "malformed"),
        (lambda d: decode_shard(d, 2), b'{"version":1,"positions":5,"finished_by":{}}', "malformed"),
    ],
)
def test_unreadable_documents_fail_loudly(decode: object, data: bytes, message: str) -> None:
    assert callable(decode)
    with pytest.raises(CorruptRecord, match=message):
        decode(data)


# --- the rules ------------------------------------------------------------------------------------


def test_finished_means_caught_up_or_nothing_to_catch_up() -> None:
    assert is_finished(0, None) and is_finished(-1, None)  # empty / no data: finished at once
    assert not is_finished(10, None) and not is_finished(10, 9)
    assert is_finished(10, 10) and is_finished(10, 11)


def test_apply_positions_moves_forward_only_and_tags_what_it_finishes() -> None:
    boundaries = [10, 10, 0]
    shard = empty_shard(3)
    assert remaining(shard, boundaries) == 2
    first = apply_positions(shard, boundaries, {0: 10, 1: 5, 2: 3}, "r1")
    assert first == ShardProgress((10, 5, 3), {0: "r1"})  # partition 2 was finished by the mark
    assert remaining(first, boundaries) == 1
    assert apply_positions(first, boundaries, {0: 9, 1: 5}, "r2") is None  # late or repeated: no write
    second = apply_positions(first, boundaries, {0: 20, 1: 12}, "r2")
    assert second == ShardProgress((20, 12, 3), {0: "r1", 1: "r2"})  # a tag is never replaced
    assert remaining(second, boundaries) == 0


def test_positions_are_columns_of_the_offsets_in_request_order() -> None:
    items = (Offset("b", 1, 5), Offset("a", 2, -1))
    positions = Positions.of(items)
    assert (positions.streams, positions.partitions, positions.offsets) == (("b", "a"), (1, 2), (5, -1))
    assert len(positions) == 2 and positions.items() == items
    assert validate_report("j", positions, BacklogPolicy()) is positions


@pytest.mark.parametrize(
    "items",
    [
        [Offset("a", 0, 1), Offset("a", 0, 2)],  # a partition twice
        [Offset("a", 0, 1), Offset("b", 0, 2), Offset("a", 0, 3)],
        [Offset("a", 0, 1), Offset("a", -1, 2)],
        [Offset("a", 0, 1), Offset("a", 2**31, 2)],
        [Offset("a", 0, 1), Offset("a", 1, -2)],
        [Offset("a", 0, 1), Offset("a b", 1, 2)],
        [Offset("a", 0, 1), Offset("", 1, 2)],
        [Offset("a", 0, 1), Offset("..", 1, 2)],
        [Offset("a", 0, 1), Offset("x" * 201, 1, 2)],
    ],
)
def test_a_bad_report_names_its_first_bad_item_like_every_list_of_offsets(items: list[Offset]) -> None:
    with pytest.raises(InvalidArgument) as expected:
        validate_offsets(items, field="positions", max_count=10)
    with pytest.raises(InvalidArgument) as refused:
        validate_report("j", Positions.of(items), BacklogPolicy(max_partitions=10))
    assert str(refused.value) == str(expected.value)


def test_reported_positions_by_shard_leave_out_what_the_mark_does_not_name() -> None:
    marked = Boundaries("j", MARK, tuple(Offset("a", p, 10) for p in range(5)))
    reported = Positions.of([Offset("a", 4, 7), Offset("b", 0, 1), Offset("a", 1, 3), Offset("a", 9, 2)])
    assert marked.by_shard(reported, 2) == {2: {0: 7}, 0: {1: 3}}
    assert marked.by_shard(reported, 1024) == {0: {4: 7, 1: 3}}  # one shard
    assert marked.by_shard(Positions.of([Offset("b", 0, 1)]), 1024) == {}
    assert marked.values(range(3, 5)) == (10, 10)


def test_marks_are_sorted_and_shards_span_consecutive_indices() -> None:
    items = validate_mark("j", [Offset("b", 1, 5), Offset("a", 2, 5), Offset("b", 0, 5)], BacklogPolicy())
    assert [(o.stream, o.partition) for o in items] == [("a", 2), ("b", 0), ("b", 1)]
    record = JobRecord("j", MARK, 2049, 1024, 0)
    assert record.shard_count == 3
    assert record.shard_span(2) == range(2048, 2049)


def test_job_of_object() -> None:
    assert job_of_object(f"backlog/orders-job/{MARK}.json") == "orders-job"
    assert job_of_object("backlog/not-ours.txt") is None
    assert job_of_object(f"producers/p/{MARK}.json") is None
