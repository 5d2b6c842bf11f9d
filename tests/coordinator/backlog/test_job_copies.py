"""This process's copy of a job record (``backlog.cache.JobCopies``): a report on a mark the
process knows reads only its shards (one round) and commits; a stale copy never lands a report on
a mark that is gone, never answers for one, and costs only a read of the record.

Two registries on one store stand for two coordinator processes (each has its own copies), so what
one writes makes the other's copy stale: the races these tests play out. The request counts are
taken on real ZooKeeper, on the coordinator's own kazoo client (as ``bench/hot_rpcs.py`` does).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

import pytest

from harness.concurrency import run_threads
from harness.stores import Stores
from harness.zk_requests import Counted, count_requests
from snapcoord.coordinator.backlog.layout import JOBS
from snapcoord.coordinator.backlog.registry import BacklogRegistry
from snapcoord.coordinator.domain.backlog import SHARD_SIZE, BacklogPolicy, PartitionBacklog, Progress
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.errors import NotFound
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.storage.metadata import Op

POLICY = BacklogPolicy(max_partitions=10_000)


def make_registry(stores: Stores, *, shard_size: int = 4) -> BacklogRegistry:
    metrics = CoordinatorMetrics(new_registry())
    clock = ManualClock(SystemClock().now_ms())
    return BacklogRegistry(stores.metadata, stores.blobs, clock, POLICY, metrics, shard_size=shard_size)


@pytest.fixture
def here(stores: Stores) -> BacklogRegistry:
    """The process whose copies are under test."""
    return make_registry(stores)


@pytest.fixture
def elsewhere(stores: Stores) -> BacklogRegistry:
    """Another process on the same store."""
    return make_registry(stores)


def off(stream: str, partition: int, offset: int) -> Offset:
    return Offset(stream, partition, offset)


def record_of(stores: Stores, job_id: str) -> tuple[str, int]:
    """The stored mark id and the record's version."""
    node = stores.metadata.get(f"{JOBS}/{job_id}")
    assert node is not None
    return str(json.loads(node.data)["mark_id"]), node.version


def nodes_of(stores: Stores, job_id: str) -> list[str]:
    return stores.metadata.children(f"{JOBS}/{job_id}")


# --- stale copies: the races -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["cleared and marked again", "reset"])
def test_a_report_from_a_stale_copy_lands_on_the_new_mark_only(
    stores: Stores, here: BacklogRegistry, elsewhere: BacklogRegistry, how: str
) -> None:
    """Here knows mark X; elsewhere replaces it with Y (new boundaries, one partition more). Here's
    next report must apply to Y alone: by Y's boundaries, with nothing written under X."""
    here.mark("job", [off("in", 0, 100), off("in", 1, 100)], reset=False)
    assert here.report("job", [off("in", 0, 100)]).newly_finished == (off("in", 0, 100),)
    old_mark, _ = record_of(stores, "job")
    y_boundaries = [off("in", 0, 500), off("in", 1, 100), off("in", 2, 7)]
    if how == "reset":
        elsewhere.mark("job", y_boundaries, reset=True)
    else:
        assert elsewhere.clear("job") is True
        elsewhere.mark("job", y_boundaries, reset=False)
    new_mark, version = record_of(stores, "job")
    assert new_mark != old_mark
    if how != "reset":
        assert version == 0, "the test needs the record's version to have restarted"

    progress = here.report("job", [off("in", 0, 120), off("in", 1, 100), off("in", 2, 7)])
    # By Y's boundaries: in/0 is behind 500 now, in/1 and in/2 finish for Y.
    assert progress == Progress("job", (off("in", 1, 100), off("in", 2, 7)), processing_backlog=True)
    assert elsewhere.status("job").partitions == (
        PartitionBacklog("in", 0, 500, 120, False),
        PartitionBacklog("in", 1, 100, 100, True),
        PartitionBacklog("in", 2, 7, 7, True),
    )
    assert record_of(stores, "job")[0] == new_mark
    assert all(new_mark in name for name in nodes_of(stores, "job")), "a node of the old mark is back"
    # And here now knows Y: its status and next report agree with elsewhere's.
    assert here.status("job") == elsewhere.status("job")
    assert here.report("job", [off("in", 0, 500)]) == Progress("job", (off("in", 0, 500),), False)


def test_a_report_from_a_stale_copy_of_a_cleared_job_is_not_found_and_writes_nothing(
    stores: Stores, here: BacklogRegistry, elsewhere: BacklogRegistry
) -> None:
    here.mark("job", [off("in", 0, 100)], reset=False)
    here.report("job", [off("in", 0, 50)])
    assert elsewhere.clear("job") is True
    with pytest.raises(NotFound, match="no backlog is marked for job_id 'job'"):
        here.report("job", [off("in", 0, 100)])
    with pytest.raises(NotFound):
        here.status("job")
    assert stores.metadata.children(JOBS) == []


