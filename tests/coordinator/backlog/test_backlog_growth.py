"""A mark that follows its sources, on both backends (the embedded defaults, real ZooKeeper + S3):
partitions added to a stored mark, positions of unmarked partitions answered, boundaries that
cannot be edited unseen.

Shards of 4 partitions, so that a grown mark re-indexes partitions across shards (an added
partition sorts before marked ones and moves them to other shards) the way a large job's does.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence

import pytest

from harness.concurrency import run_threads
from harness.faults import SimulatedCrash, call_while_blob_deletes_fail
from harness.stores import Stores
from snapcoord.coordinator.backlog.layout import JOBS, job_path
from snapcoord.coordinator.backlog.registry import CHUNK_BYTES, BacklogRegistry
from snapcoord.coordinator.domain.backlog import (
    BacklogPolicy,
    BacklogStatus,
    PartitionBacklog,
    Progress,
    boundaries_key,
)
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.errors import (
    CommitOutcomeUnknown,
    CorruptRecord,
    FailedPrecondition,
    InvalidArgument,
    Reason,
)
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.storage.metadata import Op

POLICY = BacklogPolicy(max_partitions=10_000)


def make_registry(
    stores: Stores,
    *,
    policy: BacklogPolicy = POLICY,
    chunk_bytes: int = CHUNK_BYTES,
    clock: ManualClock | None = None,
) -> BacklogRegistry:
    metrics = CoordinatorMetrics(new_registry())
    clock = clock or ManualClock(SystemClock().now_ms())
    return BacklogRegistry(
        stores.metadata, stores.blobs, clock, policy, metrics, shard_size=4, chunk_bytes=chunk_bytes
    )


@pytest.fixture
def backlog(stores: Stores) -> BacklogRegistry:
    return make_registry(stores)


def off(stream: str, partition: int, offset: int) -> Offset:
    return Offset(stream, partition, offset)


def pb(stream: str, partition: int, boundary: int, position: int, finished: bool) -> PartitionBacklog:
    return PartitionBacklog(stream, partition, boundary, position, finished)


def mark_id_of(stores: Stores, job_id: str) -> str:
    node = stores.metadata.get(job_path(job_id))
    assert node is not None
    return str(json.loads(node.data)["mark_id"])


def objects(stores: Stores) -> list[str]:
    return [b.key for b in stores.blobs.list("backlog/")]


def test_the_issue_a_partition_added_after_the_mark_is_answered_then_marked(
    backlog: BacklogRegistry, stores: Stores
) -> None:
    """The walk-through of the issue: t/2 appears after the mark. The report answers it in
    ``unmarked`` instead of dropping it, and a second mark adds it at its own boundary while t/0
    and t/1 keep theirs and their progress: the job is processing backlog again."""
    backlog.mark("job", [off("t", 0, 100), off("t", 1, 100)], reset=False)
    first = backlog.report("job", [off("t", 0, 100), off("t", 1, 100), off("t", 2, 0)], "b1")
    assert first == Progress(
        "job", (off("t", 0, 100), off("t", 1, 100)), processing_backlog=False, unmarked=(off("t", 2, 0),)
    )
    old_mark = mark_id_of(stores, "job")

    grown = backlog.mark("job", [off("t", 0, 500), off("t", 1, 500), off("t", 2, 500)], reset=False)
    assert grown == BacklogStatus(
        "job",
        processing_backlog=True,
        partitions=(pb("t", 0, 100, 100, True), pb("t", 1, 100, 100, True), pb("t", 2, 500, -1, False)),
        added=(off("t", 2, 500),),
    )
    assert backlog.status("job") == BacklogStatus("job", True, grown.partitions)  # `added`: mark only
    # The grown mark is a new mark: nothing of the old one is left, not its nodes, not its object.
    new_mark = mark_id_of(stores, "job")
    assert new_mark != old_mark
    assert all(new_mark in name for name in stores.metadata.children(job_path("job")))
    assert objects(stores) == [boundaries_key("job", new_mark)]

    # The report that finished t/0 and t/1, retried after the grow, still answers them (their tags
    # were carried over); t/2 is marked now, so nothing is unmarked.
    retry = backlog.report("job", [off("t", 0, 100), off("t", 1, 100), off("t", 2, 0)], "b1")
    assert retry == Progress("job", (off("t", 0, 100), off("t", 1, 100)), processing_backlog=True)
    assert backlog.report("job", [off("t", 2, 499)]).newly_finished == ()
    done = backlog.report("job", [off("t", 2, 500)])
    assert done == Progress("job", (off("t", 2, 500),), processing_backlog=False)


def test_a_mark_naming_nothing_new_changes_nothing_and_a_retried_grow_adds_nothing(
    backlog: BacklogRegistry, stores: Stores
) -> None:
    backlog.mark("job", [off("b", 0, 10), off("d", 0, 10)], reset=False)
    backlog.report("job", [off("b", 0, 7)])
    mark = mark_id_of(stores, "job")
    same = backlog.mark("job", [off("d", 0, 99)], reset=False)  # a subset, another boundary
    assert same.added == () and mark_id_of(stores, "job") == mark
    assert same.partitions == (pb("b", 0, 10, 7, False), pb("d", 0, 10, -1, False))

    # a/0 and c/0 sort before and between the marked ones: every index moves, across shards.
    request = [off(s, p, 20) for s in "abcd" for p in range(2)]
    grown = backlog.mark("job", request, reset=False)
    assert grown.added == tuple(o for o in request if (o.stream, o.partition) not in {("b", 0), ("d", 0)})
    again = backlog.mark("job", request, reset=False)  # a retry whose first reply was lost
    assert again.added == ()
    assert again.partitions == grown.partitions == backlog.status("job").partitions
    assert [(p.stream, p.partition, p.boundary, p.position) for p in grown.partitions if p.position >= 0] == [
        ("b", 0, 10, 7)
    ]
    assert len(objects(stores)) == 1


def test_a_grow_whose_reply_was_lost_is_recognised_by_its_retry(
    backlog: BacklogRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog.mark("job", [off("t", 0, 10)], reset=False)
    backlog.report("job", [off("t", 0, 4)])
    real_transaction = stores.metadata.transaction

    def applied_but_reply_lost(ops: Sequence[Op]) -> None:
        real_transaction(ops)
        raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_but_reply_lost)
    grown = backlog.mark("job", [off("t", 0, 10), off("t", 1, 30)], reset=False)
    monkeypatch.undo()
    # The kernel re-read, found its own mark id stored, and answered as if the reply had come.
    assert grown.added == (off("t", 1, 30),)
    assert grown.partitions == (pb("t", 0, 10, 4, False), pb("t", 1, 30, -1, False))
    assert backlog.status("job").partitions == grown.partitions
    assert objects(stores) == [boundaries_key("job", mark_id_of(stores, "job"))]


def test_racing_grows_across_replicas_add_each_partition_once_at_its_first_boundary(stores: Stores) -> None:
    """Ten callers on two replicas grow one mark at once, each by partitions of its own and some
    shared with others, each with its own boundaries: every partition ends up marked, each added
    by exactly one call, at the boundary that call gave; the progress reported before stays."""
    replicas = [make_registry(stores), make_registry(stores)]
    replicas[0].mark("job", [off("base", p, 50) for p in range(3)], reset=False)
    replicas[1].report("job", [off("base", 0, 50), off("base", 1, 20)])

    def request(i: int) -> list[Offset]:
        own = [off(f"s{i}", p, 100 + i) for p in range(2)]
        shared = [off("shared", p, 200 + i) for p in range(i % 3)]
        return [off("base", 0, 999), *own, *shared]

    added: list[tuple[int, Offset]] = []
    lock = threading.Lock()

    def grow(i: int) -> None:
        status = replicas[i % 2].mark("job", request(i), reset=False)
        with lock:
            added.extend((i, o) for o in status.added)

    run_threads(10, grow)
    counts = Counter((o.stream, o.partition) for _, o in added)
    assert max(counts.values()) == 1, "a partition was added by two calls"
    status = replicas[0].status("job")
    marked = {(p.stream, p.partition): p for p in status.partitions}
    base = {("base", p) for p in range(3)}
    assert set(marked) == base | {(o.stream, o.partition) for i in range(10) for o in request(i)}
    assert set(counts) == set(marked) - base
    for i, o in added:  # each at the boundary of the call that added it
        assert o in request(i) and marked[o.stream, o.partition].boundary == o.offset
    assert marked["base", 0] == pb("base", 0, 50, 50, True)
    assert marked["base", 1] == pb("base", 1, 50, 20, False)
    assert objects(stores) == [boundaries_key("job", mark_id_of(stores, "job"))]


def test_no_progress_is_lost_when_a_mark_grows_under_a_report_between_its_read_and_commit(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grow has read the old mark's shards; a report on another replica commits before the
    grow does. The grow's commit fails on the shard's version, it reads again and carries the
    report's positions over: the grown mark has them, and the partition the report finished is
    finished, listed once."""
    grower, reporter = make_registry(stores), make_registry(stores)
    grower.mark("job", [off("t", p, 100) for p in range(6)], reset=False)
    reporter.report("job", [off("t", 0, 10)])
    real_transaction = stores.metadata.transaction
    raced: list[Progress] = []
    started = False

    def report_first(ops: Sequence[Op]) -> None:
        nonlocal started
        if not started:  # the grow's first commit: the report goes first
            started = True
            raced.append(reporter.report("job", [off("t", p, 100 if p == 1 else 60) for p in range(6)]))
        real_transaction(ops)

    monkeypatch.setattr(stores.metadata, "transaction", report_first)
    grown = grower.mark("job", [off("t", p, 100) for p in range(8)], reset=False)
    monkeypatch.undo()
    assert raced[0].newly_finished == (off("t", 1, 100),)
    assert grown.added == (off("t", 6, 100), off("t", 7, 100))
    assert [p.position for p in grown.partitions] == [60, 100, 60, 60, 60, 60, -1, -1]
    assert grower.status("job").partitions == grown.partitions
    # The reporter's copies are of the old mark: its next report lands on the grown one.
    after = reporter.report("job", [off("t", 1, 100), off("t", 7, 100)])
    assert after.newly_finished == (off("t", 7, 100),)


