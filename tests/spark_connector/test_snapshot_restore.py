"""Snapshots that own a copy of each query's checkpoint, and restores that roll the sinks back.

Real local PySpark (classic, and Spark Connect through the Connect job of the exactly-once tests), a
real ``snapcoord serve`` on the shared ZooKeeper + S3. The last tests are about a restore's completion
point (``restore_target``). Queries read JSON files (one file per batch,
``availableNow`` unless a test needs a running query), or a Kafka topic of the session's broker (ten
records per batch), into ``exactly_once`` over a ``PartitionedFileSink``; every input record has a
unique id, so "exactly once" is a ``Counter`` check.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from harness import s3a
from harness.coordinator import CoordinatorProcess
from harness.kafka import KafkaBroker, json_topic
from harness.locations import FIXTURE_OF_KIND, TestDir
from harness.process import wait_until
from harness.seaweed import SeaweedS3Server
from harness.spark_connect import SparkConnectServer
from snapcoord.client import CoordinatorClient, Offset, SnapshotState
from snapcoord.spark_connector.savepoints import restore as restore_module
from snapcoord.spark_connector.savepoints.app_snapshots import (
    ARCHIVE_KEY,
    BATCH_ID_KEY,
    SnapshotQuery,
    take_snapshot,
)
from snapcoord.spark_connector.savepoints.checkpoint_archive import send_cut
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, restore_snapshot
from snapcoord.spark_connector.savepoints.restore_target import (
    PLACEHOLDER_LINE,
    RestoreMarker,
    claim_target,
    complete,
    write_archive,
)
from snapcoord.spark_connector.sink.commit_log import commits_fingerprint
from snapcoord.spark_connector.sink.epochs import Fenced
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once
from snapcoord.spark_connector.storage import Storage, open_location

pytestmark = pytest.mark.spark

#: The stores of the heavy cases (sftp, whose reads go byte by byte, keeps the crashed restore only).
HEAVY = pytest.mark.parametrize("test_dir", ["local", "s3a", "hdfs"], indirect=True)

SCHEMA = "id INT"
RECORDS_PER_FILE = 10
CONNECT_JOB = Path(__file__).parent / "jobs" / "exactly_once_connect_job.py"


@pytest.fixture(scope="module")
def coordinator(zk_coordinator: CoordinatorProcess) -> str:
    return zk_coordinator.target


@pytest.fixture
def client(coordinator: str) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(coordinator, timeout_s=30) as c:
        yield c


def publish(directory: Path, first: int, count: int, *, bucket: bool = False) -> None:
    """Input files ``first .. first+count-1``; file ``i`` holds ids ``10i .. 10i+9``; atomic renames."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        tmp = directory.parent / f".tmp-{directory.name}-{i}.json"
        ids_ = [i * RECORDS_PER_FILE + j for j in range(RECORDS_PER_FILE)]
        rows = [{"id": n, "bucket": f"b{n % 3}"} if bucket else {"id": n} for n in ids_]
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, directory / f"in-{i:03d}.json")


def kafka_input(kafka: KafkaBroker, topic: str) -> Callable[[SparkSession], DataFrame]:
    """``topic`` as a query's source; "file" ``i`` of ``feed`` is one batch (five records a partition)."""
    return lambda spark: json_topic(
        spark, kafka.bootstrap, topic, SCHEMA, max_offsets_per_trigger=RECORDS_PER_FILE
    )


def feed(kafka: KafkaBroker, topic: str, first: int, count: int) -> None:
    """The records of "files" ``first .. first+count-1`` (as ``publish`` writes them) to ``topic``."""
    kafka.produce_ids(topic, range(first * RECORDS_PER_FILE, (first + count) * RECORDS_PER_FILE))


def expected(files: int) -> Counter[int]:
    return Counter(range(files * RECORDS_PER_FILE))


def ids(sink: PartitionedFileSink) -> Counter[int]:
    return Counter(int(r["id"]) for r in sink.read_json_records())


