"""Restores and fences that must never lose committed output: the order of a restore's steps, which
commits a snapshot's positions name, and the races between a restore, a zombie and a newer run.

Unit-level: the sink classes on a local directory, batches written by a real local PySpark driver,
hand-made checkpoints laid out as Spark writes them, and a real coordinator where a snapshot is
needed. Races are made deterministic by running the other party at a fixed point (a subclass hook).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import SparkSession

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, DeadlineExceeded
from snapcoord.spark_connector.savepoints.app_snapshots import ARCHIVE_KEY, SnapshotQuery, take_snapshot
from snapcoord.spark_connector.savepoints.checkpoint_archive import cut_checkpoint
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, restore_snapshot
from snapcoord.spark_connector.sink.commit_log import Commit, FileLine
from snapcoord.spark_connector.sink.epochs import Fenced
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.protocols import RestoreRefused
from snapcoord.spark_connector.sink.writer import ExactlyOnceWriter, exactly_once
from snapcoord.spark_connector.storage import LocalStorage

pytestmark = pytest.mark.spark

ROWS = 3
S = TypeVar("S", bound=PartitionedFileSink)


def rows(batch: int) -> list[tuple[int, int]]:
    """Batch ``b`` holds ids ``100b .. 100b+2``."""
    return [(batch * 100 + i, batch) for i in range(ROWS)]


def write(spark: SparkSession, sink: PartitionedFileSink, batch: int, batch_id: int | None = None) -> int:
    df = spark.createDataFrame(rows(batch), "id long, b long").coalesce(1)
    return sink.write(df, batch if batch_id is None else batch_id)


def fenced_run(spark: SparkSession, kind: type[S], table: Path, epoch: int, written: range) -> S:
    """A run of epoch ``epoch`` on ``table`` (a ``kind`` sink) that wrote batches ``written``."""
    run = kind(table)
    run.fence(epoch)
    for n in written:
        write(spark, run, n)
    return run


def batches(table: Path) -> list[int]:
    """The batches a fresh reader of ``table`` sees (each once)."""
    seen = Counter(int(r["b"]) for r in PartitionedFileSink(table).read_json_records())
    assert all(n == ROWS for n in seen.values()), seen
    return sorted(seen)


def make_checkpoint(root: Path, query_id: str, offsets: range, commits: range) -> Path:
    """What a file-source query's checkpoint holds: metadata, offsets/<N> and commits/<N>."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for n in offsets:
        (root / "offsets" / str(n)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps({'logOffset': n})}\n")
    for n in commits:
        spark_commits(root, n)
    return root