def test_concurrent_reports_and_grows_lose_no_position_and_finish_each_partition_once(stores: Stores) -> None:
    """Data loss is the worst bug: four reporters (each driving its own partitions forward, then
    past their boundary) race three grows on two replicas. Every position ends at the highest
    reported, and every finished partition is listed by exactly one report."""
    replicas = [make_registry(stores), make_registry(stores)]
    replicas[0].mark("job", [off("in", p, 30) for p in range(8)], reset=False)
    finished: list[Offset] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        registry = replicas[i % 2]
        if i >= 4:  # a grower: adds two partitions of its own
            registry.mark("job", [off(f"new{i}", p, 5) for p in range(2)], reset=False)
            return
        for position in range(0, 40, 4):
            reported = [off("in", i * 2, position), off("in", i * 2 + 1, position + 1)]
            progress = registry.report("job", reported)
            with lock:
                finished.extend(progress.newly_finished)

    run_threads(7, work)
    status = replicas[1].status("job")
    marked = {(p.stream, p.partition): p for p in status.partitions}
    assert len(marked) == 8 + 3 * 2
    for p in range(8):
        assert marked["in", p].position == 36 + p % 2, f"in/{p} lost progress"
        assert marked["in", p].finished
    counts = Counter((o.stream, o.partition) for o in finished)
    assert counts == Counter({("in", p): 1 for p in range(8)}), "finished not exactly once"
    assert status.processing_backlog  # the added partitions are behind


