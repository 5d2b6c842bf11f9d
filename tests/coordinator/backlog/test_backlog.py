"""Backlog tracking on both backends: the embedded defaults and real ZooKeeper + S3.

Most tests use shards of 4 partitions, so that a handful of partitions spreads over several
shards (and transactions) the way 10,000 do with the production layout; the 10,000-partition test
uses the production layout itself.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from harness.concurrency import run_threads
from harness.faults import LaggingReads, SimulatedCrash, call_while_blob_deletes_fail
from harness.stores import Stores
from snapcoord.coordinator.backlog.layout import JOBS, job_path
from snapcoord.coordinator.backlog.registry import CHUNK_BYTES, BacklogRegistry
from snapcoord.coordinator.domain.backlog import (
    SHARD_SIZE,
    BacklogPolicy,
    BacklogStatus,
    PartitionBacklog,
    Progress,
)
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.errors import CommitOutcomeUnknown, InvalidArgument, NotFound
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MAX_NODE_BYTES, MetadataStore, Op

HOUR_MS = 3_600_000
POLICY = BacklogPolicy(max_partitions=10_000)


def make_registry(
    stores: Stores,
    clock: ManualClock,
    *,
    shard_size: int = 4,
    policy: BacklogPolicy = POLICY,
    chunk_bytes: int = CHUNK_BYTES,
) -> BacklogRegistry:
    metrics = CoordinatorMetrics(new_registry())
    return BacklogRegistry(
        stores.metadata, stores.blobs, clock, policy, metrics, shard_size=shard_size, chunk_bytes=chunk_bytes
    )


@pytest.fixture
def clock() -> ManualClock:
    # Real "now": the orphan sweep compares against object times the blob store sets itself.
    return ManualClock(SystemClock().now_ms())


@pytest.fixture
def backlog(stores: Stores, clock: ManualClock) -> BacklogRegistry:
    return make_registry(stores, clock)


def off(stream: str, partition: int, offset: int) -> Offset:
    return Offset(stream, partition, offset)


def pb(stream: str, partition: int, boundary: int, position: int, finished: bool) -> PartitionBacklog:
    return PartitionBacklog(stream, partition, boundary, position, finished)


def objects(blobs: BlobStore) -> list[str]:
    return [b.key for b in blobs.list("backlog/")]


def job_nodes(metadata: MetadataStore, job_id: str) -> list[str]:
    return metadata.children(f"{JOBS}/{job_id}")


def mark_id_of(metadata: MetadataStore, job_id: str) -> str:
    node = metadata.get(f"{JOBS}/{job_id}")
    assert node is not None
    return str(json.loads(node.data)["mark_id"])


# Five partitions over two shards of 4 (sorted: clicks/0, clicks/1, orders/0, orders/1, orders/2).
BOUNDARIES = (
    off("orders", 0, 100),
    off("orders", 1, 50),
    off("orders", 2, 0),  # empty partition: finished at once
    off("clicks", 0, -1),  # no data: finished at once
    off("clicks", 1, 10),
)


def test_mark_report_finish_lifecycle(backlog: BacklogRegistry, stores: Stores) -> None:
    marked = backlog.mark("job-1", BOUNDARIES, reset=False)
    assert marked == BacklogStatus(
        "job-1",
        processing_backlog=True,
        partitions=(
            pb("clicks", 0, -1, -1, True),
            pb("clicks", 1, 10, -1, False),
            pb("orders", 0, 100, -1, False),
            pb("orders", 1, 50, -1, False),
            pb("orders", 2, 0, -1, True),
        ),
    )
    assert backlog.status("job-1") == marked

    first = backlog.report("job-1", [off("orders", 0, 60), off("orders", 1, 50), off("unmarked", 7, 5)])
    assert first.newly_finished == (off("orders", 1, 50),)
    # A partition the mark does not name is answered, not dropped: the driver learns of it now.
    assert first == Progress(
        "job-1", (off("orders", 1, 50),), processing_backlog=True, unmarked=(off("unmarked", 7, 5),)
    )
    assert backlog.status("job-1").partitions[2:4] == (
        pb("orders", 0, 100, 60, False),
        pb("orders", 1, 50, 50, True),
    )

    # orders/2 was finished by the mark: it is never "newly" finished by a report. The list is in
    # (stream, partition) order, whatever the order of the report.
    second = backlog.report("job-1", [off("orders", 0, 100), off("clicks", 1, 12), off("orders", 2, 3)])
    assert second.newly_finished == (off("clicks", 1, 12), off("orders", 0, 100))
    assert second.processing_backlog is False

    again = backlog.report("job-1", [off("orders", 0, 150), off("orders", 1, 70)])
    assert again.newly_finished == ()
    assert again.processing_backlog is False
    assert backlog.status("job-1") == BacklogStatus(
        "job-1",
        False,
        (
            pb("clicks", 0, -1, -1, True),
            pb("clicks", 1, 10, 12, True),
            pb("orders", 0, 100, 150, True),
            pb("orders", 1, 50, 70, True),
            pb("orders", 2, 0, 3, True),
        ),
        unmarked_partitions=1,  # unmarked/7, counted
    )

    assert backlog.clear("job-1") is True
    with pytest.raises(NotFound, match="no backlog is marked for job_id 'job-1'; call MarkBacklog first"):
        backlog.status("job-1")
    with pytest.raises(NotFound, match="no backlog is marked for job_id 'job-1'"):
        backlog.report("job-1", [off("orders", 0, 1)])
    assert backlog.clear("job-1") is False  # idempotent
    assert stores.metadata.children(JOBS) == []
    assert objects(stores.blobs) == []


def test_a_repeated_mark_returns_the_stored_one(backlog: BacklogRegistry, stores: Stores) -> None:
    backlog.mark("job-1", BOUNDARIES, reset=False)
    backlog.report("job-1", [off("orders", 0, 70)])
    stored = backlog.status("job-1")
    # A restarted driver marks again with the end offsets of *now*: the first mark wins.
    again = backlog.mark("job-1", [off("orders", 0, 900), off("clicks", 1, 5)], reset=False)
    assert again == stored
    assert len(objects(stores.blobs)) == 1  # the repeated mark uploaded nothing that stayed


def test_reset_replaces_the_mark_and_drops_its_progress(backlog: BacklogRegistry, stores: Stores) -> None:
    backlog.mark("job-1", BOUNDARIES, reset=False)
    assert backlog.report("job-1", [off("orders", 0, 120)]).newly_finished == (off("orders", 0, 120),)
    old_mark = mark_id_of(stores.metadata, "job-1")

    reset = backlog.mark("job-1", [off("orders", 0, 200), off("orders", 1, 0)], reset=True)
    assert reset == BacklogStatus(
        "job-1", True, (pb("orders", 0, 200, -1, False), pb("orders", 1, 0, -1, True))
    )
    new_mark = mark_id_of(stores.metadata, "job-1")
    assert new_mark != old_mark
    # Nothing of the old mark is left: not its progress nodes, not its boundaries.
    assert all(new_mark in name and old_mark not in name for name in job_nodes(stores.metadata, "job-1"))
    assert objects(stores.blobs) == [f"backlog/job-1/{new_mark}.json"]

    # Old progress never counts: 150 is behind the new boundary, and reaching it finishes the
    # partition again, for the new mark.
    assert backlog.report("job-1", [off("orders", 0, 150)]).newly_finished == ()
    done = backlog.report("job-1", [off("orders", 0, 200)])
    assert done.newly_finished == (off("orders", 0, 200),)
    assert done.processing_backlog is False


def test_out_of_order_reports_never_move_a_position_back(backlog: BacklogRegistry) -> None:
    backlog.mark("job-1", BOUNDARIES, reset=False)

    def orders_0() -> PartitionBacklog:
        return backlog.status("job-1").partitions[2]

    backlog.report("job-1", [off("orders", 0, 80)])
    late = backlog.report("job-1", [off("orders", 0, 40)])  # an older report arriving late
    assert late == Progress("job-1", (), processing_backlog=True)
    assert orders_0() == pb("orders", 0, 100, 80, False)
    assert backlog.report("job-1", [off("orders", 0, 120)]).newly_finished == (off("orders", 0, 120),)
    later = backlog.report("job-1", [off("orders", 0, 90), off("orders", 1, 10)])
    assert later.newly_finished == ()
    assert orders_0() == pb("orders", 0, 100, 120, True)


def test_bad_input_is_invalid_argument_and_leaves_state_untouched(stores: Stores, clock: ManualClock) -> None:
    backlog = make_registry(stores, clock, policy=BacklogPolicy(max_partitions=3))
    backlog.mark("job-1", [off("orders", 0, 100)], reset=False)
    before = (backlog.status("job-1"), job_nodes(stores.metadata, "job-1"), objects(stores.blobs))
    bad_calls: list[tuple[Callable[[], object], str]] = [
        (lambda: backlog.mark("job/2", BOUNDARIES[:1], False), "job_id 'job/2' contains '/'"),
        (lambda: backlog.mark("..", BOUNDARIES[:1], False), "job_id must not be '..'"),
        (lambda: backlog.mark("job-2", [], False), "boundaries is empty"),
        (
            lambda: backlog.mark("job-2", [off("orders", i, 1) for i in range(4)], False),
            r"boundaries has 4 entries; this coordinator tracks at most 3 partitions per job "
            r"\(--backlog-max-partitions\)",
        ),
        (
            lambda: backlog.mark("job-2", [off("a", 0, 1), off("a", 0, 2)], False),
            r"boundaries\[1\] repeats stream 'a' partition 0 \(first at boundaries\[0\]\)",
        ),
        (lambda: backlog.mark("job-2", [off("a", 0, -2)], False), r"boundaries\[0\]\.offset is -2 for a/0"),
        (lambda: backlog.mark("job-2", [off("a b", 0, 1)], False), r"boundaries\[0\]\.stream 'a b'"),
        # reset=true with bad input must not touch the stored mark either.
        (lambda: backlog.mark("job-1", [off("a", -1, 1)], True), r"boundaries\[0\]\.partition is -1"),
        (lambda: backlog.report("", [off("orders", 0, 1)]), "job_id is required"),
        (lambda: backlog.report("job-1", []), "positions is empty.*GetBacklogStatus reads the status"),
        (
            lambda: backlog.report("job-1", [off("orders", 0, 150), off("orders", 0, 160)]),
            r"positions\[1\] repeats stream 'orders' partition 0",
        ),
        (
            lambda: backlog.report("job-1", [off("orders", 0, 150), off("orders", 1, -5)]),
            r"positions\[1\]\.offset is -5 for orders/1; offsets are 0 or more, or -1 for no data",
        ),
        (
            lambda: backlog.report("job-1", [off("x", i, 1) for i in range(4)]),
            "positions has 4 entries",
        ),
        (
            lambda: backlog.report("job-1", [off("orders", 0, 150)], "r" * 129),
            "report_id is 129 characters long; the limit is 128",
        ),
        (lambda: backlog.report("job-1", [off("orders", 0, 150)], "a b"), "report_id 'a b' contains ' '"),
        (lambda: backlog.status("job:*"), r"job_id 'job:\*' contains '\*'"),
        (lambda: backlog.clear("a" * 201), "job_id is 201 characters long; the limit is 200"),
    ]
    for call, message in bad_calls:
        with pytest.raises(InvalidArgument, match=message):
            call()
    after = (backlog.status("job-1"), job_nodes(stores.metadata, "job-1"), objects(stores.blobs))
    assert after == before
    assert stores.metadata.children(JOBS) == ["job-1"]


def test_newly_finished_is_exactly_once_under_twenty_concurrent_reporters(
    backlog: BacklogRegistry,
) -> None:
    # 40 partitions in 10 shards; reporter i names 10 of them, each named by 5 reporters, some
    # reporters behind the boundary and some past it, so shards see contended flips and no-ops.
    partitions = [(s, p) for s in ("clicks", "orders") for p in range(20)]
    backlog.mark("job-1", [off(s, p, 100) for s, p in partitions], reset=False)

    def named(i: int) -> list[tuple[str, int]]:
        return [partitions[(i * 2 + j) % 40] for j in range(10)]

    results: list[tuple[int, Progress]] = []
    lock = threading.Lock()

    def report(i: int) -> None:
        progress = backlog.report("job-1", [off(s, p, 90 + i) for s, p in named(i)])
        with lock:
            results.append((i, progress))

    run_threads(20, report)
    finished = Counter((o.stream, o.partition) for _, r in results for o in r.newly_finished)
    assert max(finished.values()) == 1, "a partition was reported finished twice"
    status = backlog.status("job-1")
    assert set(finished) == {(p.stream, p.partition) for p in status.partitions if p.finished}
    for p in status.partitions:  # every position is the highest one reported for it
        assert p.position == 90 + max(i for i in range(20) if (p.stream, p.partition) in named(i))
        assert p.finished == (p.position >= 100)
    # Each partition is listed by a report that finished it, with that report's position.
    for i, r in results:
        assert all(o.offset == 90 + i >= 100 for o in r.newly_finished)


def test_concurrent_first_marks_have_one_winner(backlog: BacklogRegistry, stores: Stores) -> None:
    results: list[BacklogStatus] = []
    lock = threading.Lock()

    def mark(i: int) -> None:
        status = backlog.mark("job-1", [off("orders", p, 100 + i) for p in range(6)], reset=False)
        with lock:
            results.append(status)

    run_threads(10, mark)
    assert len(results) == 10 and len(set(results)) == 1  # everyone sees the winner's boundaries
    assert backlog.status("job-1") == results[0]
    assert objects(stores.blobs) == [f"backlog/job-1/{mark_id_of(stores.metadata, 'job-1')}.json"]


def test_a_report_racing_a_reset_lands_on_the_new_mark_only(
    stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporter = make_registry(stores, clock)
    resetter = make_registry(stores, clock)
    reporter.mark("job-1", [off("orders", 0, 100), off("orders", 1, 100)], reset=False)
    real_transaction = stores.metadata.transaction
    raced = False

    def reset_first(ops: Sequence[Op]) -> None:
        nonlocal raced
        if not raced:  # the reporter has read the old mark's shard; a reset commits before it writes
            raced = True
            resetter.mark("job-1", [off("orders", 0, 500), off("orders", 1, 100)], reset=True)
        real_transaction(ops)

    monkeypatch.setattr(stores.metadata, "transaction", reset_first)
    progress = reporter.report("job-1", [off("orders", 0, 120), off("orders", 1, 100)])
    monkeypatch.undo()
    assert raced
    # Applied to the new mark: orders/0 is behind its new boundary, orders/1 finished for it.
    assert progress.newly_finished == (off("orders", 1, 100),)
    assert reporter.status("job-1").partitions == (
        pb("orders", 0, 500, 120, False),
        pb("orders", 1, 100, 100, True),
    )
    new_mark = mark_id_of(stores.metadata, "job-1")
    assert all(new_mark in name for name in job_nodes(stores.metadata, "job-1"))


def test_a_lost_commit_reply_is_settled_by_the_report_tags(
    backlog: BacklogRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog.mark("job-1", BOUNDARIES, reset=False)
    real_transaction = stores.metadata.transaction

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real_transaction(ops)
        raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    progress = backlog.report("job-1", [off("orders", 0, 100), off("orders", 1, 10)])
    # The write landed: the re-read finds our tag on orders/0 and nothing left to write.
    assert progress.newly_finished == (off("orders", 0, 100),)
    marked_again = backlog.mark("job-2", BOUNDARIES, reset=False)  # a mark in doubt is ours too
    monkeypatch.undo()
    assert marked_again.processing_backlog
    assert backlog.report("job-1", [off("orders", 0, 100)]).newly_finished == ()
    assert backlog.status("job-2") == marked_again
    assert len(objects(stores.blobs)) == 2


def test_a_retry_with_the_same_report_id_answers_the_same_newly_finished(
    backlog: BacklogRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost final report: its write landed, its reply never came, and nothing else would tell
    the caller. Sent again with its report_id it lists what it finished, with its own positions,
    even after a later report moved the positions on; a report with another id lists nothing."""
    backlog.mark("job-1", BOUNDARIES, reset=False)
    real_transaction = stores.metadata.transaction

    def applied_then_lost(ops: Sequence[Op]) -> None:
        real_transaction(ops)
        raise ConnectionError("the reply was lost (test)")

    final = [off("orders", 0, 100), off("orders", 1, 50), off("clicks", 1, 10)]
    monkeypatch.setattr(stores.metadata, "transaction", applied_then_lost)
    with pytest.raises(ConnectionError):
        backlog.report("job-1", final, "run-a.batch-9")
    monkeypatch.undo()
    finished = (off("clicks", 1, 10), off("orders", 0, 100), off("orders", 1, 50))
    assert not backlog.status("job-1").processing_backlog  # the write landed
    retry = backlog.report("job-1", final, "run-a.batch-9")
    assert retry == Progress("job-1", finished, processing_backlog=False)
    assert backlog.report("job-1", [off("orders", 0, 180)], "run-a.batch-10").newly_finished == ()
    assert backlog.report("job-1", final, "run-a.batch-9").newly_finished == finished
    assert backlog.report("job-1", final, "other").newly_finished == ()
    assert backlog.report("job-1", final).newly_finished == ()  # no id: a fresh tag
    # The stored tag is a 16-character hash whatever the id's length: shards stay bounded.
    node = stores.metadata.get(f"{JOBS}/job-1/s-{mark_id_of(stores.metadata, 'job-1')}-0")
    assert node is not None
    assert {len(tag) for tag in json.loads(node.data)["finished_by"].values()} == {16}