def test_a_report_from_a_stale_shard_copy_loses_nothing_elsewhere_wrote(
    here: BacklogRegistry, elsewhere: BacklogRegistry
) -> None:
    """Here's copy of the shard is behind what elsewhere wrote (positions, a finished partition and
    its tag). Here's next report must merge into what is stored, not into its copy: nothing
    elsewhere wrote moves back or is lost, and each partition is finished by one report only."""
    here.mark("job", [off("in", p, 100) for p in range(4)], reset=False)  # one shard of 4
    assert here.report("job", [off("in", 0, 10)]).newly_finished == ()
    assert elsewhere.report("job", [off("in", 1, 100), off("in", 2, 50)], "there").newly_finished == (
        off("in", 1, 100),
    )
    progress = here.report("job", [off("in", 0, 100), off("in", 1, 120), off("in", 2, 40), off("in", 3, 100)])
    # in/1 was finished elsewhere (listed there, not again here); in/2 does not move back to 40.
    assert progress == Progress("job", (off("in", 0, 100), off("in", 3, 100)), processing_backlog=True)
    assert elsewhere.status("job").partitions == (
        PartitionBacklog("in", 0, 100, 100, True),
        PartitionBacklog("in", 1, 100, 120, True),
        PartitionBacklog("in", 2, 100, 50, False),
        PartitionBacklog("in", 3, 100, 100, True),
    )
    # The retry of elsewhere's report answers the same from here, whose copy never saw its tag.
    assert here.report("job", [off("in", 1, 100), off("in", 2, 50)], "there").newly_finished == (
        off("in", 1, 100),
    )
    assert here.status("job") == elsewhere.status("job")


def test_a_report_with_nothing_new_for_a_shard_copy_reads_the_shard(
    stores: Stores, here: BacklogRegistry, elsewhere: BacklogRegistry
) -> None:
    """By here's copy nothing moves, so no commit would check the copy: the answer (finished, still
    behind, or no mark at all) must come from the stored shard."""
    here.mark("job", [off("in", 0, 100), off("in", 1, 100)], reset=False)
    here.report("job", [off("in", 0, 100)])
    elsewhere.report("job", [off("in", 1, 100)])  # the job is caught up now; here's copy says not
    assert here.report("job", [off("in", 0, 90)]) == Progress("job", (), processing_backlog=False)
    assert elsewhere.clear("job") is True
    with pytest.raises(NotFound, match="no backlog is marked for job_id 'job'"):
        here.report("job", [off("in", 0, 100)])  # nothing new by the copy
    with pytest.raises(NotFound):
        here.report("job", [off("in", 0, 200)])  # a write by the copy: its commit finds no shard
    assert stores.metadata.children(JOBS) == []


def test_a_stale_copy_naming_none_of_the_reported_partitions_does_not_answer_for_the_job(
    here: BacklogRegistry, elsewhere: BacklogRegistry
) -> None:
    """Here's copy is of a mark that is all caught up; the new mark has a partition behind, which
    the copy does not name. A report of only that partition (or of one no mark names) reads no
    shard of the copy's mark, so nothing proves the copy: it must not answer "caught up", nor drop
    the position as "not backlog"."""
    here.mark("job", [off("a", 0, 10)], reset=False)
    assert here.report("job", [off("a", 0, 10)]) == Progress("job", (off("a", 0, 10),), False)
    elsewhere.mark("job", [off("a", 0, 10), off("b", 0, 5), off("c", 0, 5)], reset=True)

    assert here.report("job", [off("z", 0, 1)]) == Progress(
        "job", (), processing_backlog=True, unmarked=(off("z", 0, 1),)
    )
    assert here.report("job", [off("b", 0, 5)]) == Progress("job", (off("b", 0, 5),), True)
    assert [p.finished for p in elsewhere.status("job").partitions] == [False, True, False]