def test_growing_past_the_partition_limit_is_refused_and_changes_nothing(stores: Stores) -> None:
    backlog = make_registry(stores, policy=BacklogPolicy(max_partitions=3))
    backlog.mark("job", [off("t", 0, 10), off("t", 1, 10)], reset=False)
    backlog.report("job", [off("t", 0, 5)])
    before = (backlog.status("job"), stores.metadata.children(job_path("job")), objects(stores))
    with pytest.raises(InvalidArgument) as refused:
        backlog.mark("job", [off("t", 2, 10), off("t", 3, 10)], reset=False)
    assert str(refused.value) == (
        "adding 2 partitions to the backlog mark of job_id 'job' (2 marked) would track 4; this "
        "coordinator tracks at most 3 partitions per job (--backlog-max-partitions): raise the "
        "limit, or mark again with reset=true naming fewer partitions"
    )
    assert refused.value.reason == Reason.TOO_LARGE
    assert refused.value.metadata == {"field": "boundaries", "limit": "3"}
    assert (backlog.status("job"), stores.metadata.children(job_path("job")), objects(stores)) == before
    # Up to the limit it grows; reset keeps its meaning (replace, forget progress).
    assert backlog.mark("job", [off("t", 2, 10)], reset=False).added == (off("t", 2, 10),)
    reset = backlog.mark("job", [off("t", 9, 10)], reset=True)
    assert reset == BacklogStatus("job", True, (pb("t", 9, 10, -1, False),))