def test_report_ids_are_scoped_to_a_mark(backlog: BacklogRegistry) -> None:
    """After a reset the same report id finishes the new mark's partitions afresh."""
    backlog.mark("job-1", [off("in", 0, 5)], reset=False)
    assert backlog.report("job-1", [off("in", 0, 5)], "r1").newly_finished == (off("in", 0, 5),)
    backlog.mark("job-1", [off("in", 0, 9)], reset=True)
    assert backlog.status("job-1").processing_backlog
    assert backlog.report("job-1", [off("in", 0, 5)], "r1").newly_finished == ()
    assert backlog.report("job-1", [off("in", 0, 9)], "r1").newly_finished == (off("in", 0, 9),)
    assert not backlog.status("job-1").processing_backlog


def test_any_report_id_the_docs_allow_is_accepted_dots_too(backlog: BacklogRegistry) -> None:
    """docs/api.md: 1-128 characters of [A-Za-z0-9._:-]. A report id is only hashed into a tag, so
    "." and ".." are ids like any other (identifiers that become path segments refuse them)."""
    backlog.mark("job-1", [off("in", 0, 5), off("in", 1, 5)], reset=False)
    assert backlog.report("job-1", [off("in", 0, 5)], ".").newly_finished == (off("in", 0, 5),)
    assert backlog.report("job-1", [off("in", 1, 5)], "..").newly_finished == (off("in", 1, 5),)
    assert backlog.report("job-1", [off("in", 0, 5)], ".").newly_finished == (off("in", 0, 5),)  # its retry
    assert backlog.report("job-1", [off("in", 1, 5)], "...").newly_finished == ()


