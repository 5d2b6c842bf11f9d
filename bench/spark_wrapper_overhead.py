"""Micro-batch duration with and without the exactly-once wrapper: same job, same run.

    bench/run spark_wrapper_overhead [--files 20] [--records 200] [--rounds 3] [--embedded]
                                     [--mode classic|connect|both] [--smoke]

One local[2] SparkSession runs the same file-source -> ``PartitionedFileSink`` job (trigger
availableNow, one input file per micro-batch) alternately without ``exactly_once``, with it, and
with it plus a ``SnapcoordListener`` reporting backlog progress, each
round on a fresh checkpoint and table, against a real ``snapcoord serve`` on ZooKeeper + SeaweedFS
(``--embedded``: on the embedded stores). It reports the median ``triggerExecution`` of the batches
(Spark's own progress; the first batch of every query is left out as warm-up) and, measured inside
the driver, the wrapper's own time per batch (fence check + sink positions + the call that deletes
the previous record and registers this one, i.e. everything but the write; the sink's commit is
part of the write).

``--mode connect`` (or ``both``, the default: classic first) runs the same three jobs through a local
Spark Connect server (local[2], started from the pyspark wheel): the batch functions are pickled to
the server and run in its Python worker, the listener runs in this (client) process. The wrapper's
own time is then measured in the server's worker and handed back through a file. ``--smoke``: a few
small batches, one round (a quick check that both paths run, for CI; its numbers mean little).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import coordinator_process

from harness.spark_connect import SparkConnectServer, start_with_retries
from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.backlog.listener import SnapcoordListener
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once


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
    stream = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
        .writeStream.queryName(name or f"q-{uuid.uuid4().hex[:8]}")
        .foreachBatch(batch_fn)
        .option("checkpointLocation", str(root / "chk"))
        .trigger(availableNow=True)
    )
    query = start_with_retries(stream.start)  # Connect: the server's worker may connect back late
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    executed = [p for p in query.recentProgress if "addBatch" in (p.durationMs or {})]
    return [float(p.durationMs["triggerExecution"]) for p in executed if p.batchId > 0]


@dataclass
class Timings:
    """Batch durations (ms) of one mode's jobs, and the wrapper's own time per batch."""

    plain: list[float] = field(default_factory=list)
    wrapped: list[float] = field(default_factory=list)
    listened: list[float] = field(default_factory=list)
    wrapper_own_ms: list[float] = field(default_factory=list)


def own_time_writer(
    sink: PartitionedFileSink, target: str, query_name: str, checkpoint: Path, log: Path
) -> Any:
    """``exactly_once`` over ``sink`` whose batch function appends the wrapper's own time (everything
    but the sink write) to ``log``: a file, because under Spark Connect it runs in the server's worker.
    Built from plain values (no closure over this module's state), so it pickles for Connect."""
    write_ms: list[float] = []

    def timed_write(df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        sink.write(df, batch_id)
        write_ms.append((time.perf_counter() - t0) * 1000)

    writer = exactly_once(
        sink, target, query_name=query_name, batch_function=timed_write, checkpoint_location=str(checkpoint)
    )

    def timed(df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        writer(df, batch_id)
        total = (time.perf_counter() - t0) * 1000
        if batch_id > 0:
            with log.open("a", encoding="utf-8") as f:
                f.write(f"{total - write_ms[-1]:.3f}\n")

    return timed


def measure(spark: Any, tmp: Path, target: str, client: CoordinatorClient, rounds: int, tag: str) -> Timings:
    """``rounds`` x (plain, wrapped, wrapped + listener) on fresh checkpoints and tables."""
    t = Timings()
    input_dir = tmp / "input"
    own_log = tmp / f"{tag}-wrapper-own-ms.txt"
    for r in range(rounds):
        sink = PartitionedFileSink(tmp / f"{tag}-plain-{r}" / "table", partition_by=["bucket"])
        t.plain += run_query(spark, input_dir, tmp / f"{tag}-plain-{r}", sink.write)

        wsink = PartitionedFileSink(tmp / f"{tag}-wrapped-{r}" / "table", partition_by=["bucket"])
        wroot = tmp / f"{tag}-wrapped-{r}"
        timed = own_time_writer(wsink, target, f"bench-{tag}-{r}", wroot / "chk", own_log)
        t.wrapped += run_query(spark, input_dir, tmp / f"{tag}-wrapped-{r}", timed)

        # The wrapper plus the listener (backlog progress on every batch).
        name = f"{tag}-listened-{r}"
        lsink = PartitionedFileSink(tmp / name / "table", partition_by=["bucket"])
        listener = SnapcoordListener(client, {name: f"bench-job-{tag}-{r}"})
        spark.streams.addListener(listener)
        lwriter = exactly_once(lsink, target, query_name=name, checkpoint_location=str(tmp / name / "chk"))
        t.listened += run_query(spark, input_dir, tmp / name, lwriter, name=name)
        if tag == "classic":
            # Under Connect removeListener joins the client's event thread (we saw it hang); the
            # session's stop ends it. A classic listener must go, or later rounds pay for it.
            spark.streams.removeListener(listener)
        lwriter.close()
    t.wrapper_own_ms = [float(x) for x in own_log.read_text().split()] if own_log.exists() else []
    return t


def report(title: str, t: Timings) -> None:
    p_med, w_med = statistics.median(t.plain), statistics.median(t.wrapped)
    print(f"\n## {title}")
    print(f"{'micro-batch triggerExecution':<36} {'n':>4} {'median ms':>10}")
    print(f"{'without the wrapper':<36} {len(t.plain):>4} {p_med:>10.1f}")
    print(f"{'with exactly_once':<36} {len(t.wrapped):>4} {w_med:>10.1f}")
    change = f"({(w_med / p_med - 1) * 100:+.1f}%)"
    print(f"{'difference of medians':<36} {'':>4} {w_med - p_med:>10.1f}  {change}")
    l_med = statistics.median(t.listened)
    print(f"{'with exactly_once + SnapcoordListener':<36} {len(t.listened):>4} {l_med:>10.1f}")
    change = f"({(l_med / p_med - 1) * 100:+.1f}%)"
    print(f"{'difference of medians':<36} {'':>4} {l_med - p_med:>10.1f}  {change}")
    if t.wrapper_own_ms:
        own = statistics.median(t.wrapper_own_ms)
        print(f"{'wrapper own time per batch (median)':<36} {len(t.wrapper_own_ms):>4} {own:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20, help="input files = micro-batches per query")
    parser.add_argument("--records", type=int, default=200, help="records per input file")
    parser.add_argument("--rounds", type=int, default=3, help="plain/wrapped query pairs")
    parser.add_argument("--embedded", action="store_true", help="coordinator on the embedded stores")
    parser.add_argument("--mode", choices=["classic", "connect", "both"], default="both")
    parser.add_argument("--smoke", action="store_true", help="4 files x 20 records, 1 round")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.records, args.rounds = 4, 20, 1

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapcoord-bench-spark-")))
        coord, backend = coordinator_process(stack, tmp / "coordinator", embedded=args.embedded)
        client = CoordinatorClient(coord.target)  # the listeners'; closed after Spark stops
        stack.callback(client.close)
        make_input(tmp / "input", args.files, args.records)
        print(
            f"# spark_wrapper_overhead: {args.rounds} rounds x {args.files} batches x {args.records} "
            f"records, local[2]; coordinator on {backend}"
        )

        if args.mode in ("classic", "both"):
            spark = (
                SparkSession.builder.master("local[2]")
                .appName("snapcoord-bench-wrapper")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            try:
                classic = measure(spark, tmp, coord.target, client, args.rounds, "classic")
            finally:
                # Stopped before Connect: with a classic SparkContext alive, builder.remote() stays classic.
                spark.stop()
            report("classic (local[2] in this process)", classic)

        if args.mode in ("connect", "both"):
            t0 = time.monotonic()
            server = stack.enter_context(SparkConnectServer(tmp / "spark-connect"))
            print(f"\n# Spark Connect server {server.url} ready after {time.monotonic() - t0:.1f}s")
            spark = SparkSession.builder.remote(server.url).getOrCreate()
            try:
                connect = measure(spark, tmp, coord.target, client, args.rounds, "connect")
            finally:
                spark.stop()
            report(
                "Spark Connect (local[2] in the Connect server; batch functions run in its worker)", connect
            )


if __name__ == "__main__":
    main()
