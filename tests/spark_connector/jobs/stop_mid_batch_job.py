"""A driver that stops its ``exactly_once`` query in the middle of batches, then drains the input.

    python stop_mid_batch_job.py --input DIR --checkpoint DIR --table DIR --target HOST:PORT --stops N

The batch function writes the batch to a ``PartitionedFileSink`` and then keeps calling into the JVM
(``df.count()``) until the query is stopped: ``query.stop()`` interrupts the stream execution thread
inside a py4j call. On PySpark 4.3.0 that makes the thread die with ``java.lang.StackOverflowError``
(printed on stderr): Spark's check whether the failure was the stop's interrupt matches a regular
expression against the Python traceback, and the regex recurses past the thread's stack. The batch is
then left written to the sink but not committed in Spark's commit log, as after a crash between the
two. After ``--stops`` such stops the query runs once more with ``availableNow`` to the end of the
input. One JSON line on stdout: what each stop left (``exception()``, ``isActive``) and the ids the
table's readers see.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from typing import Any

from pyspark.sql import SparkSession

from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--input", "--checkpoint", "--table", "--target"):
        p.add_argument(name, required=True)
    p.add_argument("--stops", type=int, default=3)
    args = p.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    sink = PartitionedFileSink(args.table, partition_by=["bucket"], name="stop-table")
    written = threading.Event()
    linger = [True]

    def write_then_linger(df: Any, batch_id: int) -> None:
        sink.write(df, batch_id)
        written.set()
        for _ in range(400):  # JVM calls until the stop interrupts one (bounded: never hangs)
            if not linger[0]:
                return
            df.count()

    writer = exactly_once(sink, args.target, query_name="stop-mid-batch", batch_function=write_then_linger)

    def start(**trigger: Any) -> Any:
        return (
            spark.readStream.schema("id long, bucket string")
            .option("maxFilesPerTrigger", 1)
            .json(args.input)
            .writeStream.foreachBatch(writer)
            .option("checkpointLocation", args.checkpoint)
            .trigger(**trigger)
            .start()
        )

    stops = []
    for _ in range(args.stops):
        written.clear()
        query = start(processingTime="100 milliseconds")
        if not written.wait(300):
            raise RuntimeError(f"no batch was written: {query.exception()}")
        query.stop()
        stops.append({"exception": repr(query.exception()), "active": query.isActive})
    linger[0] = False
    query = start(availableNow=True)
    query.awaitTermination()
    rows = spark.read.json(args.table).collect()
    print(
        json.dumps(
            {
                "stops": stops,
                "final_exception": repr(query.exception()),
                "ids": sorted(int(r["id"]) for r in rows),
            }
        ),
        flush=True,
    )
    writer.close()
    spark.stop()


if __name__ == "__main__":
    main()
