"""Shared bench plumbing: real servers from the test harness, timing, and the ratio table.

Every benchmark measures the raw cost of the same ZooKeeper/S3/gRPC operation in the same run
and prints our cost as a ratio of it, so numbers stay comparable across machines and loads.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the harness that starts real ZooKeeper and SeaweedFS

from harness.coordinator import CoordinatorProcess  # noqa: E402
from harness.seaweed import SeaweedS3Server  # noqa: E402
from harness.zookeeper import ZooKeeperServer  # noqa: E402


@dataclass(frozen=True)
class Sample:
    """Latencies of one operation, in seconds."""

    name: str
    latencies_s: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_s) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    @property
    def ops_per_s(self) -> float:
        return len(self.latencies_s) / sum(self.latencies_s)


def measure(name: str, n: int, op: Callable[[int], object], *, warmup: int = 20) -> Sample:
    """Run ``op(i)`` ``n`` times (after ``warmup`` unrecorded calls) and keep each latency."""
    for i in range(warmup):
        op(-1 - i)
    latencies = []
    for i in range(n):
        start = time.perf_counter()
        op(i)
        latencies.append(time.perf_counter() - start)
    return Sample(name, latencies)


def for_seconds(
    clients: int, seconds: float, step: Callable[[int, int], object], start_at: list[int]
) -> float:
    """``clients`` threads call ``step(c, k)`` back to back for ``seconds``: ``c`` the thread's index,
    ``k`` its call number, from ``start_at[c]`` on (left at the number of its next call). Returns
    the elapsed seconds; raises the first error of any thread once all stopped."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(clients + 1)
    stop = threading.Event()

    def worker(c: int) -> None:
        barrier.wait()
        k = start_at[c]
        try:
            while not stop.is_set():
                step(c, k)
                k += 1
        except BaseException as e:  # re-raised below, not swallowed
            errors.append(e)
        finally:
            start_at[c] = k

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


def measure_pair(
    raw_name: str,
    raw_op: Callable[[int], object],
    our_name: str,
    our_op: Callable[[int], object],
    n: int,
    *,
    warmup: int = 20,
    undo: Callable[[int], object] | None = None,
) -> tuple[Sample, Sample]:
    """Like ``measure`` for a baseline and ours, interleaved call by call, so that drift in the
    servers (JIT warm-up, compaction, a noisy neighbour) hits both sides alike. ``undo(i)``, when
    given, runs untimed after each ``our_op(i)`` (e.g. to drop what it made)."""
    for i in range(warmup):
        raw_op(-1 - i)
        our_op(-1 - i)
        if undo is not None:
            undo(-1 - i)
    raw: list[float] = []
    ours: list[float] = []
    for i in range(n):
        for op, out in ((raw_op, raw), (our_op, ours)):
            start = time.perf_counter()
            op(i)
            out.append(time.perf_counter() - start)
        if undo is not None:
            undo(i)
    return Sample(raw_name, raw), Sample(our_name, ours)


def print_table(title: str, rows: list[tuple[Sample, Sample | None]]) -> None:
    """One line per (ours, raw baseline) pair: median, p99, throughput and ratio of medians."""
    print(f"\n## {title}")
    print(f"{'operation':<44} {'median ms':>10} {'p99 ms':>8} {'ops/s':>8} {'vs raw':>7}  baseline")
    for ours, raw in rows:
        ratio = f"{ours.median_ms / raw.median_ms:6.2f}x" if raw is not None else "      -"
        base = raw.name if raw is not None else ""
        stats = f"{ours.median_ms:10.3f} {ours.p99_ms:8.3f} {ours.ops_per_s:8.0f}"
        print(f"{ours.name:<44} {stats} {ratio:>7}  {base}")


@contextmanager
def real_servers(*, fsync: bool = False) -> Iterator[tuple[ZooKeeperServer, SeaweedS3Server]]:
    """A standalone ZooKeeper and a SeaweedFS S3 gateway on loopback, stopped on exit. ZooKeeper
    fsyncs each transaction only with ``fsync`` (as deployed; the default, like the tests, skips it)."""
    with tempfile.TemporaryDirectory(prefix="snapcoord-bench-") as tmp:
        zk = ZooKeeperServer(Path(tmp) / "zk", force_sync=fsync)
        s3 = SeaweedS3Server(Path(tmp) / "s3")
        with zk, s3:
            yield zk, s3


#: Channel options for replies that list every partition of a large backlog job (a status of
#: 10,000 partitions with long stream names passes gRPC's 4 MB default).
LARGE_REPLIES = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


@contextmanager
def in_process_coordinator(metadata_uri: str, blobs_uri: str, **flags: str) -> Iterator[int]:
    """A coordinator started in this process on the given stores, for benchmarks that time RPCs:
    loopback, port 0, metrics off and the janitor off unless ``flags`` say otherwise (flag names
    as in ``snapcoord serve``, underscores for dashes). Yields the gRPC port; closes everything."""
    from snapcoord.coordinator.config import settings as coordinator_config
    from snapcoord.coordinator.server.app import build_server
    from snapcoord.coordinator.services import Deps
    from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store

    deps = Deps(metadata=open_metadata_store(metadata_uri), blobs=open_blob_store(blobs_uri))
    try:
        base = {"host": "127.0.0.1", "port": "0", "metrics_port": "-1", "cleanup_interval": "0s"}
        server, port = build_server(coordinator_config.load({**base, **flags}, {}), deps)
        server.start()
        try:
            yield port
        finally:
            server.shutdown(None)
    finally:
        deps.blobs.close()
        deps.metadata.close()


def coordinator_process(
    stack: ExitStack, directory: Path, *, embedded: bool
) -> tuple[CoordinatorProcess, str]:
    """A ``snapcoord serve`` process for the Spark benchmarks (a driver talks to a separate
    server, as in production): on the embedded stores, or on a fresh ZooKeeper and SeaweedFS (S3
    credentials exported for the driver). Entered on ``stack``; returns it and what it runs on."""
    coord_args: list[str] = []
    backend = "embedded stores"
    if not embedded:
        zk, s3 = stack.enter_context(real_servers())
        os.environ.update(s3.env())
        run_id = uuid.uuid4().hex[:8]
        coord_args = ["--metadata", f"zk://{zk.hosts}/bench-{run_id}", "--blobs", s3.uri(f"bench-{run_id}")]
        backend = f"ZooKeeper {zk.hosts} + S3 {s3.endpoint_url}"
    return stack.enter_context(CoordinatorProcess(directory, args=coord_args)), backend


def raw_s3_client(s3: SeaweedS3Server) -> Any:
    """A plain boto3 S3 client on ``s3``, for the raw side of payload benchmarks: path-style, with
    timeouts long enough for hundreds of MB in one call."""
    import boto3
    from botocore.config import Config

    config = Config(read_timeout=600, connect_timeout=30, s3={"addressing_style": "path"})
    return boto3.client("s3", endpoint_url=s3.endpoint_url, config=config)


def local_spark(conf: dict[str, str]) -> Any:
    """The Spark benchmarks' local[2] session on loopback (no UI, 2 shuffle partitions, errors
    only), with ``conf`` set before its JVM starts."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = (
        builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