def spark_commits(checkpoint: Path, batch_id: int) -> None:
    (checkpoint / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    with CoordinatorProcess(tmp_path_factory.mktemp("coordinator")) as coord:
        yield coord


class ArchiveStreamLost(CoordinatorClient):
    """A client whose archive streams break after their first piece (a dropped connection or the
    stream's deadline, as ``read_checkpoint`` raises them)."""

    def read_checkpoint(
        self, app_id: str, generation: int, task_id: str, store: str, **kw: Any
    ) -> Iterator[bytes]:
        stream = super().read_checkpoint(app_id, generation, task_id, store, **kw)
        if store != ARCHIVE_KEY:
            return stream

        def broken() -> Iterator[bytes]:
            yield next(stream)
            raise DeadlineExceeded("the archive stream outlived its deadline", method="ReadCheckpoint")

        return broken()


# -- finding: the sink was cut before the archive was read -------------------------------------------


def test_a_failed_archive_read_cuts_no_sink(
    spark: SparkSession, tmp_path: Path, coordinator: CoordinatorProcess
) -> None:
    checkpoint = make_checkpoint(tmp_path / "cp", "q-1", range(4), range(2))
    (checkpoint / "state" / "0" / "0").mkdir(parents=True)
    (checkpoint / "state" / "0" / "0" / "1.delta").write_bytes(bytes(3 * 1024 * 1024))  # several pieces
    table = tmp_path / "table"
    sink = PartitionedFileSink(table)
    sink.fence(1)
    for n in range(4):
        write(spark, sink, n)
    with CoordinatorClient(coordinator.target, timeout_s=30) as client:
        snapshot = take_snapshot(
            client, "order-app", [SnapshotQuery("q", str(checkpoint), sink)], timeout_s=60
        )
    spark_commits(checkpoint, 2)
    spark_commits(checkpoint, 3)  # the query went on after the snapshot: batches 2, 3 are committed
    restored = tmp_path / "cp-restored"
    target = RestoreTarget("q", str(restored), PartitionedFileSink(table))

    with ArchiveStreamLost(coordinator.target, timeout_s=30) as lossy, pytest.raises(DeadlineExceeded):
        restore_snapshot(lossy, "order-app", snapshot.generation, [target])
    # Nothing changed: the sink keeps every committed batch and the old checkpoint stays usable.
    assert batches(table) == [0, 1, 2, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp", "table"]  # no partial copy left

    with CoordinatorClient(coordinator.target, timeout_s=30) as client:
        done = restore_snapshot(client, "order-app", snapshot.generation, [target])
    assert batches(table) == [0, 1]
    assert cut_checkpoint(LocalStorage(restored)).batch_id == 1 and done["q"].batch_id == 1


def restore(table: Path, positions: list[Any]) -> None:
    """What ``restore_snapshot`` does to a sink: a new epoch above every fence, then the cut."""
    restorer = PartitionedFileSink(table)
    restorer.fence(restorer.max_epoch() + 1)
    restorer.restore_to(positions)


# -- finding: a snapshot after a checkpoint reset took the position of the earlier run's batch ---------


def test_a_reset_checkpoints_batch_is_never_found_in_the_earlier_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "table"
    fenced_run(spark, PartitionedFileSink, table, 1, range(10))  # the old checkpoint's batches 0..9
    new = PartitionedFileSink(table)
    new.fence(2)  # a reset checkpoint on the same sink: batch ids start again at 0
    for n in range(8):
        write(spark, new, 20 + n, batch_id=n)
    # The new run's batch 8 wrote nothing (its batch function skipped it) and Spark committed it: only
    # the old run has a batch 8, whose position would cut the new run's batches 0..7.
    with pytest.raises(LookupError, match="earlier run"):
        new.batch_end_positions(8)
    with pytest.raises(LookupError, match="no batch 10 in its log"):
        new.batch_end_positions(10)
    # The new run's own batches are found, and a cut there keeps both runs' output below it.
    restore(table, new.batch_end_positions(7))
    assert batches(table) == [*range(10), *range(20, 28)]
    restore(table, new.batch_end_positions(3))
    assert batches(table) == [*range(10), *range(20, 24)]


# -- finding: a restore's cut deleted the files of a newer run that committed meanwhile ----------------


def test_a_cut_never_touches_a_newer_run_and_reports_it(spark: SparkSession, tmp_path: Path) -> None:
    table = tmp_path / "table"
    run = fenced_run(spark, PartitionedFileSink, table, 1, range(4))
    positions = run.batch_end_positions(1)

    class RacedRestorer(PartitionedFileSink):
        """The old query, restarted by a supervisor, fences and commits batch 7 while the restore
        is between the scan of the visible commits and the walk over the data files."""

        raced = False

        def _write_dirs(self) -> Iterator[tuple[str, int]]:
            if not self.raced:
                self.raced = True
                newer = PartitionedFileSink(table)
                newer.fence(self.epoch + 1)
                write(spark, newer, 7)
            yield from super()._write_dirs()

    restorer = RacedRestorer(table)
    restorer.fence(2)
    with pytest.raises(Fenced, match="fenced by epoch 3"):
        restorer.restore_to(positions)  # not done: the newer run may have counted on what was cut
    assert restorer.raced
    reader = PartitionedFileSink(table)
    assert all(reader.storage.exists(f) for f in reader.committed_files())  # the newer run's batch 7 is whole
    assert batches(table) == [0, 1, 7]


# -- finding: a fence that landed between a writer's check and its commit file hid a written batch -----


class PausesBeforeItsCommitFile(PartitionedFileSink):
    """A writer that runs ``before_link`` once, after its fence check passed and before it links its
    commit file: where a newer run's fence can land."""

    before_link: Callable[[], None] | None = None
    _committing = False

    def _commit(self, commit: Commit, files: Sequence[FileLine]) -> None:
        self._committing = True
        try:
            super()._commit(commit, files)
        finally:
            self._committing = False

    def check_epoch(self) -> None:
        super().check_epoch()
        hook, self.before_link = (self.before_link, None) if self._committing else (None, self.before_link)
        if hook is not None:
            hook()


class DiesAfterItsFence(ExactlyOnceWriter):
    def _hook(self, point: str, batch_id: int) -> None:
        if point == "after_delete":
            raise DriverKilled(f"killed in batch {batch_id} as epoch {self.epoch}")


class DriverKilled(Exception):
    pass


def test_a_batch_a_newer_fence_hides_is_never_reported_written(
    spark: SparkSession, tmp_path: Path, coordinator: CoordinatorProcess
) -> None:
    checkpoint = make_checkpoint(tmp_path / "cp", "query-1", range(6), range(0))
    table = tmp_path / "table"

    def df(batch: int) -> Any:
        return spark.createDataFrame(rows(batch), "id long, b long").coalesce(1)

    with CoordinatorClient(coordinator.target, timeout_s=30) as client:
        sink_a = PausesBeforeItsCommitFile(table)
        a = exactly_once(sink_a, client, query_name="hidden", checkpoint_location=str(checkpoint))
        a(df(0), 0)
        spark_commits(checkpoint, 0)

        def driver_b() -> None:  # a second driver on the checkpoint re-runs batch 1, fences, dies
            b = DiesAfterItsFence(PartitionedFileSink(table), client, query_name="hidden")
            b.checkpoint_location = str(checkpoint)
            with pytest.raises(DriverKilled):
                b(df(1), 1)

        sink_a.before_link = driver_b
        with pytest.raises(Fenced, match="took sequence"):
            a(df(1), 1)  # B's fence took A's log number; A's Spark does not write commits/1
        assert sink_a.before_link is None and batches(table) == [0]

        # The restarted driver resumes at batch 1: A's attempt is rolled back, nothing is lost.
        c = exactly_once(
            PartitionedFileSink(table), client, query_name="hidden", checkpoint_location=str(checkpoint)
        )
        for n in (1, 2, 3):
            c(df(n), n)
            spark_commits(checkpoint, n)
    assert batches(table) == [0, 1, 2, 3]


def test_a_commit_linked_while_a_fence_is_computed_fails_its_write(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "table"
    b_scanned, a_done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    class ScansThenWaits(PartitionedFileSink):
        """Driver B: its fence has listed the log (without A's entry) and waits before it takes the
        first free number."""

        def _latest(self) -> int:
            found = super()._latest()
            if not b_scanned.is_set():
                b_scanned.set()
                if not a_done.wait(120):
                    failures.append(TimeoutError("A never finished its write"))
            return found

    def fence_b() -> None:
        try:
            ScansThenWaits(table).fence(2)
        except BaseException as e:  # reported by the test thread
            failures.append(e)

    a = PausesBeforeItsCommitFile(table)
    a.fence(1)
    write(spark, a, 0)
    b = threading.Thread(target=fence_b)

    def start_b_and_wait_for_its_scan() -> None:
        b.start()
        assert b_scanned.wait(120)

    a.before_link = start_b_and_wait_for_its_scan
    try:
        with pytest.raises(Fenced, match="not reported as written"):
            write(spark, a, 1)  # created after B's scan: B's fence replaces it, so the write must fail
    finally:
        a_done.set()
        b.join(120)
    assert not b.is_alive() and not failures
    assert batches(table) == [0]  # replaced by B's fence: a re-run of batch 1 writes it
    assert [(c.kind, c.epoch) for c in PartitionedFileSink(table)._commits()][-1] == ("fence", 2)


# -- finding: a newer snapshot restored after an older one's restore kept the wrong commits ------------


def tree(table: Path, *, fences: bool = True) -> dict[str, bytes]:
    """Every file under ``table`` and its bytes (``fences=False``: without ``_fences/`` and the log's
    fence entries, which a refused restore's fence adds)."""
    fence_entries = {
        f"_spark_metadata/{name}"
        for name in os.listdir(table / "_spark_metadata")
        if b"_snapcoord-fence-" in (table / "_spark_metadata" / name).read_bytes().splitlines()[-1]
    }
    return {
        p.relative_to(table).as_posix(): p.read_bytes()
        for p in sorted(table.rglob("*"))
        if p.is_file()
        and (
            fences
            or (
                "_fences" not in p.relative_to(table).parts
                and p.relative_to(table).as_posix() not in fence_entries
            )
        )
    }


def test_a_newer_snapshot_after_an_older_ones_restore_is_refused_and_cuts_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "table"
    run = fenced_run(spark, PartitionedFileSink, table, 1, range(10))
    s1, s2 = run.batch_end_positions(5), run.batch_end_positions(9)  # snapshots at batches 5 and 9
    assert [(p.partition, p.offset) for p in s1 if p.partition != 2] == [(0, 7)]  # entry 0: the fence
    assert [p.partition for p in s2] == [0, 2]  # the cut and the fingerprint of what lies below it
    restore(table, s1)
    restored_run = PartitionedFileSink(table)
    restored_run.fence(restored_run.max_epoch() + 1)
    # S1's checkpoint resumes at 6 (entries 11 and 12 are the two fences' empty batches)
    assert [write(spark, restored_run, n) for n in (6, 7)] == [13, 14]
    before, kept = tree(table), tree(table, fences=False)

    # S2's checkpoint resumes at batch 10, but the sink below S2's cut holds 0-5 and the new 6-7.
    with pytest.raises(RestoreRefused, match=r"restore to sequence 11: the sink no longer holds") as info:
        PartitionedFileSink(table).check_restore(s2)
    assert "6 batch(es) below it" in str(info.value) and "Nothing was cut" in str(info.value)
    assert tree(table) == before
    with pytest.raises(RestoreRefused, match="restore to sequence 11"):
        restore(table, s2)  # restore_to refuses too (after its fence), before removing anything
    assert tree(table, fences=False) == kept
    assert batches(table) == [*range(8)]

    # The snapshot that cut the sink, and one taken after that restore, still restore.
    s3 = restored_run.batch_end_positions(7)
    restore(table, s1)
    assert batches(table) == [*range(6)]
    restore(table, s1)  # the same snapshot twice
    assert batches(table) == [*range(6)]
    with pytest.raises(RestoreRefused):
        restore(table, s3)  # its batches 6-7 were cut by that restore of S1
    # A snapshot recorded without the fingerprint restores as before: the cut is not checked.
    restore(table, [p for p in s2 if p.partition != 2])
    assert batches(table) == [*range(6)]


def test_restores_of_what_the_sink_still_holds_pass(spark: SparkSession, tmp_path: Path) -> None:
    """Rollbacks of partial batches, zombies' hidden commits and the fences of later runs and
    restores never change what lies below a snapshot's cut: such restores are never refused."""
    table = tmp_path / "table"
    run = fenced_run(spark, PausesBeforeItsCommitFile, table, 1, range(3))
    at_2 = run.batch_end_positions(2)
    # The query runs on: batch 3's first attempt is rolled back by its re-run.
    attempt = run.positions()
    write(spark, run, 3)
    run.rollback_to(attempt)
    write(spark, run, 3)
    # Run 1 becomes a zombie: a new driver fences while it commits batch 4, and takes its number.
    newer = PartitionedFileSink(table)
    run.before_link = lambda: newer.fence(2)
    with pytest.raises(Fenced, match="took sequence"):
        write(spark, run, 4)
    assert [c.batch_id for c in newer.commits() if c.epoch == 1] == [0, 1, 2, 3]
    write(spark, newer, 4)
    write(spark, newer, 5)
    at_5 = newer.batch_end_positions(5)
    # The next batch's attempt is rolled back.
    attempt = newer.positions()
    write(spark, newer, 6)
    newer.rollback_to(attempt)
    write(spark, newer, 6)

    restore(table, at_5)  # after the query ran on, with the zombie's commit below the cut gone
    assert batches(table) == [*range(6)]
    restore(table, at_5)  # the same snapshot twice
    assert batches(table) == [*range(6)]
    restore(table, at_2)  # an older snapshot after the newer one's restore
    assert batches(table) == [0, 1, 2]
    restore(table, at_2)
    assert batches(table) == [0, 1, 2]
    with pytest.raises(RestoreRefused):
        restore(table, at_5)  # the newer one again: its batches 3-5 are gone


def test_restore_snapshot_checks_every_sink_before_it_cuts_one(
    spark: SparkSession, tmp_path: Path, coordinator: CoordinatorProcess
) -> None:
    cp = {q: make_checkpoint(tmp_path / f"cp-{q}", f"{q}-1", range(10), range(2)) for q in "ab"}
    sinks = {q: PartitionedFileSink(tmp_path / f"table-{q}") for q in "ab"}
    queries = [SnapshotQuery(q, str(cp[q]), sinks[q]) for q in "ab"]
    for sink in sinks.values():
        sink.fence(1)
        for n in range(2):
            write(spark, sink, n)

    def target(q: str, checkpoint: str) -> RestoreTarget:
        return RestoreTarget(q, str(tmp_path / checkpoint), PartitionedFileSink(tmp_path / f"table-{q}"))

    with CoordinatorClient(coordinator.target, timeout_s=30) as client:
        s1 = take_snapshot(client, "refuse-app", queries, timeout_s=60)  # at batch 1
        for q, sink in sinks.items():
            for n in (2, 3):
                write(spark, sink, n)
                spark_commits(cp[q], n)
        s2 = take_snapshot(client, "refuse-app", queries, timeout_s=60)  # at batch 3
        # Query b alone is restored from S1, and its restored run writes batches 2 and 3 anew.
        restore_snapshot(client, "refuse-app", s1.generation, [target("b", "cp-b-s1")])
        b_run = PartitionedFileSink(tmp_path / "table-b")
        b_run.fence(b_run.max_epoch() + 1)
        for n in (2, 3):
            write(spark, b_run, 10 + n, batch_id=n)
        before = {q: tree(tmp_path / f"table-{q}") for q in "ab"}
        listing = sorted(p.name for p in tmp_path.iterdir())

        # S2 for both: a's sink is fine, b's no longer holds S2's batches 2-3. Nothing is touched,
        # a's sink neither (not even fenced), and no checkpoint appears.
        with pytest.raises(RestoreRefused, match=r"table-b.*restore to sequence 5"):
            restore_snapshot(
                client, "refuse-app", s2.generation, [target("a", "cp-a-2"), target("b", "cp-b-2")]
            )
        assert {q: tree(tmp_path / f"table-{q}") for q in "ab"} == before
        assert sorted(p.name for p in tmp_path.iterdir()) == listing
        assert batches(tmp_path / "table-a") == [0, 1, 2, 3]
        assert batches(tmp_path / "table-b") == [0, 1, 12, 13]

        # S1, the snapshot that cut b, restores both.
        done = restore_snapshot(
            client, "refuse-app", s1.generation, [target("a", "cp-a-1"), target("b", "cp-b-1")]
        )
    assert {q: r.batch_id for q, r in done.items()} == {"a": 1, "b": 1}
    assert batches(tmp_path / "table-a") == batches(tmp_path / "table-b") == [0, 1]


def test_a_commit_names_only_files_already_on_disk(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark writes part files without fsync: after a power loss a durable log entry of a local table
    could list files that were lost. Every file an entry lists, and every directory from it up to
    the table, is fsynced before the entry is linked."""
    table = tmp_path / "table"
    sink = PartitionedFileSink(table, partition_by=["b"])
    synced: list[str] = []
    real_fsync, real_link = os.fsync, os.link
    linked_at: dict[str, int] = {}

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def recording_link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        linked_at[str(dst)] = len(synced)
        real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "link", recording_link)
    seq = write(spark, sink, 7)
    monkeypatch.undo()
    commit_file = table / "_spark_metadata" / "0"
    files = PartitionedFileSink(table).commits()[0].files
    assert seq == 0 and files and all(f.startswith("b=7/") for f in files)
    before_commit = set(synced[: linked_at[str(commit_file)]])
    assert {str(table / f) for f in files} <= before_commit
    assert {str(table / "b=7"), str(table)} <= before_commit
    assert batches(table) == [7]