def test_a_grow_whose_progress_outgrows_one_transaction_is_refused_and_changes_nothing(
    stores: Stores,
) -> None:
    """A grow carries the whole progress in one transaction (that is what makes it atomic): a mark
    whose progress would not fit is refused, its upload removed, the stored mark untouched. (At the
    production layout 10,000 partitions carry at most ~460 KB; the bound is shrunk here.)"""
    backlog = make_registry(stores, chunk_bytes=200)
    backlog.mark("job", [off("t", p, 10) for p in range(12)], reset=False)
    backlog.report("job", [off("t", p, 5) for p in range(12)])
    before = (backlog.status("job"), stores.metadata.children(job_path("job")), objects(stores))
    with pytest.raises(FailedPrecondition, match="more than one ZooKeeper transaction carries") as e:
        backlog.mark("job", [off("u", 0, 10)], reset=False)
    assert e.value.reason == Reason.TOO_LARGE and e.value.metadata["limit"] == "200"
    assert (backlog.status("job"), stores.metadata.children(job_path("job")), objects(stores)) == before


def test_an_edited_boundaries_object_is_a_corrupt_record(stores: Stores) -> None:
    """Still valid JSON in order, one boundary lowered: without the digest it would read as a
    mark that is caught up. A fresh replica (no cached boundaries) refuses it with DATA_LOSS."""
    make_registry(stores).mark("job", [off("t", 0, 100), off("t", 1, 100)], reset=False)
    key = boundaries_key("job", mark_id_of(stores, "job"))
    doc = json.loads(stores.blobs.get(key))
    doc["streams"][0]["boundaries"][1] = 0
    stores.blobs.put(key, json.dumps(doc).encode())
    fresh = make_registry(stores)
    for call in (lambda: fresh.status("job"), lambda: fresh.report("job", [off("t", 1, 1)])):
        with pytest.raises(CorruptRecord, match="does not match the SHA-256 its job record holds") as e:
            call()
        assert e.value.reason == Reason.CORRUPT_RECORD
        assert e.value.metadata["path"] == key


def test_a_record_written_before_the_digest_is_read_without_the_check(stores: Stores) -> None:
    make_registry(stores).mark("job", [off("t", 0, 100)], reset=False)
    node = stores.metadata.get(job_path("job"))
    assert node is not None
    doc = json.loads(node.data)
    assert len(doc.pop("boundaries_sha256")) == 64
    stores.metadata.set(job_path("job"), json.dumps(doc).encode(), version=node.version)
    fresh = make_registry(stores)
    assert fresh.status("job") == BacklogStatus("job", True, (pb("t", 0, 100, -1, False),))
    grown = fresh.mark("job", [off("t", 1, 5)], reset=False)  # the grown record has a digest
    assert grown.added == (off("t", 1, 5),)
    after = stores.metadata.get(job_path("job"))
    assert after is not None and "boundaries_sha256" in json.loads(after.data)
    assert stores.metadata.children(JOBS) == ["job"]


