"""``PartitionedFileSink`` on any location, read by Spark readers that know nothing of it.

Tables live in a local directory and on real servers reached through Spark's Hadoop FileSystems:
``s3a://`` (SeaweedFS), ``hdfs://`` (the minicluster) and ``sftp://`` (an sshd; a file system with
directories and no atomic create, kept for the small cases). The readers are plain
``spark.read.json(table)`` and ``spark.readStream`` on the table: they honour the sink's
``_spark_metadata`` log and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from harness.coordinator import CoordinatorProcess
from harness.locations import TestDir
from snapcoord.spark_connector.sink.commit_log import Commit, FileLine
from snapcoord.spark_connector.sink.epochs import Fenced
from snapcoord.spark_connector.sink.partitioned import LegacyTable, PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once
from snapcoord.spark_connector.storage import UnsupportedLocation

pytestmark = pytest.mark.spark

#: The stores of the heavier cases: sftp's cases are the small ones (its reads go byte by byte).
HEAVY = pytest.mark.parametrize("test_dir", ["local", "s3a", "hdfs"], indirect=True)
#: Reading a table back, whatever the store: the local disk and one remote file system suffice.
SMALL = pytest.mark.parametrize("test_dir", ["local", "sftp"], indirect=True)
#: Remote stores only, for a whole streaming query.
REMOTE = pytest.mark.parametrize("test_dir", ["s3a", "hdfs"], indirect=True)

SCHEMA = "id long, bucket string"


def batch(spark: SparkSession, n: int) -> Any:
    """Batch ``n``: ids ``10n .. 10n+3`` over two partitions, in one Spark partition: Hadoop's
    SFTPFileSystem (the tests' remote store) checks and then creates each missing directory, so two
    tasks creating the same ``_temporary`` directory at once fail one of them ("Can't make
    directory"); the stores the sink runs on in production have no such race."""
    return spark.createDataFrame([(10 * n + i, f"b{i % 2}") for i in range(4)], SCHEMA).coalesce(1)


def ids_of(batches: Sequence[int]) -> list[int]:
    return sorted(10 * n + i for n in batches for i in range(4))


def plain_read(spark: SparkSession, uri: str) -> list[int]:
    """What ``spark.read`` of the table returns, checking that partition columns come back."""
    rows = spark.read.json(uri).collect()
    assert all(r["bucket"] == f"b{r['id'] % 2}" for r in rows), rows
    return sorted(int(r["id"]) for r in rows)


def stream_read(spark: SparkSession, uri: str, name: str) -> list[int]:
    """What a new ``spark.readStream`` of the table reads with ``availableNow``."""
    query = (
        spark.readStream.schema(SCHEMA)
        .json(uri)
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    return sorted(int(r["id"]) for r in spark.sql(f"select id from {name}").collect())


class Paused(PartitionedFileSink):
    """Runs ``before_create`` once, after the batch's files are written and its fence check passed,
    before its log entry is created."""

    before_create: Callable[[], None] | None = None

    def _create_entry(self, commit: Commit, files: Sequence[FileLine]) -> None:
        hook, self.before_create = self.before_create, None
        if hook is not None:
            hook()
        super()._create_entry(commit, files)


@HEAVY
def test_plain_readers_see_only_committed_batches(spark: SparkSession, test_dir: TestDir) -> None:
    table = test_dir.uri_of("t")
    sink = Paused(table, partition_by=["bucket"])
    sink.fence(1)
    sink.write(batch(spark, 0), 0)
    sink.write(batch(spark, 1), 1)
    assert plain_read(spark, table) == ids_of([0, 1])

    # While a batch is published (its files are in the table, its entry is not): not read.
    seen: list[list[int]] = []
    sink.before_create = lambda: seen.extend(
        [plain_read(spark, table), stream_read(spark, table, f"publishing_{test_dir.kind}")]
    )
    mark = sink.positions()
    sink.write(batch(spark, 2), 2)
    assert seen == [ids_of([0, 1]), ids_of([0, 1])]
    assert plain_read(spark, table) == ids_of([0, 1, 2])

    # After a rollback of that attempt (a restarted run re-runs batch 2): gone for every reader.
    sink.rollback_to(mark)
    assert plain_read(spark, table) == ids_of([0, 1])
    assert stream_read(spark, table, f"rolled_back_{test_dir.kind}") == ids_of([0, 1])

    # A zombie's late write: it passed its fence check just before a newer run fenced.
    newer = PartitionedFileSink(table, partition_by=["bucket"])
    sink.before_create = lambda: newer.fence(2)
    with pytest.raises(Fenced, match="took sequence"):
        sink.write(batch(spark, 3), 3)
    # A zombie whose entry lands between the newer fence's listing and its own create: the fence
    # replaces it, and the zombie's write fails.
    newest = Racing(table, partition_by=["bucket"])
    zombie = PartitionedFileSink(table, partition_by=["bucket"])
    zombie.fence(2)
    zombie.check_epoch = lambda: None  # type: ignore[method-assign]  # passed before the fence
    newest.during_fence = lambda: _expect_fenced(lambda: zombie.write(batch(spark, 4), 4))
    newest.fence(3)
    assert plain_read(spark, table) == ids_of([0, 1])
    assert stream_read(spark, table, f"zombies_{test_dir.kind}") == ids_of([0, 1])
    newest.write(batch(spark, 2), 2)
    assert plain_read(spark, table) == ids_of([0, 1, 2])
    kinds = [(c.kind, c.epoch, c.batch_id) for c in newest._commits()]
    assert kinds[-3:] == [("fence", 2, None), ("fence", 3, None), ("data", 3, 2)], kinds


class Racing(PartitionedFileSink):
    """Runs ``during_fence`` once, right after its fence listed the log."""

    during_fence: Callable[[], None] | None = None

    def _latest(self) -> int:
        found = super()._latest()
        hook, self.during_fence = self.during_fence, None
        if hook is not None:
            hook()
        return found


def _expect_fenced(write: Callable[[], Any]) -> None:
    with pytest.raises(Fenced, match="not reported as written"):
        write()


@SMALL
def test_an_unpartitioned_table_reads_back_whole(
    spark: SparkSession, test_dir: TestDir, zk_coordinator: CoordinatorProcess
) -> None:
    table = test_dir.uri_of("flat")
    sink = PartitionedFileSink(table, file_format="parquet", coordinator=zk_coordinator.target)
    sink.fence(1)
    for n in range(3):
        sink.write(batch(spark, n), n)
    mark = sink.positions()
    sink.write(batch(spark, 3), 3)
    sink.rollback_to(mark)
    rows = spark.read.parquet(table).collect()
    assert sorted(int(r["id"]) for r in rows) == ids_of([0, 1, 2])


def test_rollbacks_and_fences_never_void_a_reported_batch(
    spark: SparkSession, test_dir: TestDir, zk_coordinator: CoordinatorProcess
) -> None:
    """Rollback and fence are the sink's deleting paths: each is pointed at a reported batch. (The
    coordinator is the commit point on sftp, whose create is not atomic; the other stores need none.)"""
    table = test_dir.uri_of("t")
    coordinator = zk_coordinator.target
    a = PartitionedFileSink(table, partition_by=["bucket"], coordinator=coordinator)
    a.fence(1)
    a.write(batch(spark, 0), 0)
    a_attempt = a.positions()
    a.write(batch(spark, 1), 1)  # A's attempt at batch 1; A dies before Spark commits it
    b = PartitionedFileSink(table, partition_by=["bucket"], coordinator=coordinator)
    b.fence(2)
    b.rollback_to(a_attempt)
    b.write(batch(spark, 5), 1)  # reported written: Spark commits batch 1
    b.write(batch(spark, 6), 2)

    # A's stale positions again (a lost reply, a retried rollback): B's batches stay.
    b.rollback_to(a_attempt)
    # A zombie rollback that passed its check before B's fence: only A's own epoch is voided.
    a.check_epoch = lambda: None  # type: ignore[method-assign]
    a.rollback_to(a_attempt)
    # A fence of a newer run and a rollback of its (empty) first attempt.
    c = PartitionedFileSink(table, partition_by=["bucket"], coordinator=coordinator)
    c.fence(3)
    c.rollback_to(c.positions())
    assert plain_read(spark, table) == ids_of([0, 5, 6])
    assert [commit.batch_id for commit in c.commits()] == [0, 1, 2]
    # Every file of a batch the log lists is still there.
    assert all(test_dir.storage.child("t").exists(f) for f in c.committed_files())
    # A rollback of a newer epoch's attempt is refused outright.
    with pytest.raises(Fenced):
        b.rollback_to(c.positions())


def test_a_location_is_never_taken_for_a_local_directory(
    spark: SparkSession,
    remote: TestDir,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    zk_coordinator: CoordinatorProcess,
) -> None:
    monkeypatch.chdir(tmp_path)
    sink = PartitionedFileSink(remote.uri_of("t"), partition_by=["bucket"], coordinator=zk_coordinator.target)
    sink.fence(1)
    sink.write(batch(spark, 0), 0)
    assert plain_read(spark, remote.uri_of("t")) == ids_of([0])
    assert remote.storage.exists("t/_spark_metadata/1")
    with pytest.raises(UnsupportedLocation, match="scheme"):
        PartitionedFileSink("unknown-scheme://host/table")
    # Spark's Hadoop configuration names a FileSystem class for abfss that is not on the class path here.
    with pytest.raises(UnsupportedLocation, match="hadoop-azure"):
        PartitionedFileSink("abfss://container@account.dfs.core.windows.net/table")
    assert os.listdir(tmp_path) == []  # no "sftp:" or "abfss:" directory, nothing at all


@SMALL
def test_a_table_of_the_earlier_log_format_is_refused(spark: SparkSession, test_dir: TestDir) -> None:
    table = test_dir.uri_of("old")
    test_dir.storage.write_bytes("old/_commits/000000000000-e000000000001.json", b'{"files": []}')
    sink = PartitionedFileSink(table)
    for act in (sink.positions, lambda: sink.fence(1), lambda: sink.write(batch(spark, 0), 0)):
        with pytest.raises(LegacyTable, match="earlier release"):
            act()
    assert [e.name for e in test_dir.storage.list("old")] == ["_commits"]  # nothing written


@REMOTE
def test_a_streaming_query_writes_a_remote_table_exactly_once(
    spark: SparkSession, test_dir: TestDir, tmp_path: Path, zk_coordinator: CoordinatorProcess
) -> None:
    """A file-source query through ``exactly_once`` into a table on a remote store; batch 1 fails once
    after its write (a crash between the sink write and Spark's commit), and the re-run rolls it back."""
    source = tmp_path / "in"
    source.mkdir()
    for n in range(3):
        (source / f"in-{n}.json").write_text(
            "".join(f'{{"id": {10 * n + i}, "bucket": "b{i % 2}"}}\n' for i in range(4))
        )
    table = test_dir.uri_of("t")
    sink = PartitionedFileSink(table, partition_by=["bucket"])
    failed: list[int] = []

    def write_then_fail_once(df: Any, batch_id: int) -> None:
        sink.write(df, batch_id)
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("crash after the sink write of batch 1")

    writer = exactly_once(
        sink,
        zk_coordinator.target,
        query_name=f"{test_dir.kind}-{uuid.uuid4().hex[:6]}",
        batch_function=write_then_fail_once,
    )
    checkpoint = str(tmp_path / "cp")

    def run() -> Any:
        query = (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.foreachBatch(writer)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(StreamingQueryException):  # returned below, and asserted on
            query.awaitTermination()
        return query.exception()

    assert run() is not None and failed == [1]  # batch 1 was written, then the query failed
    assert run() is None
    writer.close()
    assert writer.rollbacks == 1
    assert plain_read(spark, table) == ids_of([0, 1, 2])
