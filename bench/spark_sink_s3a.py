"""A micro-batch on ``s3a://``: the exactly-once sink against Spark's parquet file sink and Delta Lake's
idempotent writes, side by side in one run.

    bench/run spark_sink_s3a [--sizes 1000,100000] [--batches 8] [--rounds 2] [--embedded]
                             [--no-delta] [--smoke]

One local[2] SparkSession with S3A (hadoop-aws, on a SeaweedFS of its own) and Delta Lake on its class
path runs the same streaming query with three sinks, one query after the other, each on a fresh table
and a fresh checkpoint in the same bucket:

- ``parquet``: Spark's built-in file sink, ``writeStream.format("parquet")`` (its own
  ``_spark_metadata`` log);
- ``exactly_once``: ``foreachBatch(exactly_once(PartitionedFileSink(table, file_format="parquet")))``,
  unpartitioned, against a real ``snapcoord serve`` (ZooKeeper + SeaweedFS; ``--embedded``: its
  embedded stores). S3A declares conditional create, so the store is the sink's commit point;
- ``delta``: ``foreachBatch`` writing ``df.write.format("delta")`` with ``txnAppId`` (the query's) and
  ``txnVersion`` (the batch id), Delta's idempotent writes.

The source is a directory of parquet files on the local disk, ``--batches`` of them per batch size,
each holding that many rows (``--sizes``), read with ``maxFilesPerTrigger=1`` under
``trigger(availableNow=True)``: every sink gets exactly the same batches. Sinks take turns in rounds
(the order rotates each round), so load from elsewhere on the machine falls on all of them.

Per batch it reports Spark's own progress (the first batch of every query is left out: it sets up the
table, the fence, Delta's log): ``wall`` is ``triggerExecution``, the micro-batch's wall time;
``sink`` is ``addBatch``, the sink's part of it; ``checkpoint`` the checkpoint's offsets and commit
log writes. ``S3 requests`` are Hadoop's global S3A request counters over each query (its start and
every batch) divided by its batches; what Spark writes through Hadoop's FileContext (its checkpoint
logs, the parquet sink's ``_spark_metadata``) is not in them. For the two ``foreachBatch`` sinks the
counters are also read around each call (the reads, ``instrument``, are taken off that batch's
``wall`` and ``sink``), with the time spent in the function (``addBatch`` less that is Spark's
hand-off to the Python function), and ``exactly_once``'s time is split as ``spark_sink_remote``
splits it: ``wrapper`` (the query id, the plan read from the checkpoint's offsets log, the fence
check and the one coordinator call), ``storage`` (the sink's own object-store calls from the driver,
the wrapper's fence check among them) and ``spark job`` (Spark's write).

Delta Lake's newest release (the ``delta`` jar set) is built for an older Spark than the project's
PySpark; where the running PySpark is not the one Delta supports, the benchmark runs itself again in
``bench/.venv-delta`` (``scripts/install-delta-bench``: that PySpark from PyPI, hash-checked), so all
three sinks are measured on the same Spark. ``--no-delta`` measures the other two on this PySpark.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import ROOT, coordinator_process, local_spark
from spark_sink_remote import MeasuredSink, Timed

from harness import s3a
from harness.jars import class_path
from harness.seaweed import SeaweedS3Server
from snapcoord.spark_connector.sink.writer import exactly_once

SINKS = ("parquet", "exactly_once", "delta")
#: The Spark release (major.minor) the ``delta`` jar set's Delta Lake is built for.
DELTA_SPARK = "4.2"
DELTA_VENV = ROOT / "bench" / ".venv-delta"
DELTA_INSTALL = "scripts/install-delta-bench"
#: S3A's request counters, summed into the columns the table shows.
REQUESTS = {
    "PUT": ("object_put_request",),
    "COPY": ("object_copy_requests",),
    "LIST": ("object_list_request", "object_continue_list_request"),
    "HEAD": ("object_metadata_request",),
    "GET": ("action_http_get_request",),
    "DEL": ("object_delete_request", "object_bulk_delete_request"),
}


@dataclass
class Query:
    """One query's figures: per measured batch, Spark's durations (ms) and, for the foreachBatch
    sinks, what the batch function saw."""

    sink: str
    rows: int
    wall: list[float] = field(default_factory=list)
    add_batch: list[float] = field(default_factory=list)
    checkpoint: list[float] = field(default_factory=list)
    #: S3A requests over the whole query, per batch.
    requests: dict[str, float] = field(default_factory=dict)
    #: Per measured batch, inside the batch function: its S3A requests and exactly_once's split.
    in_batch: list[dict[str, float]] = field(default_factory=list)


class S3ACounters:
    """S3A's request counters of the whole JVM: Hadoop's global storage statistics for S3A. A read
    is one py4j call per counter (a handful, a few milliseconds): it runs inside the foreachBatch
    functions, whose own time is measured apart from it."""

    def __init__(self, spark: Any) -> None:
        jvm = spark.sparkContext._jvm
        self.global_stats = jvm.org.apache.hadoop.fs.FileSystem.getGlobalStorageStatistics()

    def read(self) -> dict[str, int]:
        stats = self.global_stats.get("S3AStorageStatistics")
        if stats is None:  # no S3A filesystem opened yet
            return {column: 0 for column in REQUESTS}
        return {column: sum(int(stats.getLong(n) or 0) for n in names) for column, names in REQUESTS.items()}

    @staticmethod
    def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
        return {k: after[k] - before[k] for k in after}


def make_input(directory: Path, rows: int, files: int) -> None:
    """``files`` parquet files of ``rows`` rows each, oldest first (the file source's order)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    directory.mkdir(parents=True)
    start = time.time() - files
    for f in range(files):
        ids = range(f * rows, (f + 1) * rows)
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "bucket": pa.array([f"b{i % 16}" for i in ids]),
                "payload": pa.array([f"{i:016x}{(i * 2654435761) % (1 << 32):016x}" for i in ids]),
            }
        )
        tmp = directory.parent / f".tmp-{directory.name}-{f}.parquet"
        pq.write_table(table, tmp)
        os.utime(tmp, (start + f, start + f))
        os.replace(tmp, directory / f"in-{f:04d}.parquet")


def schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("id", LongType()),
            StructField("bucket", StringType()),
            StructField("payload", StringType()),
        ]
    )


def run_query(
    spark: Any, sink: str, source: Path, base: str, rows: int, coordinator: str, counters: S3ACounters
) -> Query:
    """One availableNow query of ``sink`` on a fresh table and checkpoint under ``base``."""
    name = f"{sink}-{rows}-{uuid.uuid4().hex[:8]}"
    table, checkpoint = f"{base}/{name}/table", f"{base}/{name}/checkpoint"
    query = Query(sink, rows)
    writer: Any = None
    measured: MeasuredSink | None = None

    def timed(fn: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        def batch(df: Any, batch_id: int) -> None:
            reading = time.perf_counter()
            before = counters.read()
            storage: Timed | None = measured._storage if measured else None  # type: ignore[assignment]
            split = (
                (measured.write_s, measured.spark_s, storage.seconds, storage.calls)
                if measured is not None and storage is not None
                else None
            )
            start = time.perf_counter()
            fn(df, batch_id)
            total = time.perf_counter() - start
            if batch_id == 0:
                return
            row: dict[str, float] = dict(S3ACounters.diff(counters.read(), before))
            row["in function"] = total * 1000
            #: The counters' reads and this bookkeeping, inside the function as Spark sees it.
            row["instrument"] = (time.perf_counter() - reading - total) * 1000
            if measured is not None and storage is not None and split is not None:
                write_s = measured.write_s - split[0]
                row["wrapper"] = (total - write_s) * 1000
                row["storage calls"] = storage.calls - split[3]
                row["storage"] = (storage.seconds - split[2]) * 1000
                row["spark job"] = (measured.spark_s - split[1]) * 1000
            query.in_batch.append(row)

        return batch

    stream = (
        spark.readStream.schema(schema())
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .writeStream.queryName(name)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    if sink == "parquet":
        stream = stream.format("parquet").option("path", table)
    elif sink == "exactly_once":
        measured = MeasuredSink(table, file_format="parquet", name=name)
        measured._storage = Timed(measured.storage)
        writer = exactly_once(measured, coordinator, query_name=name, checkpoint_location=checkpoint)
        stream = stream.foreachBatch(timed(writer))
    elif sink == "delta":

        def delta(df: Any, batch_id: int) -> None:
            (
                df.write.format("delta")
                .mode("append")
                .option("txnAppId", name)
                .option("txnVersion", batch_id)
                .save(table)
            )

        stream = stream.foreachBatch(timed(delta))
    else:
        raise ValueError(f"unknown sink {sink!r}; one of {SINKS}")
    before = counters.read()
    started = stream.start()
    try:
        started.awaitTermination()
        if started.exception() is not None:
            raise RuntimeError(f"query {name} failed: {started.exception()}")
    finally:
        if writer is not None:
            writer.close()
    progress = [p for p in started.recentProgress if p.numInputRows > 0]
    if len(progress) < 2:
        raise RuntimeError(f"query {name} ran {len(progress)} batch(es) with input; expected several")
    measured_batches = progress[1:]
    if query.in_batch and len(query.in_batch) != len(measured_batches):
        raise RuntimeError(
            f"query {name}: {len(query.in_batch)} batch calls for {len(measured_batches)} batches"
        )
    for i, p in enumerate(measured_batches):
        d = p.durationMs
        # The instrumentation inside a foreachBatch function is not the sink's time.
        instrument = query.in_batch[i]["instrument"] if query.in_batch else 0.0
        query.wall.append(float(d["triggerExecution"]) - instrument)
        query.add_batch.append(float(d["addBatch"]) - instrument)
        query.checkpoint.append(float(d.get("walCommit", 0) + d.get("commitOffsets", 0)))
    total = S3ACounters.diff(counters.read(), before)
    query.requests = {k: v / len(progress) for k, v in total.items()}
    return query


def delta_release() -> str:
    """Delta Lake's version in the ``delta`` jar set."""
    for line in (ROOT / "scripts" / "maven" / "delta.txt").read_text().splitlines():
        if line.startswith("io.delta:delta-spark_"):
            return line.split(":")[2]
    raise RuntimeError("scripts/maven/delta.txt names no io.delta:delta-spark_* artifact")


def delta_venv_python() -> Path:
    return DELTA_VENV / "bin" / "python"


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,100000", help="rows per batch, comma-separated")
    p.add_argument("--batches", type=int, default=8, help="batches per query (the first is left out)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--embedded", action="store_true", help="coordinator on its embedded stores")
    p.add_argument("--no-delta", action="store_true", help="parquet and exactly_once only, on this PySpark")
    p.add_argument(
        "--smoke", action="store_true", help="1,000 rows, 3 batches, 1 round (a check that it runs)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.sizes, args.batches, args.rounds = "1000", 3, 1
    sizes = [int(s) for s in args.sizes.split(",")]
    sinks = [s for s in SINKS if not (args.no_delta and s == "delta")]
    version = pyspark_version()
    if "delta" in sinks and not version.startswith(DELTA_SPARK + "."):
        python = delta_venv_python()
        if Path(sys.prefix).resolve() == DELTA_VENV.resolve() or not python.exists():
            raise SystemExit(
                f"Delta Lake (the delta jar set) runs on Spark {DELTA_SPARK}, this is PySpark {version}, and "
                f"{DELTA_VENV.relative_to(ROOT)} does not have it: run {DELTA_INSTALL} (or pass --no-delta)"
            )
        print(
            f"PySpark {version} here; Delta Lake's newest release runs on Spark {DELTA_SPARK}: running in "
            f"{DELTA_VENV.relative_to(ROOT)} ({DELTA_INSTALL})",
            flush=True,
        )
        os.execv(str(python), [str(python), __file__, *(argv if argv is not None else sys.argv[1:])])
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    queries: list[Query] = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sink-s3a-")))
        coord, backend = coordinator_process(stack, work / "coordinator", embedded=args.embedded)
        s3 = stack.enter_context(SeaweedS3Server(work / "s3a"))
        conf = s3a.spark_conf(s3)
        if "delta" in sinks:
            jars = os.pathsep.join([conf["spark.driver.extraClassPath"], class_path("delta")])
            conf["spark.driver.extraClassPath"] = conf["spark.executor.extraClassPath"] = jars
            conf["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
            conf["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
            # Delta rebuilds a table's state from its log in this many tasks (default 50): on
            # local[2] as few as the shuffle partitions every sink here runs with.
            conf["spark.databricks.delta.snapshotPartitions"] = "2"
        spark = local_spark(conf)
        base = f"s3a://{s3.bucket}/bench"
        counters = S3ACounters(spark)
        sources = {}
        for rows in sizes:
            sources[rows] = work / f"source-{rows}"
            make_input(sources[rows], rows, args.batches)
        if not args.smoke:  # JIT and first-use costs on no one's figures: two small batches each
            make_input(work / "source-warmup", 1000, 2)
            for sink in sinks:
                run_query(spark, sink, work / "source-warmup", f"{base}/warmup", 1000, coord.target, counters)
        for r in range(args.rounds):
            for rows in sizes:
                order = sinks[r % len(sinks) :] + sinks[: r % len(sinks)]
                for sink in order:
                    queries.append(run_query(spark, sink, sources[rows], base, rows, coord.target, counters))
        spark.stop()

    report(queries, sinks, sizes, args, backend, version, delta_release() if "delta" in sinks else "-")
    return 0


def report(
    queries: list[Query],
    sinks: list[str],
    sizes: list[int],
    args: argparse.Namespace,
    backend: str,
    version: str,
    delta_version: str,
) -> None:
    load = os.getloadavg()[0]
    print(
        f"A micro-batch on s3a:// (PySpark {version}, Delta Lake {delta_version}; medians over {args.rounds} "
        f"round(s) x {args.batches - 1} batches; coordinator on {backend}; load average {load:.1f})"
    )
    print(
        "| rows/batch | sink | wall ms | x parquet | sink (addBatch) ms | x parquet | checkpoint ms | "
        "S3 requests per batch (" + ", ".join(REQUESTS) + ") |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for rows in sizes:
        med: dict[str, tuple[float, float, float]] = {}
        for sink in sinks:
            qs = [q for q in queries if q.sink == sink and q.rows == rows]
            med[sink] = (
                statistics.median(v for q in qs for v in q.wall),
                statistics.median(v for q in qs for v in q.add_batch),
                statistics.median(v for q in qs for v in q.checkpoint),
            )
        for sink in sinks:
            qs = [q for q in queries if q.sink == sink and q.rows == rows]
            wall, add, chk = med[sink]
            base_wall, base_add, _ = med["parquet"]
            requests = ", ".join(f"{statistics.median(q.requests[k] for q in qs):.1f}" for k in REQUESTS)
            print(
                f"| {rows:,} | {sink} | {wall:,.0f} | {wall / base_wall:.2f} | {add:,.0f} | "
                f"{add / base_add:.2f} | {chk:,.0f} | {requests} |"
            )
    print()
    print("Inside the foreachBatch function, per batch (medians; ms, S3 requests):")
    keys = [*REQUESTS, "instrument", "in function", "wrapper", "storage calls", "storage", "spark job"]
    print("| rows/batch | sink | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for rows in sizes:
        for sink in sinks:
            batches = [b for q in queries if q.sink == sink and q.rows == rows for b in q.in_batch]
            if not batches:
                continue
            cells = [
                f"{statistics.median(b[k] for b in batches):.1f}" if k in batches[0] else "-" for k in keys
            ]
            print(f"| {rows:,} | {sink} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
