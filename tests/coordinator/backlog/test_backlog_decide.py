"""Table tests of ``backlog.decide``: read results + request in, Done/Commit/More with ops out. No store."""

from __future__ import annotations

import pytest

from snapcoord.coordinator.backlog import decide
from snapcoord.coordinator.backlog.decide import (
    ChunkRequest,
    Marked,
    MarkGone,
    MarkRequest,
    StoredShard,
    Written,
)
from snapcoord.coordinator.backlog.layout import JOBS
from snapcoord.coordinator.domain.backlog import (
    Boundaries,
    JobRecord,
    ShardProgress,
    boundaries_digest,
    boundaries_key,
    empty_shard,
    remaining,
)
from snapcoord.coordinator.domain.backlog_codec import encode_job_record, encode_shard
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.errors import CorruptRecord, NotFound
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.decision import Commit, Decision, Done, More, ReadChildren, Reads
from snapcoord.coordinator.storage.metadata import Create, Delete, Node, SetData

NOW = 6_000_000
JOB = f"{JOBS}/job"
ITEMS = (Offset("o", 0, 10), Offset("o", 1, 0), Offset("o", 2, 5))  # o/1 is finished at once
OURS = Boundaries("job", "new", ITEMS)
MARK = MarkRequest(OURS, b"boundaries", reset=False, shard_size=2)
RECORD = JobRecord("job", "new", 3, 2, NOW, boundaries_digest(b"boundaries"))
OLD = JobRecord("job", "old", 1, 2, NOW - 10)


def node(data: bytes, version: int = 0) -> Node:
    return Node(data, version, 0, 0)


def job(record: JobRecord | None, version: int = 0, children: tuple[str, ...] | None = None) -> Reads:
    lists = {JOB: children} if children is not None else {}
    return Reads({JOB: node(encode_job_record(record), version) if record is not None else None}, lists)


NEW_NODES = [
    Create(f"{JOB}/s-new-0", encode_shard(empty_shard(0))),
    Create(f"{JOB}/r-new-0-1", b""),  # o/0 unfinished; o/1's boundary is 0: finished already
    Create(f"{JOB}/s-new-1", encode_shard(empty_shard(0))),
    Create(f"{JOB}/r-new-1-1", b""),
]
FIRST_MARK = Commit(
    [Create(JOB, encode_job_record(RECORD)), *NEW_NODES],
    Marked("marked", RECORD),
    uploads={boundaries_key("job", "new"): b"boundaries"},
    ensure=(JOBS,),
)
#: The intent a commit that unreferences the old mark's boundaries makes for them (this minute's
#: bucket, named after the mark), withdrawn once they are deleted.
DOOMED = f"{intents.ROOT}/{NOW // 60_000}/old"
DOOM = Create(
    DOOMED,
    b'{"created_ms":%d,"keys":["%s"],"swept":false,"version":1}'
    % (NOW, boundaries_key("job", "old").encode()),
)
RESET = Commit(
    [SetData(JOB, encode_job_record(RECORD), 4), Delete(f"{JOB}/s-old-0", None), *NEW_NODES, DOOM],
    Marked("reset", RECORD, "old"),
    uploads={boundaries_key("job", "new"): b"boundaries"},
    cleanup=(boundaries_key("job", "old"),),
    withdraw=(DOOMED,),
    buckets=((intents.ROOT, NOW),),
    ensure=(JOBS,),
)
MARK_CASES: list[tuple[str, MarkRequest, Reads, Commit[Marked] | None, Decision[Marked]]] = [
    ("a first mark: record, shards and markers in one commit", MARK, job(None), None, FIRST_MARK),
    ("a mark exists: return it", MARK, job(OLD, 4), None, Done(Marked("existing", OLD))),
    (
        "reset: list the old mark's nodes first",
        MarkRequest(OURS, b"boundaries", True, 2),
        job(OLD, 4),
        None,
        More([ReadChildren(JOB)]),
    ),
    (
        "reset: replace the record by version, delete the old nodes, then the old boundaries",
        MarkRequest(OURS, b"boundaries", True, 2),
        job(OLD, 4, ("s-old-0",)),
        None,
        RESET,
    ),
    (
        "a mark in doubt that landed: ours, keeping the upload",
        MARK,
        job(RECORD),
        FIRST_MARK,
        Done(Marked("marked", RECORD), keep=frozenset({boundaries_key("job", "new")})),
    ),
]


@pytest.mark.parametrize(
    ("case", "request_", "reads", "pending", "expected"), MARK_CASES, ids=[c[0] for c in MARK_CASES]
)
def test_mark(
    case: str, request_: MarkRequest, reads: Reads, pending: Commit[Marked] | None, expected: Decision[Marked]
) -> None:
    assert decide.mark(request_, reads, pending, NOW) == expected


def test_a_record_under_another_job_id_is_corrupt() -> None:
    with pytest.raises(CorruptRecord, match=r"names job_id .other."):
        decide.mark(MARK, Reads({JOB: node(encode_job_record(JobRecord("other", "m", 1, 2, 0)))}), None, NOW)