def test_restart_survival(
    request: pytest.FixtureRequest, stores: Stores, clock: ManualClock, tmp_path: Path
) -> None:
    """A new registry on new store connections (a restarted coordinator) sees the same backlog."""
    first = make_registry(stores, clock)
    first.mark("job-1", BOUNDARIES, reset=False)
    first.report("job-1", [off("orders", 0, 100), off("orders", 1, 20)])
    stored = first.status("job-1")
    with reopened(request, stores, tmp_path) as again:
        second = make_registry(again, clock)
        assert second.status("job-1") == stored  # boundaries read back from the blob store
        assert second.mark("job-1", [off("orders", 0, 1)], reset=False) == stored  # driver restart
        progress = second.report("job-1", [off("orders", 0, 130), off("orders", 1, 50)])
        assert progress.newly_finished == (off("orders", 1, 50),)  # orders/0 was reported before


@contextlib.contextmanager
def reopened(request: pytest.FixtureRequest, stores: Stores, tmp_path: Path) -> Iterator[Stores]:
    """The locations of ``stores`` on new connections. The embedded store allows one open store
    per directory, so that one is closed first, as a restarted process would have it."""
    if stores.kind == "embedded":
        stores.metadata.close()
        metadata = open_metadata_store((tmp_path / "metadata").as_uri())
        blobs = open_blob_store((tmp_path / "blobs").as_uri())
    else:
        metadata = open_metadata_store(request.getfixturevalue("zk_uri"))
        blobs = open_blob_store(request.getfixturevalue("s3_uri"))
    try:
        yield Stores(stores.kind, metadata, blobs)
    finally:
        blobs.close()
        metadata.close()


