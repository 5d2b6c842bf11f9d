"""exactly_once's own time per batch on a local table and on remote tables, side by side in one run.

    bench/run spark_sink_remote [--batches 20] [--rounds 2] [--embedded] [--smoke] [--s3a] [--hdfs]

One local[2] SparkSession that reaches a real sshd through Hadoop's ``sftp://`` FileSystem writes the
same batches (200 records over four partitions) through ``exactly_once(PartitionedFileSink)`` into a
local table and into tables on the sshd, alternately (local, sftp, sftp-store, sftp-store, sftp,
local, ...). sftp's create-if-absent is not atomic, so the sink's commit point there is the
coordinator (``sftp``: a commit claim per batch); ``sftp-store`` forces the store-only commit on the
same store, the protocol the claims replace, for comparison. ``--s3a`` adds a table on ``s3a://``
(hadoop-aws 3.5.0, the jar set ``s3a``, on a SeaweedFS of its own), whose conditional create makes the
store the commit point, and the same pair as sftp's on a second bucket of that server where S3A creates
by a check and then a PUT (``fs.s3a.bucket.<bucket>.create.conditional.enabled=false``):
``s3a-uncond`` (the coordinator's claims) and ``s3a-uncond-store``. ``--hdfs`` adds one on ``hdfs://``
(the tests' HDFS minicluster). Per batch it reports, measured in the driver:

- ``wrapper``: the wrapper's coordinator steps (fence check, the call that deletes the previous
  record and registers this batch's), i.e. the call minus the sink's ``write``;
- ``sink``: the sink's driver steps (fence checks, listing the written files, creating the log
  entry): ``write`` minus Spark's jobs (the partition values' query and one write per value);
- ``storage ops``: the object-store calls the sink made for the batch, and their time;
- ``claims``: the sink's calls to the coordinator (commit claims) for the batch, and their time;
- ``spark``: Spark's jobs, for scale.

The first batch of each round (the fence and the run's first claims) is left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from common import coordinator_process, local_spark

from harness import s3a
from harness.hdfs import HdfsCluster
from harness.seaweed import SeaweedS3Server
from harness.sshd import SshServer
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once


class Timed:
    """A ``Storage`` proxy that adds up the time and count of every call."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls, self.seconds = inner, 0, 0.0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value) or name in ("uri", "child"):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.calls += 1
                self.seconds += time.perf_counter() - start

        return timed


class MeasuredSink(PartitionedFileSink):
    spark_s = 0.0
    write_s = 0.0
    #: Commit on the store alone even where its create is not atomic (the "before" of the claims).
    store_only = False
    claims: Timed | None = None

    def needs_coordinator(self) -> bool:
        return False if self.store_only else super().needs_coordinator()

    def use_coordinator(self, client: Any) -> None:
        self.claims = Timed(client)
        super().use_coordinator(self.claims)  # type: ignore[arg-type]  # a timing proxy

    def _write_files(self, df: Any, write_dir: str) -> Any:
        storage: Timed = self._storage  # type: ignore[assignment]
        before, start = storage.seconds, time.perf_counter()
        try:
            return super()._write_files(df, write_dir)
        finally:
            self.spark_s += time.perf_counter() - start - (storage.seconds - before)

    def write(self, df: Any, batch_id: int | None = None) -> int:
        start = time.perf_counter()
        try:
            return super().write(df, batch_id)
        finally:
            self.write_s += time.perf_counter() - start


#: A second bucket on ``--s3a``'s server, where S3A's create is a check and then a PUT.
UNCONDITIONAL_BUCKET = "unconditional"


