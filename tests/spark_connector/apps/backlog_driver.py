"""Driver 1 of the backlog restart test: starts catching up on a file backlog, then dies.

It runs ``BacklogAwareRunner`` with ``availableNow`` and one file per batch. Batch 1 blocks in the
sink, so the driver has committed exactly batch 0 when it dies; it dies (``os._exit``, no cleanup)
as soon as its runner has marked the backlog and reported batch 0. It prints one JSON line with
the mark it got before dying.

    python backlog_driver.py TARGET INPUT_DIR CHECKPOINT JOB_ID BOUNDARY
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.backlog.runner import BacklogAwareRunner


def main(target: str, input_dir: str, checkpoint: str, job_id: str, boundary: int) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("backlog-driver-1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    client = CoordinatorClient(target, timeout_s=10)
    never = threading.Event()
    committed: list[int] = []

    def sink(df: DataFrame, batch_id: int) -> None:
        ids = [int(r["id"]) for r in df.collect()]
        if batch_id == 0:
            committed.extend(ids)
        else:
            never.wait()  # the driver dies while this batch runs

    def start(trigger: Mapping[str, Any]) -> StreamingQuery:
        return (
            spark.readStream.schema("id INT")
            .option("maxFilesPerTrigger", 1)
            .json(input_dir)
            .writeStream.queryName("events")
            .option("checkpointLocation", checkpoint)
            .foreachBatch(sink)
            .trigger(**trigger)
            .start()
        )

    runner = BacklogAwareRunner(
        start,
        job_id,
        client,
        {"availableNow": True},
        {"processingTime": "1 second"},
        latest_offsets=lambda: [Offset("events-files", 0, boundary)],
        stream_names=["events-files"],
    )
    runner.start()
    deadline = time.monotonic() + 120
    while runner.tracker is None or runner.tracker.last_result is None:
        if time.monotonic() > deadline:
            print(json.dumps({"error": "no progress reported"}), flush=True)
            os._exit(2)
        runner.poll()  # reports batch 0 (batch 1 never commits)
        time.sleep(0.05)
    mark = runner.tracker.mark
    assert mark is not None
    boundaries = [[p.stream, p.partition, p.boundary] for p in mark.partitions]
    print(json.dumps({"boundaries": boundaries, "batch0_ids": sorted(committed)}), flush=True)
    os._exit(17)  # a crash: no query stop, no listener removal, no client close


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
