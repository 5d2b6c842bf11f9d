"""Snapshot size and time, taking and restoring, for a stateful query with ~100 MB of state.

    bench/run spark_snapshot_restore [--keys 1000000] [--embedded] [--smoke]

One local[2] SparkSession runs a file-source query that deduplicates random 96-character keys
(``dropDuplicates``: every key stays in the HDFS-backed state store) over two input files, one
batch each, through ``exactly_once`` into a ``PartitionedFileSink`` (one count row per batch, so
the sink stays small and the state is what is measured). Then, against a real ``snapcoord serve``
on ZooKeeper + SeaweedFS (``--embedded``: the embedded stores), it times ``take_snapshot`` (cut,
hard-link copy, tar stream to the coordinator, report) and ``restore_snapshot`` (lease, sink
rollback, streamed read, unpack), and checks that the restored query resumes: a third file whose
keys half repeat the first one yields only its new keys. Printed: the state directory's size on
disk, the archive's size, and both times. ``--smoke``: 20 000 keys (a quick check for CI).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common import coordinator_process

from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.app_snapshots import ARCHIVE_KEY, SnapshotQuery, take_snapshot
from snapcoord.spark_connector.exactly_once import exactly_once
from snapcoord.spark_connector.restore import RestoreTarget, restore_snapshot
from snapcoord.spark_connector.sinks import PartitionedFileSink

MiB = 1024 * 1024


def write_keys(path: Path, keys: list[str]) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    with tmp.open("w") as f:
        for k in keys:
            f.write(json.dumps({"k": k}) + "\n")
    os.replace(tmp, path)


def random_keys(rng: random.Random, n: int) -> list[str]:
    return [base64.b64encode(rng.randbytes(72)).decode() for _ in range(n)]


def run(
    spark: Any, target: str, name: str, source: Path, checkpoint: Path, sink: PartitionedFileSink
) -> None:
    def count_new(df: Any, batch_id: int) -> None:
        sink.write(df.groupBy().count(), batch_id)

    writer = exactly_once(
        sink, target, query_name=name, batch_function=count_new, checkpoint_location=str(checkpoint)
    )
    query = (
        spark.readStream.schema("k STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .dropDuplicates(["k"])
        .writeStream.queryName(name)
        .foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    writer.finish(query)
    writer.close()


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--embedded", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.keys = 20_000
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapcoord-bench-snap-")))
        coord, backend = coordinator_process(stack, tmp / "coordinator", embedded=args.embedded)
        client = CoordinatorClient(coord.target, timeout_s=600)
        stack.callback(client.close)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("snapcoord-bench-snapshot")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        stack.callback(spark.stop)

        rng = random.Random(7)
        half = args.keys // 2
        first, second = random_keys(rng, half), random_keys(rng, args.keys - half)
        source = tmp / "input"
        source.mkdir()
        write_keys(source / "in-0.json", first)
        write_keys(source / "in-1.json", second)
        name, app = "dedup", f"bench-{uuid.uuid4().hex[:6]}"
        checkpoint, table = tmp / "chk", tmp / "table"
        sink = PartitionedFileSink(table, name=name)
        t0 = time.monotonic()
        run(spark, coord.target, name, source, checkpoint, sink)
        print(f"# spark_snapshot_restore: {args.keys} keys, local[2]; coordinator on {backend}")
        print(f"building the state (2 batches): {time.monotonic() - t0:.1f} s")
        state_bytes = du(checkpoint / "state")

        t0 = time.monotonic()
        snapshot = take_snapshot(client, app, [SnapshotQuery(name, str(checkpoint), sink)], timeout_s=1800)
        take_s = time.monotonic() - t0
        archive = client.read_checkpoint(app, snapshot.generation, name, ARCHIVE_KEY)
        archive_bytes = sum(len(c) for c in archive)

        new_keys = random_keys(rng, half // 2)
        write_keys(source / "in-2.json", first[: half // 2] + new_keys)
        restored = tmp / "chk-restored"
        t0 = time.monotonic()
        restore_snapshot(client, app, snapshot.generation, [RestoreTarget(name, str(restored), sink)])
        restore_s = time.monotonic() - t0
        run(spark, coord.target, name, source, restored, sink)
        counts = [int(r["count"]) for r in sink.read_json_records()]
        if counts != [half, args.keys - half, len(new_keys)]:
            raise AssertionError(f"the restored query did not resume from the snapshot's state: {counts}")

        print(f"state on disk: {state_bytes / MiB:.1f} MiB")
        print(f"snapshot archive: {archive_bytes / MiB:.1f} MiB")
        print(f"take_snapshot: {take_s:.2f} s")
        print(f"restore_snapshot: {restore_s:.2f} s")
        print("restored query resumed from the snapshot's state: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
