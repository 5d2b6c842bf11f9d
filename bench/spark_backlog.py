"""The backlog listener's overhead on micro-batches, and the cost of one trigger switch.

    bench/run spark_backlog [--files 30] [--records 2000] [--rounds 3] [--switches 5] [--keys 200000]
                            [--embedded] [--smoke]

**Listener overhead.** One local[2] SparkSession runs the same file-source -> foreachBatch job
(trigger availableNow, one input file per micro-batch) without and with a ``SnapcoordListener``
tracking a backlog job (a mark, then one ReportProgress per batch), each round on a fresh
checkpoint, the order alternating between rounds, against a real ``snapcoord serve`` on ZooKeeper
+ SeaweedFS (``--embedded``: on the embedded stores). It reports the median ``triggerExecution``
of the batches (Spark's own progress; the first batch of every query is left out as warm-up), and
the listener's own time per progress event, measured around its callback (it runs on Spark's
listener bus, off the batch's critical path, so its cost shows in the batch time only through
contention).

**Trigger switch.** ``BacklogAwareRunner`` switches by stopping the query and starting it again on
the same checkpoint with the other trigger. A stateful query (a count per key over ``--keys`` keys,
state in the default HDFS-backed store) runs one file per batch; each switch is stopped while a
batch runs (the batch function waits on purpose, so a batch is in flight), then started again. The
report gives: ``stop()`` (what it takes to interrupt the batch), the restart to the first completed
batch (query start, checkpoint and state reload, the interrupted batch re-run), that first batch's
own ``triggerExecution`` next to the median of steady batches, and the state size.

``--smoke``: few small batches, one round, two switches (a quick check that it runs; its numbers
mean little).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common import coordinator_process

from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.backlog.listener import SnapcoordListener


def make_input(directory: Path, files: int, records: int, keys: int, first: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + files):
        tmp = directory.parent / f".tmp-{i}.json"
        lines = (json.dumps({"id": i * records + j, "key": (i * records + j) % keys}) for j in range(records))
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, directory / f"in-{i:05d}.json")


def executed(query: Any) -> list[Any]:
    return [p for p in query.recentProgress if "addBatch" in (p.durationMs or {})]


class TimedListener(SnapcoordListener):
    """The listener, with the time spent in its progress callback recorded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.callback_ms: list[float] = []

    def onQueryProgress(self, event: Any) -> None:
        t0 = time.perf_counter()
        super().onQueryProgress(event)
        self.callback_ms.append((time.perf_counter() - t0) * 1000)


