"""A driver on the Spark standalone cluster of ``harness.spark_cluster``: runs the steps it is given and
prints one JSON line with what each found.

    python cluster_job.py --conf JSON --target HOST:PORT --steps STEP,STEP... [options]

The driver runs in the test's (root) network namespace and reaches the coordinator; its executors run
in the cluster's namespace and do not. ``--conf`` holds every Spark setting (the cluster's
``driver_conf`` and the s3a settings). Steps, in the order given:

- ``executor_call``: one coordinator call from the driver and one from inside each of two tasks; reports
  each one's outcome (the error code, or ``OK``/``NOT_FOUND`` when the coordinator answered), and each
  task's process id and network namespace;
- ``eo``: an ``availableNow`` run of ``exactly_once`` from ``--input`` (JSON lines, one file per batch)
  into a ``PartitionedFileSink`` at ``--table``, checkpoint ``--checkpoint``; reports the batch ids run;
- ``snapshot``: ``take_snapshot`` of app ``--app`` over that query; reports its generation;
- ``restore``: ``restore_snapshot`` of ``--app`` generation ``--generation`` into ``--restored`` with the
  same sink; reports the restored batch id and the ids the sink kept; a later ``eo_restored`` step runs
  from there;
- ``backlog``: ``BacklogAwareRunner`` for job ``--job`` from ``--input`` into the table (checkpoint
  ``--checkpoint``): catch-up until the coordinator says the backlog is done, then steady; one more
  file is published to ``--input`` after the switch and must be read by the steady query.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the harness
from harness.json_input import file_count, publish
from snapcoord.client import CoordinatorClient, Offset, SnapcoordError
from snapcoord.spark_connector import (
    BacklogAwareRunner,
    PartitionedFileSink,
    RestoreTarget,
    SnapshotQuery,
    exactly_once,
    restore_snapshot,
    take_snapshot,
)

SCHEMA = "id LONG, bucket STRING"


def call_outcome(target: str) -> str:
    """The outcome of one cheap coordinator call: ``NOT_FOUND`` means the coordinator answered."""
    with CoordinatorClient(target, timeout_s=5) as client:
        try:
            client.get_producer_offsets("cluster-job-probe")
        except SnapcoordError as e:
            return f"{e.code}: {e}"
    return "OK"


def jvm_ancestor() -> str:
    """The main class of the nearest Java process among this process's ancestors ("" if none)."""
    pid = os.getppid()
    while pid > 1:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if Path(argv[0].decode()).name == "java":
            classes = [a.decode() for a in argv if a.startswith(b"org.apache.spark.")]
            return classes[0] if classes else "java"
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    return ""


def executor_call(spark: Any, target: str) -> dict[str, Any]:
    def task(_rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        ns = os.stat("/proc/self/ns/net").st_ino
        yield {"jvm": jvm_ancestor(), "netns": ns, "outcome": call_outcome(target)}

    tasks = spark.sparkContext.parallelize(range(2), 2).mapPartitions(task).collect()
    driver = {"netns": os.stat("/proc/self/ns/net").st_ino, "outcome": call_outcome(target)}
    return {"driver": driver, "tasks": tasks}


def run_eo(spark: Any, args: argparse.Namespace, sink: PartitionedFileSink, checkpoint: str) -> list[int]:
    writer = exactly_once(sink, args.target, query_name=args.name, checkpoint_location=checkpoint)
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(args.input)
        .writeStream.queryName(args.name)
        .foreachBatch(writer)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        writer.finish(query)
    finally:
        query.stop()
        writer.close()
    return [p.batchId for p in query.recentProgress if "addBatch" in (p.durationMs or {})]


def backlog(spark: Any, args: argparse.Namespace, sink: PartitionedFileSink) -> dict[str, Any]:
    source = Path(args.input)
    name = "events-files"
    writer = exactly_once(sink, args.target, query_name=args.name, checkpoint_location=args.checkpoint)

    def start(trigger: Mapping[str, Any]) -> Any:
        return (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.queryName(args.name)
            .option("checkpointLocation", args.checkpoint)
            .foreachBatch(writer)
            .trigger(**trigger)
            .start()
        )

    def latest() -> list[Offset]:  # the file source's log offset once every file is read
        return [Offset(name, 0, file_count(source) - 1)]

    with CoordinatorClient(args.target, timeout_s=10) as client:
        runner = BacklogAwareRunner(
            start,
            args.job,
            client,
            {"availableNow": True},
            {"processingTime": "500 milliseconds"},
            latest_offsets=latest,
            stream_names=[name],
            checkpoint_location=args.checkpoint,
            poll_interval_s=0.2,
        )
        try:
            runner.start()
            steady = runner.await_steady(timeout_s=600)
            at_switch = sorted(int(r["id"]) for r in sink.read_json_records())
            publish(source, file_count(source))
            steady.processAllAvailable()
            if steady.exception() is not None:
                raise RuntimeError(f"steady query failed: {steady.exception()}")
            status = client.get_backlog_status(args.job)
        finally:
            runner.stop()
            writer.close()
    return {
        "switches": [s.to_phase for s in runner.switches],
        "at_switch": at_switch,
        "processing_backlog": status.processing_backlog,
        "partitions": [[p.stream, p.partition, p.boundary, p.finished] for p in status.partitions],
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--conf", required=True, help="Spark settings, a JSON object")
    p.add_argument("--target", required=True)
    p.add_argument("--steps", required=True)
    p.add_argument("--input", default="")
    p.add_argument("--checkpoint", default="")
    p.add_argument("--restored", default="")
    p.add_argument("--table", default="")
    p.add_argument("--name", default="cluster-eo")
    p.add_argument("--app", default="")
    p.add_argument("--generation", type=int, default=0)
    p.add_argument("--job", default="")
    args = p.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("snapcoord-cluster-job")
    for key, value in json.loads(args.conf).items():
        builder = builder.config(key, value)
    started = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    result: dict[str, Any] = {"master": spark.sparkContext.master, "session_s": time.monotonic() - started}
    sink = PartitionedFileSink(args.table, partition_by=["bucket"], name=args.name) if args.table else None
    try:
        for step in args.steps.split(","):
            t0 = time.monotonic()
            if step == "executor_call":
                result[step] = executor_call(spark, args.target)
            elif step == "eo" and sink is not None:
                result[step] = run_eo(spark, args, sink, args.checkpoint)
            elif step == "eo_restored" and sink is not None:
                result[step] = run_eo(spark, args, sink, args.restored)
            elif step == "snapshot" and sink is not None:
                with CoordinatorClient(args.target, timeout_s=10) as client:
                    query = SnapshotQuery(args.name, args.checkpoint, sink)
                    snapshot = take_snapshot(client, args.app, [query], timeout_s=300, spark=spark)
                result[step] = {"generation": snapshot.generation, "state": snapshot.state.name}
            elif step == "restore" and sink is not None:
                with CoordinatorClient(args.target, timeout_s=10) as client:
                    target = RestoreTarget(args.name, args.restored, sink)
                    done = restore_snapshot(client, args.app, args.generation, [target], spark=spark)
                kept = sorted(int(r["id"]) for r in sink.read_json_records())
                result[step] = {"batch_id": done[args.name].batch_id, "kept": kept}
            elif step == "backlog" and sink is not None:
                result[step] = backlog(spark, args, sink)
            else:
                raise SystemExit(f"unknown step {step!r} (or it needs --table)")
            result[f"{step}_s"] = time.monotonic() - t0
    finally:
        print(json.dumps(result), flush=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
