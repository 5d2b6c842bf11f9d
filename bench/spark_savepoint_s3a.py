"""Savepoints of about 100 MiB of RocksDB state on ``s3a://`` against copying the same files directly.

    bench/run spark_savepoint_s3a [--keys 1000000] [--rounds 3] [--changelog] [--smoke]

One local[2] SparkSession (hadoop-aws 3.5.0, the jar set ``s3a``) runs a file-source query that
deduplicates random 96-character keys (``dropDuplicates``) with the RocksDB state store provider
(``--changelog``: with changelog checkpointing and checkpoint format v2) over four input files, one
batch each, with its checkpoint on ``s3a://`` (a SeaweedFS of its own). A real ``snapcoord serve`` on
ZooKeeper + another SeaweedFS holds the snapshots, as in production.

Then, in rounds (one of each per round, in this order, so that the load other processes put on the
shared machine falls on all of them alike), it times:

- ``take_snapshot`` of the query, with the connector's copies as they were (one file at a time) and as
  they are (``hadoop.CONCURRENT_COPIES`` files at once where the store serves concurrent requests);
- the same files (``cut_files`` of the same cut: the keys ``take_snapshot`` reads) copied directly to
  another prefix of the same bucket: boto3 ``copy_object`` one key at a time and 8 at a time (server-side
  copies: no byte leaves the store), boto3 ``get_object`` then ``put_object`` one key at a time (the bytes
  go through the client, as a copy into another store must), and Hadoop's ``FileUtil.copy`` one file at a
  time in Spark's JVM (what ``hadoop fs -cp -d`` does per file);
- ``restore_snapshot`` of each snapshot into a new ``s3a://`` checkpoint (one file at a time, then
  several at once);
- where their time goes: the cut read into a stream that nothing uploads (``send_cut``, the read side
  of ``take_snapshot``), and the archive read back from the coordinator with nothing written (the read
  side of ``restore_snapshot``).

Printed: the cut's size and file count, each operation's median (min-max) over the rounds, and
``take_snapshot`` and ``restore_snapshot`` over each direct copy. Last, a third input file whose
keys half repeat the first one runs on the last restored checkpoint (the concurrent restore's): only
its new keys come out, or the benchmark fails. ``--smoke``: 20 000 keys, one round (a quick check for CI).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from common import coordinator_process
from spark_snapshot_restore import random_keys, run_dedup, write_keys

from harness import s3a
from harness.isolation import delete_s3_prefix
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.savepoints.app_snapshots import ARCHIVE_KEY, SnapshotQuery, take_snapshot
from snapcoord.spark_connector.savepoints.checkpoint_archive import (
    CutFile,
    cut_checkpoint,
    cut_files,
    send_cut,
)
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, restore_snapshot
from snapcoord.spark_connector.storage import hadoop, open_location

MiB = 1024 * 1024
BATCHES = 4

ROCKSDB = {"spark.sql.streaming.stateStore.providerClass": (
    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
)}  # fmt: skip
CHANGELOG = {
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.checkpointFormatVersion": "2",
}


def run_query(spark: Any, name: str, source: Path, checkpoint: str) -> list[int]:
    """Run the deduplicating query until its input is read; the new keys of each batch."""
    counts: list[int] = []

    def count_new(df: Any, batch_id: int) -> None:
        counts.append(df.count())

    run_dedup(spark, name, source, checkpoint, count_new)
    return counts


class DirectCopies:
    """The direct copies of one cut's files to other prefixes of the checkpoint's bucket."""

    def __init__(self, spark: Any, s3: SeaweedS3Server, checkpoint_key: str, files: list[CutFile]) -> None:
        self.client = s3.client(read_timeout=600, max_pool_connections=16)
        self.bucket = s3.bucket
        self.keys = [f"{checkpoint_key}/{f.path}" for f in files]
        self.rel = [f.path for f in files]
        self._spark = spark

    def _dest(self, prefix: str, rel: str) -> str:
        return f"{prefix}/{rel}"

    def copy_object(self, prefix: str, threads: int) -> None:
        def one(i: int) -> None:
            source = f"{self.bucket}/{self.keys[i]}"
            self.client.copy_object(
                Bucket=self.bucket, Key=self._dest(prefix, self.rel[i]), CopySource=source
            )

        if threads == 1:
            for i in range(len(self.keys)):
                one(i)
            return
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(len(self.keys))))

    def get_put(self, prefix: str) -> None:
        for key, rel in zip(self.keys, self.rel, strict=True):
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            self.client.put_object(Bucket=self.bucket, Key=self._dest(prefix, rel), Body=body)

    def hadoop_copy(self, prefix: str) -> None:
        jvm = self._spark._jvm
        conf = self._spark._jsparkSession.sessionState().newHadoopConf()
        fs_path = jvm.org.apache.hadoop.fs.Path
        fs = fs_path(f"s3a://{self.bucket}/").getFileSystem(conf)
        for key, rel in zip(self.keys, self.rel, strict=True):
            src = fs_path(f"s3a://{self.bucket}/{key}")
            dst = fs_path(f"s3a://{self.bucket}/{self._dest(prefix, rel)}")
            if not jvm.org.apache.hadoop.fs.FileUtil.copy(fs, src, fs, dst, False, conf):
                raise RuntimeError(f"FileUtil.copy {src} -> {dst} returned false")

    def check(self, prefix: str) -> None:
        """Every copied key exists with its source's size (the copy really happened)."""
        for key, rel in zip(self.keys, self.rel, strict=True):
            want = self.client.head_object(Bucket=self.bucket, Key=key)["ContentLength"]
            got = self.client.head_object(Bucket=self.bucket, Key=self._dest(prefix, rel))["ContentLength"]
            if want != got:
                raise AssertionError(f"{prefix}/{rel}: {got} bytes, its source {want}")

    def delete_prefix(self, prefix: str) -> None:
        delete_s3_prefix(self.client, self.bucket, f"{prefix}/")


