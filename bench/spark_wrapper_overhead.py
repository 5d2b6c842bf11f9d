"""Micro-batch duration with and without the exactly-once wrapper: same job, same run.

    bench/run spark_wrapper_overhead [--files 20] [--records 200] [--rounds 3] [--embedded]

One local[2] SparkSession runs the same file-source -> ``PartitionedFileSink`` job (trigger
availableNow, one input file per micro-batch) alternately without ``exactly_once``, with it, and
with it plus a ``SnapcoordListener`` reporting snapshots and backlog progress, each
round on a fresh checkpoint and table, against a real ``snapcoord serve`` on ZooKeeper + SeaweedFS
(``--embedded``: on the embedded stores). It reports the median ``triggerExecution`` of the batches
(Spark's own progress; the first batch of every query is left out as warm-up) and, measured inside
the driver, the wrapper's own time per batch (delete of the previous record + sink positions +
registration, i.e. everything but the write).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common import real_servers

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.exactly_once import exactly_once
from snapcoord.spark_connector.listener import SnapcoordListener
from snapcoord.spark_connector.sinks import PartitionedFileSink


def make_input(directory: Path, files: int, records: int) -> None:
    directory.mkdir(parents=True)
    for i in range(files):
        tmp = directory.parent / f".tmp-{i}.json"
        lines = (json.dumps({"id": i * records + j, "bucket": f"b{j % 4}"}) for j in range(records))
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, directory / f"in-{i:04d}.json")


def run_query(spark: Any, input_dir: Path, root: Path, batch_fn: Any, name: str | None = None) -> list[float]:
    """Batch durations (ms) of one availableNow query, the first (warm-up) batch left out."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("id", LongType()), StructField("bucket", StringType())])
    query = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .writeStream.queryName(name or f"q-{uuid.uuid4().hex[:8]}")
        .foreachBatch(batch_fn)
        .option("checkpointLocation", str(root / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    executed = [p for p in query.recentProgress if "addBatch" in (p.durationMs or {})]
    return [float(p.durationMs["triggerExecution"]) for p in executed if p.batchId > 0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20, help="input files = micro-batches per query")
    parser.add_argument("--records", type=int, default=200, help="records per input file")
    parser.add_argument("--rounds", type=int, default=3, help="plain/wrapped query pairs")
    parser.add_argument("--embedded", action="store_true", help="coordinator on the embedded stores")
    args = parser.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapcoord-bench-spark-")))
        coord_args: list[str] = []
        backend = "embedded stores"
        if not args.embedded:
            zk, s3 = stack.enter_context(real_servers())
            os.environ.update(s3.env())
            run_id = uuid.uuid4().hex[:8]
            coord_args = [
                "--metadata",
                f"zk://{zk.hosts}/bench-{run_id}",
                "--blobs",
                s3.uri(f"bench-{run_id}"),
            ]
            backend = f"ZooKeeper {zk.hosts} + S3 {s3.endpoint_url}"
        coord = stack.enter_context(CoordinatorProcess(tmp / "coordinator", args=coord_args))
        client = CoordinatorClient(coord.target)  # the listener's; closed after Spark stops
        stack.callback(client.close)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("snapcoord-bench-wrapper")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        stack.callback(spark.stop)
        spark.sparkContext.setLogLevel("ERROR")
        input_dir = tmp / "input"
        make_input(input_dir, args.files, args.records)
        print(
            f"# spark_wrapper_overhead: {args.rounds} rounds x {args.files} batches x {args.records} "
            f"records, local[2]; coordinator on {backend}"
        )

        plain: list[float] = []
        wrapped: list[float] = []
        listened: list[float] = []
        wrapper_own_ms: list[float] = []
        for r in range(args.rounds):
            sink = PartitionedFileSink(tmp / f"plain-{r}" / "table", partition_by=["bucket"])
            plain += run_query(spark, input_dir, tmp / f"plain-{r}", sink.write)

            wsink = PartitionedFileSink(tmp / f"wrapped-{r}" / "table", partition_by=["bucket"])
            write_ms: list[float] = []

            def timed_write(
                df: Any, batch_id: int, sink: PartitionedFileSink = wsink, write_ms: list[float] = write_ms
            ) -> None:
                t0 = time.perf_counter()
                sink.write(df, batch_id)
                write_ms.append((time.perf_counter() - t0) * 1000)

            writer = exactly_once(wsink, coord.target, query_name=f"bench-{r}", batch_function=timed_write)

            def timed(df: Any, batch_id: int, writer: Any = writer, write_ms: list[float] = write_ms) -> None:
                t0 = time.perf_counter()
                writer(df, batch_id)
                total = (time.perf_counter() - t0) * 1000
                if batch_id > 0:
                    wrapper_own_ms.append(total - write_ms[-1])

            wrapped += run_query(spark, input_dir, tmp / f"wrapped-{r}", timed)
            writer.close()

            # The wrapper plus the listener (snapshot reports and backlog progress on every batch).
            lsink = PartitionedFileSink(tmp / f"listened-{r}" / "table", partition_by=["bucket"])
            name = f"listened-{r}"
            listener = SnapcoordListener(
                client,
                f"bench-app-{r}",
                {name: str(tmp / name / "chk")},
                backlog_jobs={name: f"bench-job-{r}"},
            )
            spark.streams.addListener(listener)
            lwriter = exactly_once(lsink, coord.target, query_name=name)
            listened += run_query(spark, input_dir, tmp / name, lwriter, name=name)
            spark.streams.removeListener(listener)
            lwriter.close()

        p_med, w_med = statistics.median(plain), statistics.median(wrapped)
        print(f"\n{'micro-batch triggerExecution':<36} {'n':>4} {'median ms':>10}")
        print(f"{'without the wrapper':<36} {len(plain):>4} {p_med:>10.1f}")
        print(f"{'with exactly_once':<36} {len(wrapped):>4} {w_med:>10.1f}")
        change = f"({(w_med / p_med - 1) * 100:+.1f}%)"
        print(f"{'difference of medians':<36} {'':>4} {w_med - p_med:>10.1f}  {change}")
        l_med = statistics.median(listened)
        print(f"{'with exactly_once + SnapcoordListener':<36} {len(listened):>4} {l_med:>10.1f}")
        change = f"({(l_med / p_med - 1) * 100:+.1f}%)"
        print(f"{'difference of medians':<36} {'':>4} {l_med - p_med:>10.1f}  {change}")
        own = statistics.median(wrapper_own_ms)
        print(f"{'wrapper own time per batch (median)':<36} {len(wrapper_own_ms):>4} {own:>10.1f}")


if __name__ == "__main__":
    main()