def listener_overhead(spark: Any, client: CoordinatorClient, tmp: Path, rounds: int) -> None:
    input_dir = tmp / "input"

    def run(name: str) -> tuple[list[float], Any]:
        query = (
            spark.readStream.schema("id LONG, key LONG")
            .option("maxFilesPerTrigger", 1)
            .json(str(input_dir))
            .writeStream.queryName(name)
            .foreachBatch(lambda df, _: df.agg({"id": "max"}).collect())
            .option("checkpointLocation", str(tmp / name / "chk"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        return [float(p.durationMs["triggerExecution"]) for p in executed(query) if p.batchId > 0], query

    plain: list[float] = []
    listened: list[float] = []
    callback_ms: list[float] = []

    pairs: list[tuple[float, float]] = []  # per round: (median without, median with)

    def run_listened(r: int) -> None:
        name = f"listened-{r}"
        listener = TimedListener(client, {name: f"bench-backlog-{uuid.uuid4().hex[:8]}"})
        spark.streams.addListener(listener)
        try:
            durations, query = run(name)
            listened.extend(durations)
            # The bus may still be delivering the last events: wait for them (bounded).
            deadline = time.monotonic() + 30
            while len(listener.callback_ms) < len(query.recentProgress) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            spark.streams.removeListener(listener)
        if listener.errors:
            raise RuntimeError(f"the listener had {listener.errors} failed coordinator calls")
        callback_ms.extend(listener.callback_ms[1:])

    for r in range(rounds):  # alternate which goes first, so warm-up and drift favour neither
        n_plain, n_listened = len(plain), len(listened)
        if r % 2:
            run_listened(r)
        plain.extend(run(f"plain-{r}")[0])
        if not r % 2:
            run_listened(r)
        pairs.append((statistics.median(plain[n_plain:]), statistics.median(listened[n_listened:])))
    p_med, l_med = statistics.median(plain), statistics.median(listened)
    print("\n## listener overhead (file source, one file per batch, availableNow)")
    print(f"{'micro-batch triggerExecution':<40} {'n':>4} {'median ms':>10}")
    print(f"{'without the listener':<40} {len(plain):>4} {p_med:>10.1f}")
    print(f"{'with SnapcoordListener (backlog job)':<40} {len(listened):>4} {l_med:>10.1f}")
    change = f"({(l_med / p_med - 1) * 100:+.1f}%)"
    print(f"{'difference of medians':<40} {'':>4} {l_med - p_med:>10.1f}  {change}")
    for r, (p, w) in enumerate(pairs):
        first = "with" if r % 2 else "without"
        print(f"  round {r} ({first} first): without {p:.0f} ms, with {w:.0f} ms ({(w / p - 1) * 100:+.0f}%)")
    own = statistics.median(callback_ms)
    print(f"{'listener callback per event (median)':<40} {len(callback_ms):>4} {own:>10.2f}")


def row(label: str, values: list[float], digits: int) -> None:
    med, top = statistics.median(values), max(values)
    print(f"{label:<44} {len(values):>4} {med:>10.{digits}f} {top:>10.{digits}f}")


def switch_cost(spark: Any, tmp: Path, files: int, records: int, keys: int, switches: int) -> None:
    input_dir, checkpoint = tmp / "switch-input", tmp / "switch-chk"
    make_input(input_dir, files, records, keys)
    in_batch = threading.Event()

    def batch(df: Any, batch_id: int) -> None:
        df.count()
        in_batch.set()
        time.sleep(0.5)  # a batch is in flight for a while: the stop interrupts one
        in_batch.clear()

    def start(trigger: dict[str, Any]) -> Any:
        return (
            spark.readStream.schema("id LONG, key LONG")
            .option("maxFilesPerTrigger", 1)
            .json(str(input_dir))
            .groupBy("key")
            .count()
            .writeStream.queryName("switching")
            .outputMode("update")
            .foreachBatch(batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    triggers = [{"processingTime": "100 milliseconds"}, {"processingTime": "1 second"}]
    query = start(triggers[0])
    steady: list[float] = []
    stop_s: list[float] = []
    to_first_s: list[float] = []
    first_ms: list[float] = []
    reran = 0
    state_rows = state_bytes = 0
    for n in range(switches):
        while len(executed(query)) < 3:  # a few steady batches first
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            time.sleep(0.05)
        progress = executed(query)
        steady += [float(p.durationMs["triggerExecution"]) for p in progress[1:]]
        ops = progress[-1].stateOperators
        if ops:
            state_rows, state_bytes = ops[0].numRowsTotal, ops[0].memoryUsedBytes
        in_batch.wait(60)
        t0 = time.monotonic()
        query.stop()
        stop_s.append(time.monotonic() - t0)
        # Interrupted: the next batch's offsets were logged, its commit was not.
        committed = max(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())
        reran += (checkpoint / "offsets" / str(committed + 1)).exists()
        t1 = time.monotonic()
        query = start(triggers[(n + 1) % 2])
        while not executed(query):
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            time.sleep(0.01)
        to_first_s.append(time.monotonic() - t1)
        first = executed(query)[0]
        first_ms.append(float(first.durationMs["triggerExecution"]))
        if len(list(input_dir.iterdir())) - (first.batchId + 1) < 8:
            make_input(input_dir, 20, records, keys, first=len(list(input_dir.iterdir())))
    query.stop()
    print(f"\n## trigger switch (stateful count over {keys} keys, {records} records per batch)")
    print(f"state: {state_rows} rows, {state_bytes / 1e6:.1f} MB in memory (last steady batch)")
    print(f"{'':<44} {'n':>4} {'median':>10} {'max':>10}")
    row("stop() with a batch in flight (s)", stop_s, 2)
    row("start() to the first completed batch (s)", to_first_s, 2)
    row("first batch after the restart (ms)", first_ms, 0)
    row("steady batches (ms)", steady, 0)
    print(f"stops that interrupted a batch (re-run first after the restart): {reran} of {switches}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=30, help="input files = micro-batches per query")
    parser.add_argument("--records", type=int, default=2000, help="records per input file")
    parser.add_argument("--rounds", type=int, default=3, help="without/with listener query pairs")
    parser.add_argument("--switches", type=int, default=5, help="trigger switches to time")
    parser.add_argument("--keys", type=int, default=200_000, help="distinct keys of the switch's state")
    parser.add_argument("--embedded", action="store_true", help="coordinator on the embedded stores")
    parser.add_argument("--smoke", action="store_true", help="6 files x 100 records, 1 round, 2 switches")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.records, args.rounds, args.switches, args.keys = 6, 100, 1, 2, 1000

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapcoord-bench-backlog-")))
        coord, backend = coordinator_process(stack, tmp / "coordinator", embedded=args.embedded)
        client = CoordinatorClient(coord.target)
        stack.callback(client.close)
        make_input(tmp / "input", args.files, args.records, args.keys)
        print(
            f"# spark_backlog: {args.rounds} rounds x {args.files} batches x {args.records} records, "
            f"{args.switches} switches, local[2]; coordinator on {backend}"
        )
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("snapcoord-bench-backlog")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)
        listener_overhead(spark, client, tmp, args.rounds)
        switch_cost(spark, tmp, max(args.files, 10), args.records, args.keys, args.switches)


if __name__ == "__main__":
    main()
