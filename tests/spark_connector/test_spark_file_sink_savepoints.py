"""Savepoints of queries that write with Spark's built-in file sink (``SparkFileSink``).

Real local PySpark and a real ``snapcoord serve`` on the shared ZooKeeper + S3. Each query reads JSON
files (one per batch, oldest first) and writes them with ``writeStream.format(...).option("path",
table)``; the sink log compacts every 3 batches. Every input row has a unique id, so "each batch once"
is a ``Counter`` check of what ``spark.read`` returns.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness import s3a
from harness.coordinator import CoordinatorProcess
from harness.file_sink_streams import SCHEMA, publish_inputs, run_file_sink
from harness.kafka import KafkaBroker, json_topic
from harness.locations import TestDir
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.savepoints.app_snapshots import SnapshotQuery, take_snapshot
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, restore_snapshot
from snapcoord.spark_connector.savepoints.spark_file_sink import SparkFileSink
from snapcoord.spark_connector.sink.protocols import RestoreRefused
from snapcoord.spark_connector.sink.spark_sink_log import COMPACT_INTERVAL_CONF, LOG_DIR
from snapcoord.spark_connector.storage import LocalStorage, Storage, open_location

pytestmark = pytest.mark.spark

#: Tables on the local disk, S3 (s3a://) and HDFS; sftp (reads byte by byte) is left to the small cases.
HEAVY = pytest.mark.parametrize("test_dir", ["local", "s3a", "hdfs"], indirect=True)

ROWS = 5
RETAIN_CONF = "spark.sql.streaming.minBatchesToRetain"
CLEANUP_DELAY_CONF = "spark.sql.streaming.fileSink.log.cleanupDelay"


@pytest.fixture
def client(zk_coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(zk_coordinator.target, timeout_s=30) as c:
        yield c


def set_confs(spark: SparkSession, confs: dict[str, str]) -> Iterator[None]:
    before: dict[str, str | None] = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    yield
    for k, old in before.items():
        if old is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, old)


@pytest.fixture
def compact_every_3(spark: SparkSession) -> Iterator[None]:
    yield from set_confs(spark, {COMPACT_INTERVAL_CONF: "3"})


@pytest.fixture
def eager_log_cleanup(spark: SparkSession) -> Iterator[None]:
    """Spark's sink log retention deletes entries below the newest compaction 2 batches back, at
    once (by default: 100 batches back, after 10 minutes)."""
    yield from set_confs(spark, {COMPACT_INTERVAL_CONF: "3", RETAIN_CONF: "2", CLEANUP_DELAY_CONF: "0"})


def publish(source: Path, files: range) -> None:
    publish_inputs(source, files, ROWS)


def run(
    spark: SparkSession,
    source: Path | Callable[[SparkSession], object],
    checkpoint: Path,
    table: Path | str,
    fmt: str,
) -> None:
    run_file_sink(spark, source, checkpoint, table, fmt)


def table_ids(spark: SparkSession, table: Path | str, fmt: str) -> Counter[int]:
    return Counter(int(r["id"]) for r in spark.read.format(fmt).schema(SCHEMA).load(str(table)).collect())


def streamed_ids(
    spark: SparkSession, table: Path | str, fmt: str, checkpoint: Path, name: str
) -> Counter[int]:
    query = (
        spark.readStream.format(fmt)
        .schema(SCHEMA)
        .load(str(table))
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return Counter(int(r["id"]) for r in spark.sql(f"select id from {name}").collect())


def ids_of(files: range) -> Counter[int]:
    return Counter(i * ROWS + j for i in files for j in range(ROWS))


def log_names(table: Path | TestDir) -> list[str]:
    """The sink log's object names (checksum files aside), as the table's file server keeps them."""
    log = (
        table.storage.child(f"table/{LOG_DIR}")
        if isinstance(table, TestDir)
        else LocalStorage(table / LOG_DIR)
    )
    return sorted(e.name for e in log.list() if not e.name.startswith("."))


def log_bytes(table: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (table / LOG_DIR).iterdir()}


def table_storage(test_dir: TestDir, s3_server: SeaweedS3Server, spark: SparkSession) -> Storage:
    """The table of ``test_dir`` as the connector reaches it without Spark's JVM where it can (s3fs for
    s3a, as under Spark Connect). HDFS has no JVM-free path here (fsspec's needs the native libhdfs):
    it is reached through Spark's Hadoop file system, as the query reaches it."""
    location = test_dir.uri_of("table")
    if test_dir.kind == "hdfs":
        return open_location(location, spark=spark)
    options = s3a.s3fs_options(s3_server) if test_dir.kind == "s3a" else None
    return open_location(location, use_jvm=False, storage_options=options)


def snapshot(client: CoordinatorClient, app: str, name: str, cp: Path, sink: SparkFileSink) -> int:
    snap = take_snapshot(client, app, [SnapshotQuery(name, str(cp), sink=sink)], timeout_s=120)
    return snap.generation


@HEAVY
def test_restore_then_run_again_shows_each_batch_once(
    spark: SparkSession,
    client: CoordinatorClient,
    tmp_path: Path,
    test_dir: TestDir,
    compact_every_3: None,
) -> None:
    """Local, on S3 (s3a://) and on HDFS (the table; the checkpoints stay local). The connector
    reaches the table as the query does: through Spark's Hadoop file system."""
    source, cp, table = tmp_path / "in", tmp_path / "cp", test_dir.uri_of("table")
    publish(source, range(5))
    run(spark, source, cp, table, "parquet")
    sink = SparkFileSink(table, spark=spark)
    assert sink.last_batch_id() == 4  # the sink log's batch ids are the query's
    generation = snapshot(client, f"fs-roundtrip-{test_dir.kind}", "q", cp, sink)

    publish(source, range(5, 12))
    run(spark, source, cp, table, "parquet")
    assert sink.last_batch_id() == 11
    assert {"5.compact", "8.compact", "11.compact"} <= set(log_names(test_dir))

    restored = restore_snapshot(
        client,
        f"fs-roundtrip-{test_dir.kind}",
        generation,
        [RestoreTarget("q", str(tmp_path / "cp2"), sink=sink)],
    )
    assert restored["q"].batch_id == 4
    assert sink.last_batch_id() == 4
    assert max(int(n.removesuffix(".compact")) for n in log_names(test_dir)) == 4
    assert table_ids(spark, table, "parquet") == ids_of(range(5))

    run(spark, source, tmp_path / "cp2", table, "parquet")
    assert sink.last_batch_id() == 11
    assert table_ids(spark, table, "parquet") == ids_of(range(12))
    assert streamed_ids(
        spark, table, "parquet", tmp_path / "reader", f"fs_roundtrip_{test_dir.kind}"
    ) == ids_of(range(12))


def test_kafka_query_restored_into_the_file_sink_reads_on_from_the_snapshots_offsets(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path, kafka: KafkaBroker, compact_every_3: None
) -> None:
    """A topic of two partitions, ten records a batch, into Spark's own file sink: the snapshot holds
    the topic's offsets at its batch; the restored query reads on from them, each record once."""
    topic, cp, table = f"fs-kafka-{os.getpid()}", tmp_path / "cp", str(tmp_path / "table")
    kafka.create_topic(topic, partitions=2)

    def read(s: SparkSession) -> object:
        return json_topic(s, kafka.bootstrap, topic, SCHEMA, max_offsets_per_trigger=10)

    kafka.produce_ids(topic, range(50))  # 25 a partition: batches 0-4, five of each a batch
    run(spark, read, cp, table, "parquet")
    sink = SparkFileSink(table, spark=spark)
    assert sink.last_batch_id() == 4
    generation = snapshot(client, "fs-kafka", "q", cp, sink)
    (task,) = client.get_snapshot("fs-kafka", generation).tasks
    assert task.committed_offsets == (Offset(f"q.0:{topic}", 0, 25), Offset(f"q.0:{topic}", 1, 25))

    kafka.produce_ids(topic, range(50, 120))
    run(spark, read, cp, table, "parquet")
    assert sink.last_batch_id() == 11
    restored = restore_snapshot(
        client, "fs-kafka", generation, [RestoreTarget("q", str(tmp_path / "cp2"), sink=sink)]
    )
    assert restored["q"].batch_id == 4
    assert table_ids(spark, table, "parquet") == Counter(range(50))

    run(spark, read, tmp_path / "cp2", table, "parquet")
    assert sink.last_batch_id() == 11
    assert table_ids(spark, table, "parquet") == Counter(range(120))


@HEAVY
def test_restore_writes_back_what_spark_cleaned_up_below_a_compaction(
    spark: SparkSession,
    client: CoordinatorClient,
    tmp_path: Path,
    test_dir: TestDir,
    s3_server: SeaweedS3Server,
    eager_log_cleanup: None,
) -> None:
    """The data-loss case: Spark's retention deleted the log entries of the snapshot's batch; only a
    compaction above the cut still lists those files. Deleting it would empty the table: the restore
    writes the entries back first. Local, on S3 (s3a://) and on HDFS."""
    source, cp, table = tmp_path / "in", tmp_path / "cp", test_dir.uri_of("table")
    publish(source, range(5))
    run(spark, source, cp, table, "json")
    sink = SparkFileSink(table_storage(test_dir, s3_server, spark), spark=spark)
    generation = snapshot(client, f"fs-cleanup-{test_dir.kind}", "q", cp, sink)

    publish(source, range(5, 12))
    run(spark, source, cp, table, "json")
    names = log_names(test_dir)
    assert "8.compact" in names and "4" not in names and "2.compact" not in names, names

    restore_snapshot(
        client,
        f"fs-cleanup-{test_dir.kind}",
        generation,
        [RestoreTarget("q", str(tmp_path / "cp2"), sink=sink)],
    )
    assert log_names(test_dir) == ["2.compact", "3", "4"]
    assert table_ids(spark, table, "json") == ids_of(range(5))
    run(spark, source, tmp_path / "cp2", table, "json")
    assert table_ids(spark, table, "json") == ids_of(range(12))


def test_restore_refuses_a_sink_cut_below_the_snapshot_since(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path, compact_every_3: None
) -> None:
    source, cp, table = tmp_path / "in", tmp_path / "cp", tmp_path / "table"
    publish(source, range(3))
    run(spark, source, cp, table, "parquet")
    sink = SparkFileSink(LocalStorage(table), spark=spark)
    early = snapshot(client, "fs-refuse", "q", cp, sink)  # batch 2
    publish(source, range(3, 8))
    run(spark, source, cp, table, "parquet")
    late = snapshot(client, "fs-refuse", "q", cp, sink)  # batch 7

    def refused(generation: int, match: str) -> None:
        """The restore raises ``RestoreRefused`` and changes neither the log nor any checkpoint."""
        before = log_bytes(table)
        target = RestoreTarget("q", str(tmp_path / "cp-refused"), sink=sink)
        with pytest.raises(RestoreRefused, match=match):
            restore_snapshot(client, "fs-refuse", generation, [target])
        assert log_bytes(table) == before and not (tmp_path / "cp-refused").exists()

    restore_snapshot(client, "fs-refuse", early, [RestoreTarget("q", str(tmp_path / "cp-early"), sink=sink)])
    assert sink.last_batch_id() == 2
    # The log now ends below the later snapshot.
    refused(late, "ends at batch 2")
    # The restored query writes batches 3..7 again (other part files): the log reaches batch 7, but
    # it is not the history the later snapshot recorded.
    run(spark, source, tmp_path / "cp-early", table, "parquet")
    assert sink.last_batch_id() == 7
    refused(late, "no longer begins with")
    assert table_ids(spark, table, "parquet") == ids_of(range(8))
    # A data file the restored log would list is gone.
    os.unlink(sink.log.files_at(2)[0].path.removeprefix("file:"))
    refused(early, "data file")