def ids_below(sink: PartitionedFileSink, positions: tuple[Offset, ...]) -> Counter[int]:
    """The ids a sink held at ``positions`` (its commits below the recorded sequence)."""
    (limit,) = [p.offset for p in positions if p.partition == 0]
    out: Counter[int] = Counter()
    for commit in sink.commits():
        if commit.seq < limit:
            for f in commit.files:
                out.update(
                    int(json.loads(line)["id"]) for line in sink.storage.read_bytes(f).decode().splitlines()
                )
    return out


def committed_content(sink: PartitionedFileSink) -> dict[str, str]:
    """Every visible commit and the SHA-256 of each file it lists: what must survive a restore."""
    return {
        f"{c.file_name}:{f}": hashlib.sha256(sink.storage.read_bytes(f)).hexdigest()
        for c in sink.commits()
        for f in c.files
    }


def small_key(client: CoordinatorClient, app: str, generation: int, task: str, key: str) -> str:
    return b"".join(client.read_checkpoint(app, generation, task, key)).decode()


Transform = Callable[[DataFrame], DataFrame]


def run_available_now(
    spark: SparkSession,
    coordinator: str,
    name: str,
    source: Path | Callable[[SparkSession], DataFrame],
    checkpoint: Path | str,
    table: Path,
    *,
    transform: Transform | None = None,
    output_mode: str = "append",
    finish: bool = True,
) -> list[int]:
    """One availableNow run (one input file per batch, or ``source(spark)``) to the end; returns the
    executed batch ids. ``finish=False`` leaves the last batch's record in the coordinator, as a
    crashed driver does."""
    writer = exactly_once(
        PartitionedFileSink(table, name=name),
        coordinator,
        query_name=name,
        checkpoint_location=str(checkpoint),
    )
    if callable(source):
        df = source(spark)
    else:
        df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    stream = (transform(df) if transform else df).writeStream.queryName(name).outputMode(output_mode)
    query = (
        stream.foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
        assert query.exception() is None
        if finish:
            writer.finish(query)
    finally:
        query.stop()
        writer.close()
    return [p.batchId for p in query.recentProgress if "addBatch" in (p.durationMs or {})]


# -- the sink's cut: what it removes and, above all, what it keeps --------------------------------------


def test_sink_restore_keeps_everything_the_snapshot_includes(spark: SparkSession, tmp_path: Path) -> None:
    table = tmp_path / "t"
    df = spark.createDataFrame([(i, f"b{i % 2}") for i in range(4)], "id long, bucket string")
    run1 = PartitionedFileSink(table, partition_by=["bucket"])
    run1.fence(1)
    run1.write(df, 0)
    run1.write(df.filter("id < 2"), 1)
    run2 = PartitionedFileSink(table, partition_by=["bucket"])
    run2.fence(2)  # a later run of the same lineage writes batch 2
    run2.write(df.filter("id >= 2"), 2)
    at_batch_2 = run2.batch_end_positions(2)
    # Log entries 0 and 3 are the fences' empty batches: batch 2 is entry 4.
    assert at_batch_2 == [Offset("t", 0, 5), Offset("t", 2, commits_fingerprint(run2.commits(), 5))]
    kept = committed_content(run2)
    assert run2.last_batch_id() == 2

    # After the snapshot: more batches of run 2, a run 3, and a half-written (uncommitted) write.
    run2.write(df, 3)
    run3 = PartitionedFileSink(table, partition_by=["bucket"])
    run3.fence(3)
    run3.write(df, 4)
    junk = table / "bucket=b0" / f"_w-s9-e3-a{'c' * 12}-p0" / "part-00000-junk.json"  # never committed
    junk.parent.mkdir()
    junk.write_text('{"id": 99}\n')
    assert run3.last_batch_id() == 4
    with pytest.raises(LookupError, match="no batch 7 in its log"):
        run3.batch_end_positions(7)

    restorer = PartitionedFileSink(table, partition_by=["bucket"])
    with pytest.raises(Fenced, match="fence the sink"):
        restorer.restore_to(at_batch_2)  # not holding the newest epoch: refuses, deletes nothing
    assert run3.last_batch_id() == 4
    restorer.fence(4)
    restorer.restore_to(at_batch_2)
    assert committed_content(restorer) == kept  # batches 0-2, of runs 1 and 2, byte for byte
    assert sorted(int(r["id"]) for r in restorer.read_json_records()) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert len(list(table.glob("bucket=*/_w-*/part-*"))) == sum(len(c.files) for c in restorer.commits())
    restorer.restore_to(at_batch_2)  # idempotent
    assert committed_content(restorer) == kept
    with pytest.raises(Fenced):
        run3.write(df, 5)  # the old run is shut out
    # The next write takes a number above everything the cut removed: positions stay meaningful.
    restorer.write(df, 3)
    assert restorer.commits()[-1].seq > 7 and committed_content(restorer).items() >= kept.items()


# -- restores on classic Spark ----------------------------------------------------------------------------


@HEAVY
def test_restore_into_the_same_sink_after_retention_is_exactly_once(
    spark: SparkSession, coordinator: str, client: CoordinatorClient, tmp_path: Path, test_dir: TestDir
) -> None:
    """minBatchesToRetain=3: snapshot at batch 1, run to batch 8 (Spark purges batch 1), restore.
    Checkpoints on the local disk, on S3 (s3a://) and on HDFS."""
    name, app = f"ret-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    source, table = tmp_path / "in", tmp_path / "table"
    checkpoint, restored_cp = test_dir.uri_of("cp"), test_dir.uri_of("restored")
    sink = PartitionedFileSink(table, name=name)
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", "3")
    try:
        publish(source, 0, 2)
        assert run_available_now(spark, coordinator, name, source, checkpoint, table) == [0, 1]
        # The query has stopped (availableNow): the snapshot comes from its checkpoint alone.
        snapshot = take_snapshot(client, app, [SnapshotQuery(name, checkpoint, sink)], timeout_s=120)
        assert snapshot.state is SnapshotState.COMPLETED
        assert small_key(client, app, snapshot.generation, name, BATCH_ID_KEY) == "1"
        # The committed offsets come from the offsets log: the file source's log offset of batch 1.
        (task,) = client.get_snapshot(app, snapshot.generation).tasks
        assert task.committed_offsets == (Offset(f"{name}.0", 0, 1),)
        at_snapshot = committed_content(sink)

        publish(source, 2, 7)
        ran = run_available_now(spark, coordinator, name, source, checkpoint, table, finish=False)
        assert ran == list(range(2, 9))
        assert not test_dir.storage.exists("cp/offsets/1")  # retention: the live copy of batch 1 is gone
        assert ids(sink) == expected(9)
        # The old run's record of batch 8 stays: the restored run meets it at its own batch 8 and must
        # neither roll back to it (it is another query id's) nor be fenced by it.
        client.get_producer_offsets(f"{name}.b8")

        done = restore_snapshot(client, app, snapshot.generation, [RestoreTarget(name, restored_cp, sink)])
        assert done[name].batch_id == 1
        assert done[name].sink_positions == (
            Offset(name, 0, 3),  # log entry 0 is the fence's empty batch
            Offset(name, 2, commits_fingerprint(sink.commits(), 3)),
        )
        # The sink holds exactly the snapshot's output: nothing committed at or before it was touched.
        assert committed_content(sink) == at_snapshot
        assert ids(sink) == expected(2)
        old_id = json.loads(test_dir.storage.read_bytes("cp/metadata").splitlines()[0])["id"]
        assert done[name].query_id != old_id

        publish(source, 9, 1)  # new input after the restore
        assert run_available_now(spark, coordinator, name, source, restored_cp, table) == list(range(2, 10))
        assert ids(sink) == expected(10)  # each record exactly once
        assert committed_content(sink).items() >= at_snapshot.items()
    finally:
        spark.conf.unset("spark.sql.streaming.minBatchesToRetain")


def test_restore_rewinds_a_kafka_query_to_the_snapshots_offsets(
    spark: SparkSession, coordinator: str, client: CoordinatorClient, tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Snapshot a query over a two-partition topic, read on, restore: the snapshot's committed offsets
    are the topic's offsets in Spark's offsets log (the broker's end offsets, all read by then), and
    the restored query goes on from them, each record once."""
    name, app = f"kafka-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    table, checkpoint, restored_cp = tmp_path / "table", tmp_path / "cp", tmp_path / "restored"
    kafka.create_topic(name, partitions=2)
    source, sink = kafka_input(kafka, name), PartitionedFileSink(table, name=name)
    feed(kafka, name, 0, 2)
    assert run_available_now(spark, coordinator, name, source, checkpoint, table) == [0, 1]

    snapshot = take_snapshot(client, app, [SnapshotQuery(name, str(checkpoint), sink)], timeout_s=120)
    assert snapshot.state is SnapshotState.COMPLETED
    assert kafka.end_offsets(name) == {0: 10, 1: 10}
    # Spark's offsets log of batch 1 names the topic's offsets; the snapshot's committed offsets are
    # they, one stream per topic of the query's source 0.
    logged = (checkpoint / "offsets" / "1").read_text().splitlines()[2]
    assert json.loads(logged) == {name: {"0": 10, "1": 10}}
    (task,) = client.get_snapshot(app, snapshot.generation).tasks
    assert task.committed_offsets == (Offset(f"{name}.0:{name}", 0, 10), Offset(f"{name}.0:{name}", 1, 10))
    at_snapshot = committed_content(sink)

    feed(kafka, name, 2, 3)
    assert run_available_now(spark, coordinator, name, source, checkpoint, table, finish=False) == [2, 3, 4]
    assert ids(sink) == expected(5)

    done = restore_snapshot(client, app, snapshot.generation, [RestoreTarget(name, str(restored_cp), sink)])
    assert done[name].batch_id == 1
    assert committed_content(sink) == at_snapshot and ids(sink) == expected(2)
    # The restored checkpoint ends at the snapshot's batch, with its Kafka offsets: the next batch
    # starts there (Spark's offsets log, not the broker's latest, says where).
    restored_offsets = sorted(int(p.name) for p in (restored_cp / "offsets").iterdir() if p.name.isdigit())
    assert restored_offsets[-1] == 1
    assert (restored_cp / "offsets" / "1").read_text().splitlines()[2] == logged

    feed(kafka, name, 5, 1)
    assert run_available_now(spark, coordinator, name, source, restored_cp, table) == [2, 3, 4, 5]
    assert ids(sink) == expected(6)  # the records after the snapshot once, the ones before it once
    assert committed_content(sink).items() >= at_snapshot.items()


def count_by_key(df: DataFrame) -> DataFrame:
    return df.groupBy((F.col("id") % 7).alias("k")).count()


ROCKSDB = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
}


@pytest.mark.parametrize(
    ("where", "conf", "reads"),
    [
        ("local", {}, "files"),
        ("s3a", ROCKSDB, "files"),
        ("hdfs", ROCKSDB, "files"),
        ("local", ROCKSDB, "kafka"),
    ],
    ids=["local-hdfs-state", "s3a-rocksdb-v2", "hdfs-rocksdb-v2", "kafka-local-rocksdb-v2"],
)
def test_stateful_restore_after_the_checkpoint_is_deleted(
    spark: SparkSession,
    coordinator: str,
    client: CoordinatorClient,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    where: str,
    conf: dict[str, str],
    reads: str,
) -> None:
    """The default state store on the local disk; RocksDB with changelog checkpointing and
    checkpoint format v2 on S3 (s3a://) and on HDFS (the state files' names carry unique ids there);
    RocksDB over a Kafka topic (the restored query reads on from the snapshot's Kafka offsets)."""
    name, app = f"agg-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    directory: TestDir = request.getfixturevalue(FIXTURE_OF_KIND[where])
    files, table = tmp_path / "in", tmp_path / "table"
    source: Path | Callable[[SparkSession], DataFrame] = files
    add_input: Callable[[int, int], None] = functools.partial(publish, files)
    if reads == "kafka":
        kafka: KafkaBroker = request.getfixturevalue("kafka")
        kafka.create_topic(name, partitions=2)
        source, add_input = kafka_input(kafka, name), functools.partial(feed, kafka, name)

    checkpoint, restored_cp = directory.uri_of("cp"), directory.uri_of("restored")
    sink = PartitionedFileSink(table, name=name)
    for key, value in conf.items():
        spark.conf.set(key, value)

    def unset() -> None:
        for key in conf:
            spark.conf.unset(key)

    request.addfinalizer(unset)

    def run(cp: str) -> list[int]:
        return run_available_now(
            spark, coordinator, name, source, cp, table, transform=count_by_key, output_mode="update"
        )

    add_input(0, 2)
    assert run(checkpoint) == [0, 1]
    snapshot = take_snapshot(client, app, [SnapshotQuery(name, checkpoint, sink)], timeout_s=120)
    add_input(2, 1)
    assert run(checkpoint) == [2]
    directory.storage.delete_tree("cp")  # the original checkpoint is gone for good

    restore_snapshot(client, app, snapshot.generation, [RestoreTarget(name, restored_cp, sink)])
    state_files = [p for p in tree(directory.storage, "restored/state") if not p.endswith("metadata")]
    assert state_files
    if conf:
        assert any(p.endswith(".zip") or p.endswith(".changelog") for p in state_files), state_files
    add_input(3, 1)
    assert run(restored_cp) == [2, 3]

    # Update mode: the latest row of each key is its count over everything read. A run without the
    # restore counts every input record once: the counts of ids 0..39 by id % 7.
    final = {int(r["k"]): int(r["count"]) for r in sink.read_json_records()}
    assert final == dict(Counter(i % 7 for i in range(4 * RECORDS_PER_FILE)))


def start_continuous(
    spark: SparkSession, coordinator: str, name: str, source: Path, checkpoint: Path | str, table: Path
) -> Any:
    writer = exactly_once(
        PartitionedFileSink(table, name=name),
        coordinator,
        query_name=name,
        checkpoint_location=str(checkpoint),
    )
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.queryName(name)
        .foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )


def test_two_query_pipeline_cut_holds_and_restore_is_exactly_once_end_to_end(
    spark: SparkSession,
    coordinator: str,
    client: CoordinatorClient,
    tmp_path: Path,
    s3a_dir: TestDir,
    hdfs_dir: TestDir,
) -> None:
    """A: files -> table A; B: table A (a file stream over it) -> table B. Snapshot both while they run.
    A's checkpoints are on S3 (s3a://), B's on HDFS."""
    app, run = f"pipe-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    a, b = f"a-{run}", f"b-{run}"
    source, table_a, table_b = tmp_path / "in", tmp_path / "table-a", tmp_path / "table-b"
    cp = {a: s3a_dir.uri_of("cp-a"), b: hdfs_dir.uri_of("cp-b")}
    sink_a, sink_b = PartitionedFileSink(table_a, name=a), PartitionedFileSink(table_b, name=b)
    table_a.mkdir()
    publish(source, 0, 8)
    queries = [
        start_continuous(spark, coordinator, a, source, cp[a], table_a),
        start_continuous(spark, coordinator, b, table_a, cp[b], table_b),
    ]
    try:
        wait_until(lambda: len(sink_b.commits()) >= 2, timeout=120, what="B to commit two batches")
        snapshot = take_snapshot(
            client,
            app,
            [SnapshotQuery(a, cp[a], sink_a), SnapshotQuery(b, cp[b], sink_b, reads_from=(a,))],
            timeout_s=120,
        )
        wait_until(lambda: ids(sink_b) == expected(8), timeout=180, what="the pipeline to drain")
    finally:
        for q in queries:
            q.stop()
    for q in queries:
        assert q.exception() is None

    def positions(query: str) -> tuple[Offset, ...]:
        raw = json.loads(small_key(client, app, snapshot.generation, query, "sink_positions"))
        return tuple(Offset(s, p, o) for s, p, o in raw)

    snap_a, snap_b = ids_below(sink_a, positions(a)), ids_below(sink_b, positions(b))
    # The cut: B's snapshot holds nothing that A's does not.
    assert snap_b and not (snap_b - snap_a), snap_b - snap_a

    restore_snapshot(
        client,
        app,
        snapshot.generation,
        [
            RestoreTarget(a, s3a_dir.uri_of("cp-a2"), sink_a),
            RestoreTarget(b, str(tmp_path / "cp-b2"), sink_b),
        ],
    )
    assert ids(sink_a) == snap_a and ids(sink_b) == snap_b
    publish(source, 8, 1)
    run_available_now(spark, coordinator, a, source, s3a_dir.uri_of("cp-a2"), table_a)
    run_available_now(spark, coordinator, b, table_a, tmp_path / "cp-b2", table_b)
    assert ids(sink_a) == expected(9)
    assert ids(sink_b) == expected(9)  # every record once, end to end


def test_snapshot_completes_right_after_a_restart_without_input(
    spark: SparkSession, coordinator: str, client: CoordinatorClient, tmp_path: Path
) -> None:
    name, app = f"idle-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    source, checkpoint, table = tmp_path / "in", tmp_path / "cp", tmp_path / "table"
    publish(source, 0, 2)
    first = start_continuous(spark, coordinator, name, source, checkpoint, table)
    first.processAllAvailable()
    first.stop()
    restarted = start_continuous(spark, coordinator, name, source, checkpoint, table)
    try:
        # No new input, no progress event of the new run: the checkpoint alone names batch 1.
        sink = PartitionedFileSink(table, name=name)
        snapshot = take_snapshot(client, app, [SnapshotQuery(name, str(checkpoint), sink)], timeout_s=60)
        assert snapshot.state is SnapshotState.COMPLETED
        assert small_key(client, app, snapshot.generation, name, BATCH_ID_KEY) == "1"
        # The committed offsets come from the offsets log: the file source's log offset of batch 1.
        (task,) = client.get_snapshot(app, snapshot.generation).tasks
        assert task.committed_offsets == (Offset(f"{name}.0", 0, 1),)
        assert restarted.exception() is None and restarted.isActive
    finally:
        restarted.stop()


# -- Spark Connect -------------------------------------------------------------------------------------------


def run_connect_job(
    server: SparkConnectServer,
    coordinator: str,
    root: Path,
    checkpoint: str,
    name: str,
    storage_options: dict[str, object],
) -> Any:
    argv = [
        sys.executable, str(CONNECT_JOB), "--remote", server.url, "--target", coordinator,
        "--input", str(root / "input"), "--checkpoint", checkpoint, "--table", str(root / "table"),
        "--query-name", name, "--storage-options", json.dumps(storage_options),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, (
        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{server.log_tail()}"
    )
    return json.loads(lines[-1])


@pytest.mark.timeout(600)  # three Connect jobs, each a client process and a query on the server
def test_snapshot_and_restore_under_spark_connect(
    spark_connect_server: SparkConnectServer,
    spark_connect: Any,
    coordinator: str,
    client: CoordinatorClient,
    tmp_path: Path,
    s3a_dir: TestDir,
    s3_server: SeaweedS3Server,
) -> None:
    """The queries run on the Connect server, their checkpoints on S3 (``s3a://``, which the server's
    Spark reaches through hadoop-aws): the server's Python worker (``exactly_once``) and this client
    process (snapshot and restore, given the Connect session: no JVM here) reach them through fsspec
    (s3fs) with the same ``storage_options``. The local-disk case of the
    Connect worker's checkpoint reads is covered by test_exactly_once_connect."""
    name, app = f"connect-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    checkpoint, restored = s3a_dir.uri_of("chk"), s3a_dir.uri_of("chk-restored")
    options = s3a.s3fs_options(s3_server)
    sink = PartitionedFileSink(tmp_path / "table", partition_by=["bucket"], name="connect-table")
    publish(tmp_path / "input", 0, 2, bucket=True)
    result = run_connect_job(spark_connect_server, coordinator, tmp_path, checkpoint, name, options)
    assert result["session"] == "pyspark.sql.connect.session.SparkSession" and result["batches"] == [0, 1]

    query = SnapshotQuery(name, checkpoint, sink)
    via_connect: dict[str, Any] = {"spark": spark_connect, "storage_options": options}
    snapshot = take_snapshot(client, app, [query], timeout_s=120, **via_connect)
    assert small_key(client, app, snapshot.generation, name, BATCH_ID_KEY) == "1"
    publish(tmp_path / "input", 2, 2, bucket=True)
    again = run_connect_job(spark_connect_server, coordinator, tmp_path, checkpoint, name, options)
    assert again["batches"] == [2, 3]
    client.get_producer_offsets(f"{name}.b3")  # the old run's last record, met again by the restored run

    restore_snapshot(
        client,
        app,
        snapshot.generation,
        [RestoreTarget(name, restored, sink)],
        **via_connect,
    )
    assert ids(sink) == expected(2)
    publish(tmp_path / "input", 4, 1, bucket=True)
    result = run_connect_job(spark_connect_server, coordinator, tmp_path, restored, name, options)
    assert result["batches"] == [2, 3, 4]
    assert ids(sink) == expected(5)


# -- a restore's completion point: a half-restored checkpoint is refused by Spark and by every restore
# but its own retry, which completes it; a crash touches neither the source checkpoint nor the snapshot


def tree(storage: Storage, path: str = "") -> dict[str, str]:
    """Every file below ``path`` and the SHA-256 of its bytes."""
    out: dict[str, str] = {}
    for entry in storage.list(path):
        rel = f"{path}/{entry.name}" if path else entry.name
        if entry.is_dir:
            out.update(tree(storage, rel))
        else:
            out[rel] = hashlib.sha256(storage.read_bytes(rel)).hexdigest()
    return out


def start_count(spark: SparkSession, source: Path, checkpoint: str, name: str) -> Any:
    """A stateful query (a running count) into a memory table, one input file per batch."""
    return (
        spark.readStream.schema("id INT")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy()
        .count()
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName(name)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )


@HEAVY
def test_spark_refuses_a_half_restored_checkpoint(
    spark: SparkSession, tmp_path: Path, test_dir: TestDir
) -> None:
    source, live, target_uri = tmp_path / "in", test_dir.uri_of("cp"), test_dir.uri_of("restored")
    publish(source, 0, 2)
    first = start_count(spark, source, live, f"c{uuid.uuid4().hex[:6]}")
    first.awaitTermination()
    cut, archive = send_cut(open_location(live, spark=spark), lambda _, chunks: b"".join(chunks))
    assert cut.batch_id == 1
    target = open_location(target_uri, spark=spark)
    marker = RestoreMarker.new("app", 1, "q", cut.batch_id)

    # Claimed only (the placeholder offsets/2, nothing else): refused at start.
    claim_target(target, marker)
    with pytest.raises(Exception, match="metadata file is missing"):
        start_count(spark, source, target_uri, f"c{uuid.uuid4().hex[:6]}")

    # Everything written but the completion point: the query fails before its first batch, with
    # the placeholder's explanation; nothing was read from the source.
    pending = write_archive(target, [archive], marker)
    name = f"c{uuid.uuid4().hex[:6]}"
    query = start_count(spark, source, target_uri, name)
    with pytest.raises(StreamingQueryException, match="unfinished restore"):
        query.awaitTermination()
    assert PLACEHOLDER_LINE.split(";")[0] in str(query.exception())
    assert query.recentProgress == [] and spark.table(name).collect() == []

    # Completed: the query resumes after batch 1 with its state (a count of 20 + 10 new records).
    complete(target, pending)
    publish(source, 2, 1)
    name = f"c{uuid.uuid4().hex[:6]}"
    resumed = start_count(spark, source, target_uri, name)
    resumed.awaitTermination()
    assert resumed.exception() is None
    assert [p.batchId for p in resumed.recentProgress if p.numInputRows] == [2]
    assert [r["count"] for r in spark.table(name).collect()] == [30]


class Crash(BaseException):
    """The restoring process dies: this and every later storage call fail (nothing is cleaned up)."""


class CrashingStorage:
    """A ``Storage`` whose process dies after ``writes`` successful writes."""

    def __init__(self, inner: Storage, writes: int) -> None:
        self._inner, self._left, self.crashed = inner, writes, False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.crashed:
                raise Crash(f"{name} after the crash")
            if name.startswith("write"):
                if self._left == 0:
                    self.crashed = True
                    raise Crash(f"{name} {args[0]}")
                self._left -= 1
            return attr(*args, **kwargs)

        return call


def test_a_crashed_restore_is_refused_until_its_retry_completes_it(
    spark: SparkSession,
    coordinator: str,
    client: CoordinatorClient,
    tmp_path: Path,
    remote: TestDir,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On sftp (the same protocol on the local disk: test_checkpoint_archive's cut-short stream and
    take-over tests, and the half-restored checkpoint test above)."""
    name, app = f"crash-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    source, table = tmp_path / "in", tmp_path / "table"
    live, target_uri = remote.uri_of("cp"), remote.uri_of("restored")
    sink = PartitionedFileSink(table, name=name)
    publish(source, 0, 2)
    assert run_available_now(spark, coordinator, name, source, live, table) == [0, 1]
    query = SnapshotQuery(name, live, sink)
    first = take_snapshot(client, app, [query], timeout_s=120)
    publish(source, 2, 2)
    assert run_available_now(spark, coordinator, name, source, live, table) == [2, 3]
    second = take_snapshot(client, app, [query], timeout_s=120)

    source_cp, target = remote.storage.child("cp"), remote.storage.child("restored")
    before = (tree(source_cp), committed_content(sink))
    archive = b"".join(client.read_checkpoint(app, first.generation, name, ARCHIVE_KEY))

    crashing: list[CrashingStorage] = []

    def open_and_crash(location: str, **kwargs: Any) -> Storage:
        crashing.append(CrashingStorage(open_location(location, **kwargs), writes=4))
        return crashing[-1]

    with monkeypatch.context() as m:
        m.setattr(restore_module, "open_location", open_and_crash)
        with pytest.raises(Crash):
            restore_snapshot(client, app, first.generation, [RestoreTarget(name, target_uri, sink)])
    assert crashing[0].crashed
    partial = tree(target)
    assert len(partial) == 4 and "offsets/2" in partial  # the placeholder first, then 3 files
    # Nothing of the source checkpoint, the sink (the crash came before any cut) or the snapshot.
    assert (tree(source_cp), committed_content(sink)) == before
    assert client.get_snapshot(app, first.generation).state is SnapshotState.COMPLETED
    assert b"".join(client.read_checkpoint(app, first.generation, name, ARCHIVE_KEY)) == archive

    # Spark refuses to start the partial checkpoint; no batch runs, the sink is untouched.
    with pytest.raises(Exception, match="unfinished restore"):
        run_available_now(spark, coordinator, name, source, target_uri, table)
    assert committed_content(sink) == before[1]
    # A restore of another snapshot into it is refused before anything is written or cut.
    with pytest.raises(FileExistsError, match="unfinished restore of"):
        restore_snapshot(client, app, second.generation, [RestoreTarget(name, target_uri, sink)])
    assert committed_content(sink) == before[1]
    assert set(tree(target)) >= set(partial)  # Spark's failed start may have added its metadata

    # The same restore again completes it: exactly once from the first snapshot on.
    done = restore_snapshot(client, app, first.generation, [RestoreTarget(name, target_uri, sink)])
    assert done[name].batch_id == 1 and ids(sink) == expected(2)
    assert tree(source_cp) == before[0]
    publish(source, 4, 1)
    assert run_available_now(spark, coordinator, name, source, target_uri, table) == [2, 3, 4]
    assert ids(sink) == expected(5)
