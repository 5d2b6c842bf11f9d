"""Snapshot size and time, taking and restoring, for a stateful query with ~100 MB of state.

    bench/run spark_snapshot_restore [--keys 1000000] [--embedded] [--smoke] [--sftp] [--s3a] [--hdfs]

One local[2] SparkSession runs a file-source query that deduplicates random 96-character keys
(``dropDuplicates``: every key stays in the HDFS-backed state store) over two input files, one
batch each, through ``exactly_once`` into a ``PartitionedFileSink`` (one count row per batch, so
the sink stays small and the state is what is measured). Then, against a real ``snapcoord serve``
on ZooKeeper + SeaweedFS (``--embedded``: the embedded stores), it times ``take_snapshot`` (cut,
hard-link copy, tar stream to the coordinator, report) and ``restore_snapshot`` (lease, sink
rollback, streamed read, unpack), and checks that the restored query resumes: a third file whose
keys half repeat the first one yields only its new keys. Printed: the state directory's size on
disk, the archive's size, and both times. ``--smoke``: 20 000 keys (a quick check for CI).
``--sftp``: the same query a second time in the same run with its checkpoint (and the restored one)
on a real sshd on loopback, reached through Hadoop's ``sftp://`` FileSystem, and both rows side by
side; ``--s3a``: likewise on ``s3a://`` (hadoop-aws 3.5.0, the jar set ``s3a``, on a SeaweedFS of its
own); ``--hdfs``: likewise on ``hdfs://`` (the tests' HDFS minicluster).
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

from harness import s3a
from harness.hdfs import HdfsCluster
from harness.seaweed import SeaweedS3Server
from harness.sshd import SshServer
from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.savepoints.app_snapshots import ARCHIVE_KEY, SnapshotQuery, take_snapshot
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, restore_snapshot
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once
from snapcoord.spark_connector.storage import open_location

MiB = 1024 * 1024


def write_keys(path: Path, keys: list[str]) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    with tmp.open("w") as f:
        for k in keys:
            f.write(json.dumps({"k": k}) + "\n")
    os.replace(tmp, path)


def random_keys(rng: random.Random, n: int) -> list[str]:
    return [base64.b64encode(rng.randbytes(72)).decode() for _ in range(n)]


def run_dedup(spark: Any, name: str, source: Path, checkpoint: str, batch_function: Any) -> Any:
    """Run the deduplicating query over the files in ``source`` (one per batch) until they are read,
    each batch to ``batch_function``; returns the stopped query."""
    query = (
        spark.readStream.schema("k STRING")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .dropDuplicates(["k"])
        .writeStream.queryName(name)
        .foreachBatch(batch_function)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return query


def run(spark: Any, target: str, name: str, source: Path, checkpoint: str, sink: PartitionedFileSink) -> None:
    def count_new(df: Any, batch_id: int) -> None:
        sink.write(df.groupBy().count(), batch_id)

    writer = exactly_once(
        sink, target, query_name=name, batch_function=count_new, checkpoint_location=checkpoint
    )
    writer.finish(run_dedup(spark, name, source, checkpoint, writer))
    writer.close()


def tree_bytes(storage: Any, path: str) -> int:
    total = 0
    for entry in storage.list(path):
        rel = f"{path}/{entry.name}" if path else entry.name
        total += tree_bytes(storage, rel) if entry.is_dir else entry.size
    return total


def measure(
    spark: Any, client: CoordinatorClient, target: str, work: Path, location: str, keys: int, kind: str
) -> dict[str, Any]:
    """Build the state with the checkpoint at ``location``, then time take_snapshot and restore_snapshot
    (into ``location``-restored) and check that the restored query resumes."""
    rng = random.Random(7)
    half = keys // 2
    first, second = random_keys(rng, half), random_keys(rng, keys - half)
    source = work / "input"
    source.mkdir(parents=True)
    write_keys(source / "in-0.json", first)
    write_keys(source / "in-1.json", second)
    name, app = f"dedup-{kind}", f"bench-{uuid.uuid4().hex[:6]}"
    checkpoint, restored = f"{location}/chk", f"{location}/chk-restored"
    sink = PartitionedFileSink(work / "table", name=name)
    t0 = time.monotonic()
    run(spark, target, name, source, checkpoint, sink)
    print(f"{kind}: building the state (2 batches): {time.monotonic() - t0:.1f} s", flush=True)
    state_bytes = tree_bytes(open_location(checkpoint, spark=spark), "state")

    t0 = time.monotonic()
    snapshot = take_snapshot(client, app, [SnapshotQuery(name, checkpoint, sink)], timeout_s=1800)
    take_s = time.monotonic() - t0
    archive = client.read_checkpoint(app, snapshot.generation, name, ARCHIVE_KEY)
    archive_bytes = sum(len(c) for c in archive)

    new_keys = random_keys(rng, half // 2)
    write_keys(source / "in-2.json", first[: half // 2] + new_keys)
    t0 = time.monotonic()
    restore_snapshot(client, app, snapshot.generation, [RestoreTarget(name, restored, sink)])
    restore_s = time.monotonic() - t0
    run(spark, target, name, source, restored, sink)
    counts = [int(r["count"]) for r in sink.read_json_records()]
    if counts != [half, keys - half, len(new_keys)]:
        raise AssertionError(f"{kind}: the restored query did not resume from the snapshot's state: {counts}")
    return {
        "kind": kind,
        "state_mib": state_bytes / MiB,
        "archive_mib": archive_bytes / MiB,
        "take_s": take_s,
        "restore_s": restore_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--embedded", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--sftp", action="store_true", help="also with the checkpoints on a local sshd")
    parser.add_argument("--s3a", action="store_true", help="also with the checkpoints on s3a:// (SeaweedFS)")
    parser.add_argument(
        "--hdfs", action="store_true", help="also with the checkpoints on an HDFS minicluster"
    )
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
        sshd = None
        builder = SparkSession.builder
        if args.sftp:
            sshd = stack.enter_context(SshServer(tmp / "sshd"))
            for key, value in sshd.spark_conf().items():
                builder = builder.config(key, value)
        s3 = stack.enter_context(SeaweedS3Server(tmp / "s3a")) if args.s3a else None
        if s3 is not None:
            for key, value in s3a.spark_conf(s3).items():
                builder = builder.config(key, value)
        hdfs = stack.enter_context(HdfsCluster(tmp / "hdfs")) if args.hdfs else None
        spark = (
            builder.master("local[2]")
            .appName("snapcoord-bench-snapshot")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        stack.callback(spark.stop)

        rows = [measure(spark, client, coord.target, tmp / "local", str(tmp / "local"), args.keys, "local")]
        if sshd is not None:
            remote = f"bench-{uuid.uuid4().hex[:6]}"
            sshd.local_path(remote).mkdir(parents=True)
            rows.append(
                measure(spark, client, coord.target, tmp / "sftp", sshd.uri(remote), args.keys, "sftp")
            )
        if s3 is not None:
            location = f"s3a://{s3.bucket}/bench"
            rows.append(measure(spark, client, coord.target, tmp / "s3a-work", location, args.keys, "s3a"))
        if hdfs is not None:
            location = hdfs.uri("bench")
            rows.append(measure(spark, client, coord.target, tmp / "hdfs-work", location, args.keys, "hdfs"))
        print(f"# spark_snapshot_restore: {args.keys} keys, local[2]; coordinator on {backend}")
        print("| checkpoint | state | archive | take_snapshot | restore_snapshot | resumed |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['kind']} | {r['state_mib']:.1f} MiB | {r['archive_mib']:.1f} MiB | "
                f"{r['take_s']:.2f} s | {r['restore_s']:.2f} s | ok |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