def one_round(
    spark: Any, target: str, location: str, name: str, batches: int, *, store_only: bool = False
) -> list[dict[str, float]]:
    sink = MeasuredSink(location, partition_by=["bucket"], name=name)
    sink.store_only = store_only
    sink._storage = Timed(sink.storage)
    storage: Timed = sink._storage
    writer = exactly_once(sink, target, query_name=name)
    rows: list[dict[str, float]] = []
    try:
        for b in range(batches):
            df = spark.createDataFrame(
                [(b * 1000 + i, f"b{i % 4}") for i in range(200)], "id long, bucket string"
            )
            sink.spark_s = sink.write_s = 0.0
            calls, storage_s = storage.calls, storage.seconds
            claims = sink.claims
            claim_calls, claim_s = (claims.calls, claims.seconds) if claims is not None else (0, 0.0)
            start = time.perf_counter()
            writer(df, b)
            total = time.perf_counter() - start
            if b == 0:
                continue
            rows.append(
                {
                    "wrapper": (total - sink.write_s) * 1000,
                    "sink": (sink.write_s - sink.spark_s) * 1000,
                    "own": (total - sink.spark_s) * 1000,
                    "storage_calls": storage.calls - calls,
                    "storage": (storage.seconds - storage_s) * 1000,
                    "claims": (sink.claims.calls - claim_calls) if sink.claims is not None else 0,
                    "claims_ms": ((sink.claims.seconds - claim_s) * 1000) if sink.claims is not None else 0.0,
                    "spark": sink.spark_s * 1000,
                }
            )
    finally:
        writer.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--embedded", action="store_true", help="coordinator on its embedded stores")
    p.add_argument("--smoke", action="store_true", help="3 batches, 1 round (a check that it runs)")
    p.add_argument("--s3a", action="store_true", help="also a table on s3a:// (SeaweedFS)")
    p.add_argument("--hdfs", action="store_true", help="also a table on an HDFS minicluster")
    args = p.parse_args(argv)
    if args.smoke:
        args.batches, args.rounds = 3, 1
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sink-remote-")))
        coord, backend = coordinator_process(stack, work / "coordinator", embedded=args.embedded)
        sshd = stack.enter_context(SshServer(work / "sshd"))
        conf = dict(sshd.spark_conf())
        s3 = stack.enter_context(SeaweedS3Server(work / "s3a")) if args.s3a else None
        if s3 is not None:
            s3.client().create_bucket(Bucket=UNCONDITIONAL_BUCKET)
            conf.update(s3a.spark_conf(s3))
            conf[f"spark.hadoop.fs.s3a.bucket.{UNCONDITIONAL_BUCKET}.create.conditional.enabled"] = "false"
        hdfs = stack.enter_context(HdfsCluster(work / "hdfs")) if args.hdfs else None
        spark = local_spark(conf)
        locations: dict[str, Callable[[int], str]] = {
            "local": lambda r: str(work / f"local-{r}"),
            "sftp": lambda r: sshd.uri(f"sftp-{r}"),
            "sftp-store": lambda r: sshd.uri(f"sftp-store-{r}"),
        }
        if s3 is not None:
            bucket = s3.bucket
            locations["s3a"] = lambda r: f"s3a://{bucket}/sink-{r}"
            locations["s3a-uncond"] = lambda r: f"s3a://{UNCONDITIONAL_BUCKET}/sink-{r}"
            locations["s3a-uncond-store"] = lambda r: f"s3a://{UNCONDITIONAL_BUCKET}/sink-store-{r}"
        if hdfs is not None:
            cluster = hdfs
            locations["hdfs"] = lambda r: cluster.uri(f"sink-{r}")
        results: dict[str, list[dict[str, float]]] = {k: [] for k in locations}
        order = list(locations)
        for r in range(args.rounds):
            for kind in order if r % 2 == 0 else order[::-1]:
                results[kind] += one_round(
                    spark,
                    coord.target,
                    locations[kind](r),
                    f"bench-{kind}-{r}",
                    args.batches,
                    store_only=kind.endswith("-store"),
                )
        spark.stop()

    print(
        f"exactly_once's own time per batch (medians over {args.rounds} x {args.batches - 1} batches; "
        f"{backend})"
    )
    keys = ["wrapper", "sink", "own", "storage_calls", "storage", "claims", "claims_ms", "spark"]
    print(f"{'table':<16} " + " ".join(f"{k:>13}" for k in keys) + "   (ms; storage_calls, claims: count)")
    for kind, rows in results.items():
        cells = [statistics.median(row[k] for row in rows) for k in keys]
        print(f"{kind:<16} " + " ".join(f"{c:>13.1f}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