def test_ten_thousand_partitions(stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    backlog = make_registry(stores, clock, shard_size=SHARD_SIZE)  # the production layout
    boundaries = [off(f"topic-{t}", p, 1_000_000 + p) for t in range(10) for p in range(1000)]
    sizes: list[int] = []
    real_transaction = stores.metadata.transaction

    def measured(ops: Sequence[Op]) -> None:
        sizes.append(sum(len(getattr(op, "data", b"")) for op in ops))
        real_transaction(ops)

    monkeypatch.setattr(stores.metadata, "transaction", measured)
    marked = backlog.mark("big", boundaries, reset=False)
    assert len(marked.partitions) == 10_000 and marked.processing_backlog

    # One call with every partition: the even ones reach their boundary.
    positions = [off(b.stream, b.partition, b.offset - (b.partition % 2)) for b in boundaries]
    first = backlog.report("big", positions)
    assert len(first.newly_finished) == 5_000 and first.processing_backlog
    rest = backlog.report(
        "big", [off(b.stream, b.partition, b.offset) for b in boundaries if b.partition % 2]
    )
    assert len(rest.newly_finished) == 5_000
    assert not rest.processing_backlog
    monkeypatch.undo()

    status = backlog.status("big")
    assert len(status.partitions) == 10_000 and all(p.finished for p in status.partitions)
    assert not status.processing_backlog
    # Every znode and every transaction stays far below ZooKeeper's 1 MB.
    names = job_nodes(stores.metadata, "big")
    assert len([n for n in names if n.startswith("s-")]) == 10  # ceil(10,000 / 1024) shards
    node_sizes = [len(stores.metadata.get(f"{JOBS}/big/{n}").data) for n in names]  # type: ignore[union-attr]
    assert max(node_sizes) < 50_000
    assert len(stores.metadata.get(f"{JOBS}/big").data) < 1_000  # type: ignore[union-attr]
    assert max(sizes) < MAX_NODE_BYTES // 2


def test_a_large_report_is_committed_in_bounded_transactions(
    stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog = make_registry(stores, clock, chunk_bytes=320)  # 2 shards (~150 bytes each) per transaction
    boundaries = [off("orders", p, 100) for p in range(24)]  # 6 shards
    backlog.mark("job-1", boundaries, reset=False)
    sizes: list[int] = []
    real_transaction = stores.metadata.transaction

    def measured(ops: Sequence[Op]) -> None:
        sizes.append(sum(len(getattr(op, "data", b"")) for op in ops))
        real_transaction(ops)

    monkeypatch.setattr(stores.metadata, "transaction", measured)
    progress = backlog.report("job-1", [off("orders", p, 100 + p) for p in range(24)])
    monkeypatch.undo()
    assert len(sizes) == 3 and all(size <= 320 for size in sizes)
    assert [o.partition for o in progress.newly_finished] == list(range(24))
    assert not progress.processing_backlog


def test_crash_between_upload_and_commit_leaves_only_an_orphan_the_janitor_sweeps(
    backlog: BacklogRegistry, stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog.mark("live", BOUNDARIES, reset=False)

    def crash(ops: object) -> None:
        raise SimulatedCrash

    monkeypatch.setattr(stores.metadata, "transaction", crash)
    with pytest.raises(SimulatedCrash):
        backlog.mark("crashed", BOUNDARIES, reset=False)
    monkeypatch.undo()
    with pytest.raises(NotFound):
        backlog.status("crashed")  # never a visible mark
    stores.blobs.put("backlog/not-ours.txt", b"x")
    stores.blobs.put("producers/p/0123456789abcdef0123456789abcdef.json", b"{}")
    assert len(objects(stores.blobs)) == 3

    intents = IntentIndex(stores.metadata)
    assert intents.sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100) == 0  # too young: may be in flight
    clock.advance(2 * HOUR_MS)
    # The crashed mark's intent announces its object: the listing sweep leaves it to the intents.
    assert backlog.sweep_orphans(grace_ms=HOUR_MS, limit=100) == 0
    assert intents.sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100) == 1
    assert intents.announced_keys() == frozenset()
    live_mark = mark_id_of(stores.metadata, "live")
    assert objects(stores.blobs) == ["backlog/live/" + live_mark + ".json", "backlog/not-ours.txt"]
    assert [b.key for b in stores.blobs.list("producers/")] != []
    assert backlog.mark("crashed", BOUNDARIES, reset=False).processing_backlog  # the id is free


@pytest.mark.parametrize("how", ["clear", "reset"])
@pytest.mark.parametrize("failure", ["unavailable", "crash"])
def test_boundaries_left_behind_by_the_commit_that_unreferenced_them_are_swept_later(
    backlog: BacklogRegistry,
    stores: Stores,
    clock: ManualClock,
    how: str,
    failure: str,
) -> None:
    """The boundaries are deleted after the commit that unreferences them (a clear, a reset). When
    that delete fails or never runs (a crash), the intent that commit made leads the sweep to them
    (the listing sweep is off by default); what a mark references stays."""
    backlog.mark("keep", BOUNDARIES, reset=False)
    backlog.mark("job", BOUNDARIES, reset=False)
    doomed = f"backlog/job/{mark_id_of(stores.metadata, 'job')}.json"
    call = (
        (lambda: backlog.clear("job")) if how == "clear" else (lambda: backlog.mark("job", BOUNDARIES, True))
    )
    call_while_blob_deletes_fail(stores.blobs, failure, call)
    assert doomed in objects(stores.blobs)
    live = {f"backlog/{j}/{mark_id_of(stores.metadata, j)}.json" for j in stores.metadata.children(JOBS)}
    assert doomed not in live and len(live) == (1 if how == "clear" else 2)

    intents = IntentIndex(stores.metadata)
    assert intents.sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100) == 0  # too young
    clock.advance(2 * HOUR_MS)
    intents.sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100)
    assert sorted(objects(stores.blobs)) == sorted(live)
    assert doomed not in intents.announced_keys()
    assert backlog.status("keep").processing_backlog


