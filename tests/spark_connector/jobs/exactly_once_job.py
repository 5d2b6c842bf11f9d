"""A streaming driver for the exactly-once kill/restart tests: files or a Kafka topic -> PartitionedFileSink
(or Spark's own file sink).

Run as its own process (its own session, so the test can SIGKILL Python and JVM together):

    python exactly_once_job.py --input DIR --checkpoint DIR --table DIR --events FILE
                               --mode wrapped|plain|filesink [--target HOST:PORT] [--query-name NAME]
                               [--kafka HOST:PORT --topic TOPIC --jars JAR,JAR...]

It reads JSON-lines files from --input one file per micro-batch (trigger availableNow), writes every
batch to the table, and exits 0 when the input is drained. ``--mode wrapped`` goes through
``exactly_once``; ``plain`` calls ``sink.write`` directly (the control); ``filesink`` writes with
Spark's built-in file sink (``format("json").option("path", table)``) instead of ``foreachBatch``:
its exactly-once is Spark's own, the sink log, so its only pause point is ``record:<id>``. With
``--kafka`` it reads the same JSON records from a Kafka topic instead, from its earliest offsets, at
most ``--max-offsets`` records per micro-batch (Spark's Kafka source from ``--jars``).

Kill hooks: ``EO_PAUSE=<point>:<nth>`` makes the driver append ``pause <point> <batch_id>`` to the
events file and wait at <point> of the <nth> batch this process runs (1-based), so the test can
SIGKILL it exactly there; with ``EO_RELEASE=<file>`` it resumes once that file exists (a zombie),
otherwise it sleeps. Points, in the order a batch meets them:

- ``batch_start``: before anything, incl. the coordinator calls;
- ``after_delete``: the record of batch N-1 is deleted, N's is not registered yet;
- ``mid_rollback``: the rollback of an earlier attempt voided its first log entry;
- ``after_register``: N's record is registered, nothing is written;
- ``staging``: inside a Spark task of the sink's write (the other task finished its file);
- ``mid_write``: the part files of the batch's first partition are written, the others not;
- ``commit``: the fence check before the log entry passed, the entry is not written;
- ``after_write``: the sink write finished; Spark has not written the commit log.

With ``--mode filesink`` the one point is ``record:<id>`` (not a batch count): the task about to write
record ``<id>`` appends ``pause record <id>`` and waits there, inside Spark's write, before the sink
log's entry for the batch.

``EO_GO=<file>`` makes a standby: the driver starts its Spark session, appends ``ready`` and waits for
that file before it reads the checkpoint or builds the sink, so the test can boot the next driver's
JVM while the current one still runs, and let it go the moment it killed the current one.

Every process also appends ``start``, ``epoch <n>``, ``batch <id> begin/end``, ``rolled back <id>``
(the wrapper starts rolling an earlier attempt back), ``stale <n>`` and ``done`` lines.
``--no-finish`` skips ``writer.finish`` (a query stopped without it leaves its last record).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the harness
from harness.kafka import json_topic
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import ExactlyOnceWriter


class Events:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.pid = os.getpid()
        release = os.environ.get("EO_RELEASE", "")
        self.release = Path(release) if release else None
        spec = os.environ.get("EO_PAUSE", "")
        self.pause_point, _, nth = spec.partition(":")
        self.pause_nth = int(nth) if nth else 0
        self.batches_run = 0
        self.stale_before = 0
        self.epoch: int | None = None

    def emit(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"{self.pid} {line}\n")
            f.flush()
            os.fsync(f.fileno())

    def maybe_pause(self, point: str, batch_id: int) -> None:
        if self.pausing(point):
            self.emit(f"pause {point} {batch_id}")
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:  # the test SIGKILLs us here, or releases us
                if self.release is not None and self.release.exists():
                    self.emit(f"released {point} {batch_id}")
                    return
                time.sleep(0.1)

    def wait_for_go(self) -> None:
        """With ``EO_GO=<file>``: a standby driver, its Spark session up, that touches nothing of the
        query (checkpoint, table, coordinator) until that file exists."""
        go = os.environ.get("EO_GO", "")
        if not go:
            return
        self.emit("ready")
        deadline = time.monotonic() + 3600
        while not Path(go).exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"standby driver: no {go} within an hour")
            time.sleep(0.05)
        self.emit("go")

    def pausing(self, point: str) -> bool:
        return point == self.pause_point and self.batches_run == self.pause_nth


class HookedSink(PartitionedFileSink):
    events: Events | None = None
    batch_id = -1
    published = 0
    removed = 0
    committing = False

    def _wrote_part(self, n: int) -> None:
        super()._wrote_part(n)
        self.published += 1
        if self.published == 1 and self.events is not None:
            self.events.maybe_pause("mid_write", self.batch_id)

    def _void(self, commit: Any) -> None:
        super()._void(commit)
        self.removed += 1
        if self.removed == 1 and self.events is not None:
            self.events.maybe_pause("mid_rollback", self.batch_id)

    def _commit(self, commit: Any, files: Any) -> None:
        self.committing = True
        try:
            super()._commit(commit, files)
        finally:
            self.committing = False

    def check_epoch(self) -> None:
        super().check_epoch()
        if self.committing and self.events is not None:
            self.events.maybe_pause("commit", self.batch_id)  # passed the check, not yet committed


class HookedWriter(ExactlyOnceWriter):
    events: Events | None = None
    hooked_sink: HookedSink | None = None

    def _hook(self, point: str, batch_id: int) -> None:
        if self.events is None or self.hooked_sink is None:
            return
        if point == "before_rollback":
            self.events.emit(f"rolled back {batch_id}")
            self.hooked_sink.batch_id = batch_id
            self.hooked_sink.removed = 0
        elif point in ("after_delete", "after_register"):
            self.events.maybe_pause(point, batch_id)


def _stall_one_task(df: Any, events: Events, batch_id: int) -> Any:
    """``df`` with a task that pauses inside the executor (the ``staging`` kill point)."""
    driver_pid, path = events.pid, str(events.path)

    def run(index: int, rows: Any) -> Any:
        rows = list(rows)
        if index == 1:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{driver_pid} pause staging {batch_id}\n")
            time.sleep(3600)
        return iter(rows)

    return df.sparkSession.createDataFrame(df.rdd.mapPartitionsWithIndex(run), df.schema)


def _stall_at_record(source: Any, events: Events, record_id: int) -> Any:
    """``source`` through a Python UDF that stalls the task about to write record ``record_id``: a point
    inside a write of Spark's own file sink (the other task may have written its file), before the
    batch's entry in the sink log. It appends ``pause record <id>`` and waits like ``maybe_pause``."""
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import LongType

    driver_pid, path = events.pid, str(events.path)
    release = str(events.release or "")

    def through(n: int) -> int:
        if n == record_id:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{driver_pid} pause record {n}\n")
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline and not (release and os.path.exists(release)):
                time.sleep(0.1)
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{driver_pid} released record {n}\n")
        return n

    return source.select(udf(through, LongType())(col("id")).alias("id"), "bucket")