CLEARED: Commit[str | None] = Commit(
    [Delete(f"{JOB}/s-old-0", None), Delete(JOB, 4), DOOM],
    "old",
    cleanup=(boundaries_key("job", "old"),),
    withdraw=(DOOMED,),
    buckets=((intents.ROOT, NOW),),
)
CLEAR_CASES: list[tuple[str, Reads, Commit[str | None] | None, Decision[str | None]]] = [
    ("nothing marked", job(None, children=()), None, Done(None)),
    (
        "a mark: its nodes and record by version, then its boundaries",
        job(OLD, 4, ("s-old-0",)),
        None,
        CLEARED,
    ),
    (
        "a clear in doubt that landed",
        job(None, children=()),
        CLEARED,
        Done("old", cleanup=(boundaries_key("job", "old"),), withdraw=(DOOMED,)),
    ),
    ("a clear in doubt that did not land: again", job(OLD, 4, ("s-old-0",)), CLEARED, CLEARED),
]


@pytest.mark.parametrize(
    ("case", "reads", "pending", "expected"), CLEAR_CASES, ids=[c[0] for c in CLEAR_CASES]
)
def test_clear(
    case: str, reads: Reads, pending: Commit[str | None] | None, expected: Decision[str | None]
) -> None:
    assert decide.clear("job", reads, pending, NOW) == expected


def test_marked() -> None:
    assert decide.marked("job", job(OLD), None) == Done(OLD)
    with pytest.raises(NotFound, match="call MarkBacklog first"):
        decide.marked("job", job(None), None)


# --- write_chunk ----------------------------------------------------------------------------------

EMPTY = StoredShard(ShardProgress((None, None)), 3)
LAST = StoredShard(ShardProgress((None,)), 5)


def chunk(
    updates: dict[int, dict[int, int]], known: dict[int, StoredShard], chunk_bytes: int = 500_000
) -> ChunkRequest:
    return ChunkRequest(RECORD, OURS, updates, "rep", tuple(sorted(updates)), known, chunk_bytes)


def test_a_report_finishing_a_partition_renames_its_marker() -> None:
    merged = ShardProgress((10, None), {0: "rep"})
    assert decide.write_chunk(chunk({0: {0: 10}}, {0: EMPTY}), Reads(), None) == Commit(
        [
            SetData(f"{JOB}/s-new-0", encode_shard(merged), 3),
            Delete(f"{JOB}/r-new-0-1", None),  # the last unfinished partition of the shard: no new one
        ],
        Written({0: StoredShard(merged, 4)}, ()),
    )


def test_a_write_counts_the_unfinished_partitions_of_the_shards_it_wrote() -> None:
    # Shard 0 holds o/0 (boundary 10) and o/1 (finished at once); shard 1 holds o/2 (boundary 5).
    decision = decide.write_chunk(chunk({0: {0: 10}, 1: {0: 4}}, {0: EMPTY, 1: LAST}), Reads(), None)
    assert isinstance(decision, Commit)
    assert dict(decision.result.remaining) == {0: 0, 1: 1}
    for shard, count in decision.result.remaining.items():
        progress = decision.result.shards[shard].progress
        assert count == remaining(progress, OURS.values(RECORD.shard_span(shard)))


def test_progress_short_of_the_boundary_keeps_the_marker() -> None:
    merged = ShardProgress((7, None), {})
    assert decide.write_chunk(chunk({0: {0: 7}}, {0: EMPTY}), Reads(), None) == Commit(
        [SetData(f"{JOB}/s-new-0", encode_shard(merged), 3)], Written({0: StoredShard(merged, 4)}, ())
    )


def test_nothing_new_writes_nothing() -> None:
    stored = StoredShard(ShardProgress((10, None), {0: "earlier"}), 3)
    assert decide.write_chunk(chunk({0: {0: 9}}, {0: stored}), Reads(), None) == Done(
        Written({0: stored}, ())
    )


def test_shards_beyond_the_chunk_bound_wait_for_the_next_transaction() -> None:
    decision = decide.write_chunk(
        chunk({0: {0: 7}, 1: {0: 1}}, {0: EMPTY, 1: LAST}, chunk_bytes=1), Reads(), None
    )
    assert isinstance(decision, Commit)
    assert [op.path for op in decision.ops] == [f"{JOB}/s-new-0"]
    assert decision.result.rest == (1,)


def test_after_a_lost_commit_the_reread_shards_decide() -> None:
    # Our earlier write landed (in doubt): the re-read shard carries our tag, so nothing is left.
    landed = ShardProgress((10, None), {0: "rep"})
    reads = Reads({f"{JOB}/s-new-0": node(encode_shard(landed), 4)})
    assert decide.write_chunk(chunk({0: {0: 10}}, {0: EMPTY}), reads, None) == Done(
        Written({0: StoredShard(landed, 4)}, ())
    )
    with pytest.raises(MarkGone):  # reset or cleared meanwhile: its shards are gone
        decide.write_chunk(chunk({0: {0: 10}}, {0: EMPTY}), Reads({f"{JOB}/s-new-0": None}), None)