def test_a_clear_deletes_the_intent_it_made_for_the_boundaries_once_they_are_gone(
    backlog: BacklogRegistry, stores: Stores
) -> None:
    backlog.mark("job", BOUNDARIES, reset=False)
    backlog.mark("job", BOUNDARIES, reset=True)
    assert backlog.clear("job")
    assert objects(stores.blobs) == []
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()


def test_gauges_count_jobs_processing_backlog_and_partitions_remaining(
    stores: Stores, clock: ManualClock
) -> None:
    metrics_registry = new_registry()
    backlog = BacklogRegistry(
        stores.metadata,
        stores.blobs,
        clock,
        POLICY,
        CoordinatorMetrics(metrics_registry),
        shard_size=4,
        gauges_stale_after_ms=60_000,
    )

    def gauges() -> tuple[float | None, float | None]:
        return (
            metrics_registry.get_sample_value("snapcoord_backlog_jobs_processing"),
            metrics_registry.get_sample_value("snapcoord_backlog_partitions_remaining"),
        )

    assert gauges() == (0.0, 0.0)  # never computed on this replica
    backlog.mark("behind", BOUNDARIES, reset=False)  # 3 partitions to catch up
    backlog.mark("caught-up", [off("orders", p, 10) for p in range(6)], reset=False)
    backlog.report("caught-up", [off("orders", p, 10) for p in range(6)])
    backlog.report("behind", [off("orders", 0, 100)])
    assert backlog.refresh_gauges() == 0
    assert gauges() == (1.0, 2.0)
    clock.advance(60_001)  # this replica stopped leading: its last values go stale
    assert gauges() == (0.0, 0.0)


def test_a_status_racing_a_clear_through_a_lagging_server_is_not_found(
    stores: Stores, clock: ManualClock
) -> None:
    """Another replica cleared the mark, then its boundaries; this replica's server still shows the
    mark. The confirming re-read is synced: NOT_FOUND, not INTERNAL ("boundaries missing")."""
    writer = make_registry(stores, clock)
    writer.mark("j", [off("s", 0, 5)], reset=False)
    path = job_path("j")
    lagging = LaggingReads(stores.metadata, {path: stores.metadata.get(path)})
    reader = BacklogRegistry(
        lagging,  # type: ignore[arg-type]
        stores.blobs,
        clock,
        POLICY,
        CoordinatorMetrics(new_registry()),
        shard_size=4,
    )
    assert writer.clear("j")
    with pytest.raises(NotFound):
        reader.status("j")