def _spark_file_sink(source: Any, events: Events, args: argparse.Namespace) -> Any:
    """The query of ``--mode filesink``: Spark's built-in JSON file sink at ``--table`` (its own
    ``_spark_metadata`` log is its commit), stalling at record ``N`` with ``EO_PAUSE=record:N``."""
    if events.pause_point == "record":
        source = _stall_at_record(source, events, events.pause_nth)
    return (
        source.writeStream.format("json")
        .option("path", args.table)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--input", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--mode", choices=("wrapped", "plain", "filesink"), required=True)
    p.add_argument("--target", default="")
    p.add_argument("--query-name", default="eo-test")
    p.add_argument("--no-finish", action="store_true")
    p.add_argument("--kafka", default="", help="bootstrap servers: read --topic instead of --input")
    p.add_argument("--topic", default="")
    p.add_argument("--max-offsets", type=int, default=10, help="maxOffsetsPerTrigger of the Kafka source")
    p.add_argument("--jars", default="", help="spark.jars (Spark's Kafka source)")
    args = p.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    events = Events(Path(args.events))
    events.emit("start")

    from pyspark.sql import SparkSession

    spark = (
        # Task retries as on a cluster (spark.task.maxFailures 4): see the tests' Spark session.
        SparkSession.builder.master("local[2,4]")
        .appName("snapcoord-exactly-once-job")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "5s")
        .config("spark.jars", args.jars)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    events.wait_for_go()
    if args.mode == "filesink":
        return _await(spark, _spark_file_sink(_source(spark, args), events, args), events, None, args)

    table: Any = args.table if "://" in args.table else Path(args.table)
    sink = HookedSink(table, partition_by=["bucket"], name="eo-table")
    sink.events = events

    writer: HookedWriter | None = None

    def write(df: Any, batch_id: int) -> None:
        if writer is not None and writer.stale_records > events.stale_before:
            events.emit(f"stale {batch_id}")
        if writer is not None and writer.epoch != events.epoch:
            events.epoch = writer.epoch
            events.emit(f"epoch {writer.epoch}")
        sink.batch_id = batch_id
        sink.published = 0
        out = df.repartition(2)  # two tasks, several files per batch
        if events.pausing("staging"):
            out = _stall_one_task(out, events, batch_id)
        sink.write(out, batch_id)
        events.maybe_pause("after_write", batch_id)

    def hooked(inner: Any) -> Any:
        def run(df: Any, batch_id: int) -> None:
            events.batches_run += 1
            events.emit(f"batch {batch_id} begin")
            events.maybe_pause("batch_start", batch_id)
            events.stale_before = writer.stale_records if writer is not None else 0
            inner(df, batch_id)
            events.emit(f"batch {batch_id} end")

        return run

    batch_fn: Any
    if args.mode == "wrapped":
        writer = HookedWriter(
            sink,
            args.target,
            query_name=args.query_name,
            batch_function=write,
            checkpoint_location=args.checkpoint,
        )
        writer.events = events
        writer.hooked_sink = sink
        batch_fn = hooked(writer)
    else:
        batch_fn = hooked(write)

    query = (
        _source(spark, args)
        .writeStream.foreachBatch(batch_fn)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    return _await(spark, query, events, writer, args)


def _source(spark: Any, args: argparse.Namespace) -> Any:
    """The records: the JSON files of ``--input``, one a batch, or the ``--topic``'s, ``--max-offsets``
    a batch."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("id", LongType()), StructField("bucket", StringType())])
    if args.kafka:
        return json_topic(spark, args.kafka, args.topic, schema, max_offsets_per_trigger=args.max_offsets)
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(args.input)


def _await(
    spark: Any, query: Any, events: Events, writer: HookedWriter | None, args: argparse.Namespace
) -> int:
    """Wait for the query to drain its input; 1 when it failed, else 0 (after ``writer.finish``)."""
    from pyspark.errors import StreamingQueryException

    try:
        query.awaitTermination()
        error = query.exception()
    except StreamingQueryException as e:  # raised by awaitTermination when the query failed
        error = e
    if error is not None:
        events.emit(f"failed {str(error).splitlines()[0]}")  # the query's plan follows: on stderr
        print(f"query failed: {error}", file=sys.stderr)
        return 1
    if writer is not None:
        if not args.no_finish:
            writer.finish(query)
        writer.close()
    events.emit(f"done rollbacks={writer.rollbacks if writer else 0}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
