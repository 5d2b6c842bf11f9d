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
part of the write). That time is split into its steps: the run's query id (one py4j call in a
classic driver) with the batch's plan (Spark's offsets log entry), the sink's fence check, and the
one ``AdvanceProducerOffsets`` call as the driver sees it, beside the coordinator's own handling of
it (its ``grpc_server_handling_seconds`` histogram over the wrapped queries). The same call made from
this plain process, back to back and spaced like batches, closes the table: what a call costs
outside Spark in the same run.

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
import urllib.request
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from common import coordinator_process
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.spark_connect import SparkConnectServer, start_with_retries
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.backlog.listener import SnapcoordListener
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import ExactlyOnceWriter, exactly_once

ADVANCE = "AdvanceProducerOffsets"


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
    #: The wrapper's steps per batch (ms), each a column of the step log (``STEPS``).
    steps_ms: dict[str, list[float]] = field(default_factory=dict)
    #: The coordinator's own handling of AdvanceProducerOffsets during the wrapped queries:
    #: (seconds, calls), from its metrics.
    advance_handled: tuple[float, int] = (0.0, 0)


#: The wrapper's steps ``StepTimedWriter`` times, in the order it logs them.
STEPS = ("query id + plan", "fence check", f"{ADVANCE} call")


class StepTimedWriter(ExactlyOnceWriter):
    """``ExactlyOnceWriter`` that appends, per batch, the time of each of its steps (``STEPS``) to
    ``step_log``: the run's identity (query id and plan), the sink's fence check, and the
    registration call (``_register_once``: the one ``AdvanceProducerOffsets`` per batch). The steps
    run unchanged; only the clock is read around them."""

    step_log: Path

    def _attempt(self, df: Any, batch_id: int) -> Any:
        self._steps: dict[str, float] = {}
        t0 = time.perf_counter()
        attempt = super()._attempt(df, batch_id)
        self._steps[STEPS[0]] = (time.perf_counter() - t0) * 1000
        return attempt

    def _check_fence(self) -> None:
        t0 = time.perf_counter()
        super()._check_fence()
        self._steps[STEPS[1]] = (time.perf_counter() - t0) * 1000

    def _register_once(self, pid: str, offsets: list[Offset], previous: str | None) -> Any:
        t0 = time.perf_counter()
        registration = super()._register_once(pid, offsets, previous)
        self._steps[STEPS[2]] = self._steps.get(STEPS[2], 0.0) + (time.perf_counter() - t0) * 1000
        return registration

    def _hook(self, point: str, batch_id: int) -> None:
        if point == "after_register" and batch_id > 0:
            with self.step_log.open("a", encoding="utf-8") as f:
                f.write(" ".join(f"{self._steps.get(s, 0.0):.3f}" for s in STEPS) + "\n")

    _CONFIGURATION = (*ExactlyOnceWriter._CONFIGURATION, "step_log")


