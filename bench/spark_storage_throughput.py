"""Read and write throughput of the connector's storage backends, side by side in one run.

    bench/run spark_storage_throughput [--mb 100] [--smoke]

One file of random bytes (``--mb`` MiB) is uploaded to and downloaded from each backend the connector
uses for checkpoints and tables, and checked byte for byte: a local directory (``LocalStorage``);
Spark's Hadoop FileSystem from a classic driver over ``file:``, ``sftp://`` (a real sshd on loopback,
as in the tests), ``s3a://`` (hadoop-aws 3.5.0 on a real SeaweedFS, the jar set ``s3a``) and
``hdfs://`` (the tests' HDFS minicluster); fsspec over the same sftp server (paramiko) and over S3
(s3fs on the same SeaweedFS). Each direction is timed alone; printed in MiB/s. ``--smoke``: 4 MiB (a
quick check for CI).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

from common import ROOT  # noqa: F401  (puts tests/ on sys.path for the harness)

from harness import s3a
from harness.hdfs import HdfsCluster
from harness.seaweed import SeaweedS3Server
from harness.sshd import SshServer
from snapcoord.spark_connector.storage import LocalStorage, Storage, open_location
from snapcoord.spark_connector.storage.hadoop import hadoop_storage

MiB = 1024 * 1024


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest()


def timed(op: Callable[[], object]) -> float:
    start = time.perf_counter()
    op()
    return time.perf_counter() - start


def spark_session(sshd: SshServer, s3: SeaweedS3Server) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName("storage-throughput")
    conf = {**sshd.spark_conf(), **s3a.spark_conf(s3), "spark.ui.enabled": "false"}
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="size of the file moved each way, MiB")
    parser.add_argument("--smoke", action="store_true", help="4 MiB: a quick check that it all runs")
    args = parser.parse_args()
    size_mb = 4 if args.smoke else args.mb

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-storage-")))
        sshd = stack.enter_context(SshServer(tmp / "sshd"))
        s3 = stack.enter_context(SeaweedS3Server(tmp / "seaweedfs"))
        hdfs = stack.enter_context(HdfsCluster(tmp / "hdfs"))
        spark = spark_session(sshd, s3)
        stack.callback(spark.stop)
        s3_options = {"endpoint_url": s3.endpoint_url, "key": s3.access_key, "secret": s3.secret_key}

        sftp_options = sshd.storage_options()
        backends: list[tuple[str, Storage]] = [
            ("local directory", LocalStorage(tmp / "local")),
            ("Hadoop, file:", hadoop_storage(spark, (tmp / "hadoop-file").as_uri())),
            ("Hadoop, sftp://", open_location(sshd.uri("hadoop"), spark=spark)),
            ("Hadoop, s3a:// (SeaweedFS)", open_location(f"s3a://{s3.bucket}/hadoop", spark=spark)),
            ("Hadoop, hdfs://", open_location(hdfs.uri("hadoop"), spark=spark)),
            (
                "fsspec, sftp://",
                open_location(sshd.uri("fsspec"), use_jvm=False, storage_options=sftp_options),
            ),
            (
                "fsspec, s3:// (SeaweedFS)",
                open_location(s3.uri("b"), use_jvm=False, storage_options=s3_options),
            ),
        ]

        source = tmp / "source.bin"
        with source.open("wb") as f:
            for _ in range(size_mb):
                f.write(os.urandom(MiB))
        expected = digest(source)

        print(f"{size_mb} MiB each way, one file; MiB/s (higher is better)")
        print(f"{'backend':<28} {'write':>10} {'read':>10}")
        for name, storage in backends:
            copy = tmp / f"copy-{len(name)}.bin"
            write_s = timed(partial(storage.upload, source, "data/file.bin"))
            read_s = timed(partial(storage.download, "data/file.bin", copy))
            if digest(copy) != expected:
                raise SystemExit(f"{name}: the file read back differs from the one written")
            copy.unlink()
            storage.delete_tree("data")
            print(f"{name:<28} {size_mb / write_s:>10.1f} {size_mb / read_s:>10.1f}", flush=True)
        print("every copy read back byte-identical: ok")


if __name__ == "__main__":
    main()
