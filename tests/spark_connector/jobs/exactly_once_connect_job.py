"""A Spark Connect client for the Connect exactly-once tests: file source -> ``exactly_once(sink)``.

    python exactly_once_connect_job.py --remote sc://127.0.0.1:PORT --target HOST:PORT --input DIR
        --checkpoint DIR --table DIR --query-name NAME [--fail-once-at-batch N --marker FILE]
        [--max-files-per-trigger N] [--no-checkpoint-location] [--storage-options JSON]

It builds its session as a user does, ``SparkSession.builder.remote(URL).getOrCreate()`` (in a fresh
process: in a process that already runs a classic SparkContext that builder does not go remote), and
runs one availableNow query (one input file per micro-batch by default) whose ``foreachBatch`` is the
``exactly_once`` writer over a ``PartitionedFileSink``, built from the coordinator's address and the
checkpoint location (``--no-checkpoint-location``: without it, which the writer refuses). It prints
one JSON line: the session's class, the executed batch ids and the query's error (or null); exit 0
when the query finished, 3 when it failed.

``--fail-once-at-batch N``: the batch function raises right after the sink write of batch N unless
``--marker`` exists (it creates it first): a crash between the sink write and Spark's commit log. The
batch function runs in the Connect server's Python worker, so the marker is written there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the harness
from harness.spark_connect import start_with_retries
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--remote", "--target", "--input", "--checkpoint", "--table", "--query-name"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--fail-once-at-batch", type=int, default=-1)
    parser.add_argument("--marker", default="")
    parser.add_argument("--max-files-per-trigger", type=int, default=1)
    parser.add_argument("--no-checkpoint-location", action="store_true")
    parser.add_argument("--storage-options", default="{}", help="JSON: how the worker reaches the checkpoint")
    args = parser.parse_args()

    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    sink = PartitionedFileSink(args.table, partition_by=["bucket"], name="connect-table")
    fail_at, marker = args.fail_once_at_batch, Path(args.marker) if args.marker else None

    def write_then_maybe_crash(df: Any, batch_id: int) -> None:
        sink.write(df, batch_id)
        if batch_id == fail_at and marker is not None and not marker.exists():
            marker.touch()
            raise RuntimeError(f"simulated crash after the sink write of batch {batch_id}")

    # checkpoint_location: the Connect server's worker reads the query id (and each batch's plan)
    # from it; it cannot see Spark's sql.streaming.queryId property, and refuses to run without it.
    writer = exactly_once(
        sink,
        args.target,
        query_name=args.query_name,
        batch_function=write_then_maybe_crash,
        checkpoint_location=None if args.no_checkpoint_location else args.checkpoint,
        storage_options=json.loads(args.storage_options),
    )
    stream = (
        spark.readStream.schema("id long, bucket string")
        .option("maxFilesPerTrigger", args.max_files_per_trigger)
        .json(args.input)
        .writeStream.queryName(args.query_name)
        .foreachBatch(writer)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
    )
    query = start_with_retries(stream.start)
    error: str | None = None
    try:
        query.awaitTermination()
    except Exception as e:  # the query failed: reported to the test, which asserts on it
        error = f"{type(e).__name__}: {e}"
    executed = [p.batchId for p in query.recentProgress if "addBatch" in (p.durationMs or {})]
    result = {
        "session": f"{type(spark).__module__}.{type(spark).__name__}",
        "batches": executed,
        "error": error,
    }
    print(json.dumps(result), flush=True)
    spark.stop()
    return 3 if error else 0


if __name__ == "__main__":
    sys.exit(main())
