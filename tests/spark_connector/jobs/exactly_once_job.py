"""A streaming driver for the exactly-once kill/restart test: file source -> PartitionedFileSink.

Run as its own process (its own session, so the test can SIGKILL Python and JVM together):

    python exactly_once_job.py --input DIR --checkpoint DIR --table DIR --events FILE
                               --mode wrapped|plain [--target HOST:PORT] [--query-name NAME]

It reads JSON-lines files from --input one file per micro-batch (trigger availableNow), writes every
batch to the table, and exits 0 when the input is drained. ``--mode wrapped`` goes through
``exactly_once``; ``plain`` calls ``sink.write`` directly (the control).

Kill hooks: ``EO_PAUSE=<point>:<nth>`` makes the driver append ``pause <point> <batch_id>`` to the
events file and sleep at <point> of the <nth> batch this process runs (1-based), so the test can
SIGKILL it exactly there. Points: ``batch_start`` (before anything, incl. the coordinator calls),
``mid_write`` (after the first part file of the batch was published, before the others),
``after_write`` (the sink write finished; Spark has not written the commit log). Every process also
appends ``start``, ``batch <id> begin/end``, ``rolled back <id>`` (the wrapper rolled the sink
back before running the batch) and ``done`` lines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from snapcoord.spark_connector.exactly_once import ExactlyOnceWriter, exactly_once
from snapcoord.spark_connector.sinks import PartitionedFileSink


class Events:
    def __init__(self, path: Path) -> None:
        self.path = path
        spec = os.environ.get("EO_PAUSE", "")
        self.pause_point, _, nth = spec.partition(":")
        self.pause_nth = int(nth) if nth else 0
        self.batches_run = 0
        self.rollbacks_before = 0

    def emit(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {line}\n")
            f.flush()
            os.fsync(f.fileno())

    def maybe_pause(self, point: str, batch_id: int) -> None:
        if point == self.pause_point and self.batches_run == self.pause_nth:
            self.emit(f"pause {point} {batch_id}")
            time.sleep(3600)  # the test SIGKILLs us here


class HookedSink(PartitionedFileSink):
    events: Events | None = None
    batch_id = -1
    published = 0

    def _publish_file(self, src: Path, dst: Path) -> None:
        super()._publish_file(src, dst)
        self.published += 1
        if self.published == 1 and self.events is not None:
            self.events.maybe_pause("mid_write", self.batch_id)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--input", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--mode", choices=("wrapped", "plain"), required=True)
    p.add_argument("--target", default="")
    p.add_argument("--query-name", default="eo-test")
    args = p.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    events = Events(Path(args.events))
    events.emit("start")

    from pyspark.sql import SparkSession
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("snapcoord-exactly-once-job")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "5s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    sink = HookedSink(args.table, partition_by=["bucket"], name="eo-table")
    sink.events = events

    writer: ExactlyOnceWriter | None = None

    def write(df: Any, batch_id: int) -> None:
        if writer is not None and writer.rollbacks > events.rollbacks_before:
            events.emit(f"rolled back {batch_id}")  # the wrapper rolled the sink back just now
        sink.batch_id = batch_id
        sink.published = 0
        sink.write(df.repartition(2), batch_id)  # two tasks, several files per batch
        events.maybe_pause("after_write", batch_id)

    def hooked(inner: Any) -> Any:
        def run(df: Any, batch_id: int) -> None:
            events.batches_run += 1
            events.emit(f"batch {batch_id} begin")
            events.maybe_pause("batch_start", batch_id)
            events.rollbacks_before = writer.rollbacks if writer is not None else 0
            inner(df, batch_id)
            events.emit(f"batch {batch_id} end")

        return run

    batch_fn: Any
    if args.mode == "wrapped":
        writer = exactly_once(sink, args.target, query_name=args.query_name, batch_function=write)
        batch_fn = hooked(writer)
    else:
        batch_fn = hooked(write)

    schema = StructType([StructField("id", LongType()), StructField("bucket", StringType())])
    query = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
        .writeStream.foreachBatch(batch_fn)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    error = query.exception()
    if error is not None:
        events.emit(f"failed {error}")
        print(f"query failed: {error}", file=sys.stderr)
        return 1
    if writer is not None:
        writer.finish(query)
        writer.close()
    events.emit(f"done rollbacks={writer.rollbacks if writer else 0}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