def handled(metrics_url: str, method: str) -> tuple[float, int]:
    """The coordinator's ``grpc_server_handling_seconds`` sum and count for ``method`` so far."""
    text = urllib.request.urlopen(metrics_url, timeout=30).read().decode("utf-8")
    total, count = 0.0, 0
    for line in text.splitlines():
        if f'grpc_method="{method}"' not in line:
            continue
        if line.startswith("grpc_server_handling_seconds_sum"):
            total += float(line.split()[-1])
        elif line.startswith("grpc_server_handling_seconds_count"):
            count += int(float(line.split()[-1]))
    return total, count


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

    writer = StepTimedWriter(
        sink, target, query_name=query_name, batch_function=timed_write, checkpoint_location=str(checkpoint)
    )
    writer.step_log = log.with_name(log.name + ".steps")

    def timed(df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        writer(df, batch_id)
        total = (time.perf_counter() - t0) * 1000
        if batch_id > 0:
            with log.open("a", encoding="utf-8") as f:
                f.write(f"{total - write_ms[-1]:.3f}\n")

    return timed


def measure(
    spark: Any, tmp: Path, target: str, metrics_url: str, client: CoordinatorClient, rounds: int, tag: str
) -> Timings:
    """``rounds`` x (plain, wrapped, wrapped + listener) on fresh checkpoints and tables."""
    t = Timings()
    handled_s, handled_n = 0.0, 0
    input_dir = tmp / "input"
    own_log = tmp / f"{tag}-wrapper-own-ms.txt"
    for r in range(rounds):
        sink = PartitionedFileSink(tmp / f"{tag}-plain-{r}" / "table", partition_by=["bucket"])
        t.plain += run_query(spark, input_dir, tmp / f"{tag}-plain-{r}", sink.write)

        wsink = PartitionedFileSink(tmp / f"{tag}-wrapped-{r}" / "table", partition_by=["bucket"])
        wroot = tmp / f"{tag}-wrapped-{r}"
        timed = own_time_writer(wsink, target, f"bench-{tag}-{r}", wroot / "chk", own_log)
        before = handled(metrics_url, ADVANCE)
        t.wrapped += run_query(spark, input_dir, tmp / f"{tag}-wrapped-{r}", timed)
        after = handled(metrics_url, ADVANCE)
        handled_s, handled_n = handled_s + after[0] - before[0], handled_n + after[1] - before[1]

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
    step_log = own_log.with_name(own_log.name + ".steps")
    rows = (
        [[float(x) for x in line.split()] for line in step_log.read_text().splitlines()]
        if step_log.exists()
        else []
    )
    t.steps_ms = {step: [row[i] for row in rows] for i, step in enumerate(STEPS)}
    t.advance_handled = (handled_s, handled_n)
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
    for step, values in t.steps_ms.items():
        if values:
            print(f"{'  ' + step:<36} {len(values):>4} {statistics.median(values):>10.2f}")
    seconds, calls = t.advance_handled
    if calls:
        print(f"{'    coordinator handling (mean)':<36} {calls:>4} {seconds / calls * 1000:>10.2f}")


def timed_calls(
    call: Callable[[int], object], method: str, metrics_url: str, calls: int, gap_s: float
) -> tuple[list[float], float]:
    """``call(1..calls)``, ``gap_s`` apart: their latencies (ms), and the coordinator's mean handling
    of ``method`` over them (ms, from its metrics)."""
    latencies = []
    before = handled(metrics_url, method)
    for n in range(1, calls + 1):
        time.sleep(gap_s)
        t0 = time.perf_counter()
        call(n)
        latencies.append((time.perf_counter() - t0) * 1000)
    after = handled(metrics_url, method)
    return latencies, (after[0] - before[0]) / max(1, after[1] - before[1]) * 1000


def wrapper_record(batch: int, query_id: str) -> list[Offset]:
    """A record like the wrapper's for a ``PartitionedFileSink``: the attempt, then two positions."""
    return [
        Offset("_eo:epoch", 0, 1),
        Offset("_eo:batch", 0, batch),
        Offset(f"_eo:query:{query_id}", 0, 0),
        Offset("_eo:plan:" + "0" * 32, 0, 0),
        Offset("table", 0, batch),
        Offset("table", 1, 1),
    ]


def report_plain(client: CoordinatorClient, target: str, metrics_url: str, calls: int) -> None:
    """The wrapper's call from this plain process in the same run (batch N's record replaces N-1's),
    and a health check (no storage at all): back to back, and 0.5 s apart (the coordinator idle
    between calls, as between a driver's batches)."""
    print("\n## The same coordinator from this process (no Spark)")
    print(f"{'calls':<36} {'n':>4} {'p50 ms':>10} {'coordinator mean ms':>20}")
    name = f"bench-plain-{uuid.uuid4().hex[:8]}"
    query_id = str(uuid.uuid4())
    client.register_producer_offsets(f"{name}.b0", wrapper_record(0, query_id), ttl_ms=600_000)
    done = 0

    def advance(_: int) -> None:
        nonlocal done
        done += 1
        client.advance_producer_offsets(
            f"{name}.b{done}",
            wrapper_record(done, query_id),
            previous_producer_id=f"{name}.b{done - 1}",
            ttl_ms=600_000,
        )

    with grpc.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        health.Check(health_pb2.HealthCheckRequest(), timeout=60)  # connects
        for label, call, method in (
            (ADVANCE, advance, ADVANCE),
            ("health check", lambda _: health.Check(health_pb2.HealthCheckRequest(), timeout=60), "Check"),
        ):
            for gap_label, gap_s in (("back to back", 0.0), ("0.5 s apart", 0.5)):
                latencies, server_ms = timed_calls(call, method, metrics_url, calls, gap_s)
                row = f"{label}, {gap_label}"
                print(
                    f"{row:<36} {len(latencies):>4} {statistics.median(latencies):>10.2f} {server_ms:>20.2f}"
                )
    client.delete_producer_offsets(f"{name}.b{done}")


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
                classic = measure(spark, tmp, coord.target, coord.metrics_url, client, args.rounds, "classic")
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
                connect = measure(spark, tmp, coord.target, coord.metrics_url, client, args.rounds, "connect")
            finally:
                spark.stop()
            report(
                "Spark Connect (local[2] in the Connect server; batch functions run in its worker)", connect
            )

        report_plain(client, coord.target, coord.metrics_url, 6 if args.smoke else 20)


if __name__ == "__main__":
    main()