#: The connector's copies as they are (``hadoop.CONCURRENT_COPIES`` files at once on s3a://), and as
#: they were before they overlapped files (one file at a time), side by side.
CONCURRENCY = hadoop.CONCURRENT_COPIES
TAKE, TAKE_BEFORE = f"take_snapshot, {CONCURRENCY} files at once", "take_snapshot, one file at a time"
RESTORE = f"restore_snapshot, {CONCURRENCY} files at once"
RESTORE_BEFORE = "restore_snapshot, one file at a time"
READ_CUT = "of take_snapshot: reading the cut into a stream, no upload"
READ_ARCHIVE = "of restore_snapshot: reading the archive from the coordinator, no writes"


@contextmanager
def copies_at_once(n: int) -> Iterator[None]:
    """Storages opened meanwhile copy ``n`` files at once (``storage.copy_concurrency``)."""
    saved = hadoop.CONCURRENT_COPIES
    hadoop.CONCURRENT_COPIES = n
    try:
        yield
    finally:
        hadoop.CONCURRENT_COPIES = saved


def timed(op: Callable[[], object]) -> float:
    t0 = time.monotonic()
    op()
    return time.monotonic() - t0


def summary(values: list[float]) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.2f} s"
    return f"{med:.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--changelog", action="store_true", help="RocksDB changelog checkpointing, format v2")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.keys, args.rounds = 20_000, 1
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapcoord-bench-s3a-sp-")))
        coord, backend = coordinator_process(stack, tmp / "coordinator", embedded=False)
        client = CoordinatorClient(coord.target, timeout_s=600)
        stack.callback(client.close)
        s3 = stack.enter_context(SeaweedS3Server(tmp / "s3a"))
        builder = SparkSession.builder
        conf = {**s3a.spark_conf(s3), **ROCKSDB, **(CHANGELOG if args.changelog else {})}
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = (
            builder.master("local[2]")
            .appName("snapcoord-bench-savepoint-s3a")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
        stack.callback(spark.stop)

        rng = random.Random(7)
        per_batch = args.keys // BATCHES
        batches = [random_keys(rng, per_batch) for _ in range(BATCHES)]
        source = tmp / "input"
        source.mkdir()
        for i, keys in enumerate(batches):
            write_keys(source / f"in-{i}.json", keys)
        name, app = "dedup-s3a", f"bench-{uuid.uuid4().hex[:6]}"
        base_key = "bench"
        checkpoint = f"s3a://{s3.bucket}/{base_key}/chk"
        t0 = time.monotonic()
        counts = run_query(spark, name, source, checkpoint)
        if counts != [per_batch] * BATCHES:
            raise AssertionError(f"building the state: new keys per batch {counts}")
        print(f"building the state ({BATCHES} batches): {time.monotonic() - t0:.1f} s", flush=True)

        storage = open_location(checkpoint, spark=spark)
        files = cut_files(storage, cut_checkpoint(storage))
        cut_bytes = sum(f.size for f in files)
        state = [f for f in files if f.path.startswith("state/")]
        direct = DirectCopies(spark, s3, f"{base_key}/chk", files)

        def storage_now() -> Any:
            return open_location(checkpoint, spark=spark)

        times: dict[str, list[float]] = {}
        copies: list[tuple[str, Callable[[str], None]]] = [
            ("boto3 copy_object, one at a time (server-side)", lambda p: direct.copy_object(p, 1)),
            ("boto3 copy_object, 8 at a time (server-side)", lambda p: direct.copy_object(p, 8)),
            ("boto3 get_object + put_object, one at a time", direct.get_put),
            ("Hadoop FileUtil.copy, one at a time (JVM)", direct.hadoop_copy),
        ]
        restored = ""
        for r in range(args.rounds):
            snapshots = []
            for label, concurrency in ((TAKE_BEFORE, 1), (TAKE, CONCURRENCY)):
                with copies_at_once(concurrency):
                    t0 = time.monotonic()
                    snapshots.append(
                        take_snapshot(
                            client, app, [SnapshotQuery(name, checkpoint)], timeout_s=1800, spark=spark
                        )
                    )
                    times.setdefault(label, []).append(time.monotonic() - t0)
            with copies_at_once(CONCURRENCY):  # where take_snapshot's time goes: the read side alone
                t0 = time.monotonic()
                send_cut(storage_now(), lambda cut, chunks: sum(len(c) for c in chunks))
                times.setdefault(READ_CUT, []).append(time.monotonic() - t0)
            t0 = time.monotonic()
            sum(len(c) for c in client.read_checkpoint(app, snapshots[-1].generation, name, ARCHIVE_KEY))
            times.setdefault(READ_ARCHIVE, []).append(time.monotonic() - t0)
            for i, (label, copy) in enumerate(copies):
                prefix = f"{base_key}/direct-{r}-{i}"
                times.setdefault(label, []).append(timed(lambda c=copy, p=prefix: c(p)))  # type: ignore[misc]
                direct.check(prefix)
                direct.delete_prefix(prefix)
            restores = ((RESTORE_BEFORE, 1), (RESTORE, CONCURRENCY))
            for i, (label, concurrency) in enumerate(restores):
                if restored:
                    direct.delete_prefix(restored.removeprefix(f"s3a://{s3.bucket}/"))
                restored = f"s3a://{s3.bucket}/{base_key}/restored-{r}-{i}"
                target = RestoreTarget(name, restored)
                with copies_at_once(concurrency):
                    t0 = time.monotonic()
                    restore_snapshot(client, app, snapshots[i].generation, [target], spark=spark)
                    times.setdefault(label, []).append(time.monotonic() - t0)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)

        again = random_keys(rng, per_batch // 2)
        write_keys(source / f"in-{BATCHES}.json", batches[0][: per_batch // 2] + again)
        resumed = run_query(spark, name, source, restored)
        if resumed != [len(again)]:
            raise AssertionError(f"the restored query did not resume from the snapshot's state: {resumed}")

        mode = "RocksDB, changelog checkpointing, format v2" if args.changelog else "RocksDB"
        print(
            f"# spark_savepoint_s3a: {args.keys} keys, {mode}, local[2], {args.rounds} round(s); "
            f"checkpoint on s3a:// (hadoop-aws 3.5.0, SeaweedFS), coordinator on {backend}"
        )
        print(
            f"cut: {len(files)} files, {cut_bytes / MiB:.1f} MiB "
            f"(state: {len(state)} files, {sum(f.size for f in state) / MiB:.1f} MiB)"
        )
        take_s, restore_s = statistics.median(times[TAKE]), statistics.median(times[RESTORE])
        print(f"| operation | time, median (min-max) | {TAKE} / it | {RESTORE} / it |")
        print("|---|---|---|---|")
        for label, values in times.items():
            med = statistics.median(values)
            print(f"| {label} | {summary(values)} | {take_s / med:.2f}x | {restore_s / med:.2f}x |")
        print("the restored query resumed from the snapshot's state: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