def test_unmarked_partitions_are_counted_by_the_status_and_the_gauge(stores: Stores) -> None:
    """Each partition a report names unmarked is counted once, on every replica's status and in
    the janitor's gauge; a grow adding some of them leaves the others counted; at most
    ``max_partitions`` are counted."""
    metrics_registry = new_registry()
    clock = ManualClock(SystemClock().now_ms())
    policy = BacklogPolicy(max_partitions=6)
    here = BacklogRegistry(
        stores.metadata, stores.blobs, clock, policy, CoordinatorMetrics(metrics_registry), shard_size=4
    )
    elsewhere = make_registry(stores, policy=policy)
    here.mark("job", [off("t", 0, 10)], reset=False)
    assert here.status("job").unmarked_partitions == 0
    assert here.report("job", [off("t", 0, 5), off("t", 1, 3)]).unmarked == (off("t", 1, 3),)
    elsewhere.report("job", [off("t", 1, 4), off("u", 0, 1)])  # t/1 again: counted once
    elsewhere.report("job", [off("t", 1, 5)])
    assert here.status("job").unmarked_partitions == elsewhere.status("job").unmarked_partitions == 2
    here.refresh_gauges()
    assert metrics_registry.get_sample_value("snapcoord_backlog_partitions_unmarked") == 2.0
    assert metrics_registry.get_sample_value("snapcoord_backlog_unmarked_positions_total") == 1.0

    grown = elsewhere.mark("job", [off("t", 1, 9)], reset=False)
    assert (grown.added, grown.unmarked_partitions) == ((off("t", 1, 9),), 1)  # u/0 is still unmarked
    assert here.status("job").unmarked_partitions == 1
    # Up to the limit: 6 partitions in all may be counted; 4 more fit, the rest does not.
    here.report("job", [off("v", p, 1) for p in range(6)])
    assert here.status("job").unmarked_partitions == 6
    here.refresh_gauges()
    assert metrics_registry.get_sample_value("snapcoord_backlog_partitions_unmarked") == 6.0
    assert here.mark("job", [off("t", 0, 1)], reset=True).unmarked_partitions == 0  # a reset forgets
    assert here.status("job").unmarked_partitions == 0
    assert all("u-" not in name for name in stores.metadata.children(job_path("job")))


def test_a_corrupt_unmarked_set_is_a_corrupt_record_of_its_own_kind(stores: Stores) -> None:
    backlog = make_registry(stores)
    backlog.mark("job", [off("t", 0, 10)], reset=False)
    backlog.report("job", [off("t", 1, 3)])
    path = f"{job_path('job')}/u-{mark_id_of(stores, 'job')}"
    node = stores.metadata.get(path)
    assert node is not None
    stores.metadata.set(path, b'{"tags":[1],"version":1}', version=node.version)
    with pytest.raises(CorruptRecord) as e:
        make_registry(stores).status("job")
    assert (e.value.kind, e.value.metadata["path"]) == ("backlog_unmarked_set", path)


HOUR_MS = 3_600_000


def test_a_grow_that_crashes_before_its_commit_keeps_the_mark_and_its_object(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies after uploading the grown boundaries, before the commit: the stored mark,
    its progress and its object are untouched, and the intent sweep deletes only the upload."""
    clock = ManualClock(SystemClock().now_ms())
    backlog = make_registry(stores, clock=clock)
    backlog.mark("job", [off("t", 0, 10), off("t", 1, 10)], reset=False)
    backlog.report("job", [off("t", 0, 10), off("t", 1, 4)])
    before, kept = backlog.status("job"), objects(stores)

    def crash(ops: Sequence[Op]) -> None:
        raise SimulatedCrash

    monkeypatch.setattr(stores.metadata, "transaction", crash)
    with pytest.raises(SimulatedCrash):
        backlog.mark("job", [off("t", 2, 10)], reset=False)
    monkeypatch.undo()
    assert len(objects(stores)) == 2  # the upload, left behind by the crash
    clock.advance(2 * HOUR_MS)
    assert IntentIndex(stores.metadata).sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100) == 1
    assert objects(stores) == kept
    fresh = make_registry(stores)
    assert fresh.status("job") == before
    assert fresh.mark("job", [off("t", 2, 10)], reset=False).added == (off("t", 2, 10),)


@pytest.mark.parametrize("failure", ["unavailable", "crash"])
def test_the_old_boundaries_a_grow_unreferences_are_swept_when_their_delete_fails(
    stores: Stores, failure: str
) -> None:
    clock = ManualClock(SystemClock().now_ms())
    backlog = make_registry(stores, clock=clock)
    backlog.mark("job", [off("t", 0, 10)], reset=False)
    backlog.report("job", [off("t", 0, 6)])
    doomed = boundaries_key("job", mark_id_of(stores, "job"))
    call_while_blob_deletes_fail(stores.blobs, failure, lambda: backlog.mark("job", [off("t", 1, 3)], False))
    live = boundaries_key("job", mark_id_of(stores, "job"))
    assert live != doomed and sorted(objects(stores)) == sorted([doomed, live])
    clock.advance(2 * HOUR_MS)
    IntentIndex(stores.metadata).sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100)
    assert objects(stores) == [live]
    status = make_registry(stores).status("job")  # read back from the object that stayed
    assert status.partitions == (pb("t", 0, 10, 6, False), pb("t", 1, 3, -1, False))