def test_a_reset_racing_a_report_from_a_copy_between_its_read_and_its_commit(
    stores: Stores, here: BacklogRegistry, elsewhere: BacklogRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy is current when here reads its shards; elsewhere resets before here commits. The
    commit fails on the shard's version (its node is gone), here reads the record and applies the
    report to the new mark."""
    here.mark("job", [off("in", 0, 100), off("in", 1, 100)], reset=False)
    real_transaction = stores.metadata.transaction
    raced = threading.Event()

    def reset_first(ops: Sequence[Op]) -> None:
        if not raced.is_set():
            raced.set()
            elsewhere.mark("job", [off("in", 0, 500), off("in", 1, 100)], reset=True)
        real_transaction(ops)

    monkeypatch.setattr(stores.metadata, "transaction", reset_first)
    progress = here.report("job", [off("in", 0, 120), off("in", 1, 100)], "r-1")
    monkeypatch.undo()
    assert raced.is_set()
    assert progress == Progress("job", (off("in", 1, 100),), processing_backlog=True)
    new_mark, _ = record_of(stores, "job")
    assert all(new_mark in name for name in nodes_of(stores, "job"))
    assert [p.position for p in elsewhere.status("job").partitions] == [120, 100]


def test_a_retry_with_the_same_report_id_answers_the_same_from_either_process(
    stores: Stores, here: BacklogRegistry, elsewhere: BacklogRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final report's write lands and its reply is lost. Its retry, with the same report_id,
    answers the same newly_finished through this process (from its copy) and through another
    (which reads the record first), also after a later report moved the positions on."""
    here.mark("job", [off("in", 0, 100), off("in", 1, 50), off("in", 2, 9)], reset=False)
    final = [off("in", 0, 100), off("in", 1, 50)]
    real_transaction = stores.metadata.transaction

    def applied_then_lost(ops: Sequence[Op]) -> None:
        real_transaction(ops)
        raise ConnectionError("the reply was lost (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_then_lost)
    with pytest.raises(ConnectionError):
        here.report("job", final, "batch-9")
    monkeypatch.undo()
    answer = Progress("job", (off("in", 0, 100), off("in", 1, 50)), processing_backlog=True)
    assert here.report("job", final, "batch-9") == answer
    assert elsewhere.report("job", final, "batch-9") == answer
    assert here.report("job", [off("in", 0, 180)], "batch-10").newly_finished == ()
    assert here.report("job", final, "batch-9") == answer
    assert elsewhere.report("job", final, "batch-9") == answer
    assert here.report("job", final, "another") == Progress("job", (), True)


def test_a_retry_after_the_job_was_marked_again_answers_for_the_new_mark(
    here: BacklogRegistry, elsewhere: BacklogRegistry
) -> None:
    """Report ids are scoped to a mark: a retry from a copy of the old mark finishes the new
    mark's partitions afresh, never answers with the old mark's tags."""
    here.mark("job", [off("in", 0, 5)], reset=False)
    assert here.report("job", [off("in", 0, 5)], "r1").newly_finished == (off("in", 0, 5),)
    elsewhere.clear("job")
    elsewhere.mark("job", [off("in", 0, 9)], reset=False)
    assert here.report("job", [off("in", 0, 5)], "r1") == Progress("job", (), True)
    assert here.report("job", [off("in", 0, 9)], "r1") == Progress("job", (off("in", 0, 9),), False)
    assert elsewhere.report("job", [off("in", 0, 9)], "r1") == Progress("job", (off("in", 0, 9),), False)


def test_concurrent_reporters_on_two_processes_across_a_reset_finish_each_partition_once(
    stores: Stores, here: BacklogRegistry, elsewhere: BacklogRegistry
) -> None:
    """Reporters on both processes while a third process resets the job midway: each partition of
    the surviving mark is listed finished by exactly one report, and its status shows them all."""
    resetter = make_registry(stores)
    here.mark("job", [off("p", i, 10) for i in range(8)], reset=False)
    elsewhere.status("job")  # both processes hold a copy of the first mark
    new_boundaries = [off("p", i, 20) for i in range(8)]
    results: list[Progress] = []
    lock = threading.Lock()
    started = threading.Barrier(5)
    reset_done = threading.Event()

    def reporter(registry: BacklogRegistry, first: int) -> None:
        started.wait(timeout=60)
        for position in range(first, 25, 2):
            if position >= 23:  # each reporter's last report comes after the reset, however slow
                assert reset_done.wait(timeout=120)
            progress = registry.report("job", [off("p", i, position) for i in range(8)])
            with lock:
                results.append(progress)

    def reset() -> None:
        started.wait(timeout=60)
        resetter.mark("job", new_boundaries, reset=True)
        reset_done.set()

    threads = [threading.Thread(target=reporter, args=(r, f)) for r in (here, elsewhere) for f in (8, 9)]
    threads.append(threading.Thread(target=reset))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive()
    status = resetter.status("job")
    assert [p.boundary for p in status.partitions] == [20] * 8
    assert all(p.finished and p.position == 24 for p in status.partitions)
    # Finished under the new mark: once each, by a report at or past 20. (Reports before the
    # reset may have listed partitions of the old mark; those were at or past 10 and below 20.)
    by_new = [o for r in results for o in r.newly_finished if o.offset >= 20]
    assert sorted((o.stream, o.partition) for o in by_new) == [("p", i) for i in range(8)]


# --- ZooKeeper requests per call -----------------------------------------------------------------


@pytest.fixture
def counted(zk_stores: Stores, monkeypatch: pytest.MonkeyPatch) -> Counted:
    return count_requests(zk_stores.metadata, monkeypatch)


def test_a_report_on_a_mark_this_process_knows_is_one_transaction(
    zk_stores: Stores, counted: Counted
) -> None:
    """The benchmark's call: 100 partitions in one shard of the production layout. Only the
    transaction: the copy of the job record names the shard, the copy of the shard (made by the
    mark, then by each report) stands in for its read, and the commit's version check verifies
    it. (ReportProgress used to read the record, then the shard, first.)"""
    backlog = make_registry(zk_stores, shard_size=SHARD_SIZE)
    backlog.mark("job", [off("s", p, 10**12) for p in range(100)], reset=False)
    for k in range(1, 4):
        counted.reset()
        progress = backlog.report("job", [off("s", p, 1000 * k) for p in range(100)])
        assert progress == Progress("job", (), processing_backlog=True)
        assert (counted.requests, counted.rounds) == (1, 1), counted.log
        assert counted.log == ["Transaction"]
    # A report with nothing new writes nothing, so it reads the shard its answer rests on.
    counted.reset()
    assert backlog.report("job", [off("s", 0, 5)]) == Progress("job", (), processing_backlog=True)
    assert counted.log == ["GetData"]


def test_concurrent_reports_of_one_job_in_one_process_take_turns(zk_stores: Stores, counted: Counted) -> None:
    """8 threads report one job at once (its one shard; each thread moves its own partitions on):
    each report is one transaction, on the copy the last one left (racing on one copy, all but one
    would lose and read), and every position lands."""
    backlog = make_registry(zk_stores, shard_size=SHARD_SIZE)
    backlog.mark("job", [off("s", p, 10**12) for p in range(100)], reset=False)
    backlog.report("job", [off("s", p, 1) for p in range(100)])
    counted.reset()

    def report(i: int) -> None:
        for k in range(1, 5):
            backlog.report("job", [off("s", p, 1000 * k + p) for p in range(i, 100, 8)])

    run_threads(8, report)
    assert counted.log == ["Transaction"] * 32
    status = {(p.stream, p.partition): p.position for p in backlog.status("job").partitions}
    assert status == {("s", p): 4000 + p for p in range(100)}


def test_a_report_over_two_shards_reads_them_in_one_round(zk_stores: Stores, counted: Counted) -> None:
    marker = make_registry(zk_stores, shard_size=4)
    marker.mark("job", [off("s", p, 100) for p in range(8)], reset=False)
    backlog = make_registry(zk_stores, shard_size=4)
    backlog.status("job")  # its copy of the record (and of the shards: stale once the marker reports)
    marker.report("job", [off("s", 0, 10), off("s", 7, 10)])
    counted.reset()
    backlog.report("job", [off("s", 0, 50), off("s", 7, 50)])
    # Its copies lose the compare-and-set; then the two shards in one multiRead, and the transaction.
    assert (counted.requests, counted.rounds) == (3, 3), counted.log
    assert counted.log == ["Transaction", "MultiRead", "Transaction"]


def test_a_process_without_a_copy_reads_the_record_once_then_not_again(
    zk_stores: Stores, counted: Counted
) -> None:
    """A replica that did not mark the job reads its record on its first call only; after another
    process resets the job, one call pays for the stale copy (shard gone, then record and shards
    read again) and the next is back to one round."""
    marker = make_registry(zk_stores, shard_size=SHARD_SIZE)
    reporter = make_registry(zk_stores, shard_size=SHARD_SIZE)
    marker.mark("job", [off("s", p, 10**12) for p in range(100)], reset=False)
    positions = [off("s", p, 1) for p in range(100)]
    counted.reset()
    reporter.report("job", positions)
    assert (counted.requests, counted.rounds) == (3, 3), counted.log  # record, shard, transaction
    counted.reset()
    reporter.report("job", [off("s", p, 2) for p in range(100)])
    assert counted.log == ["Transaction"]

    marker.mark("job", [off("s", p, 10**12) for p in range(100)], reset=True)
    counted.reset()
    assert reporter.report("job", [off("s", p, 3) for p in range(100)]).processing_backlog
    # The commit on the old mark's shard fails (gone), its re-read finds it gone; then the
    # record, the new shard and the transaction.
    assert counted.log == ["Transaction", "GetData", "GetData", "GetData", "Transaction"]
    counted.reset()
    reporter.report("job", [off("s", p, 4) for p in range(100)])
    assert counted.log == ["Transaction"]


def test_a_status_from_a_copy_reads_only_the_shards(zk_stores: Stores, counted: Counted) -> None:
    backlog = make_registry(zk_stores, shard_size=4)
    marked = backlog.mark("job", [off("s", p, 100) for p in range(8)], reset=False)
    counted.reset()
    assert backlog.status("job") == marked
    assert (counted.requests, counted.rounds) == (1, 1), counted.log  # two shards, one multiRead
