"""Hot RPCs and ``exactly_once`` with a deployment's storage latency: ZooKeeper and S3 behind a delay proxy.

    bench/run latency [--seconds 2.0] [--rounds 3] [--clients 1,64] [--zk-delay-ms 1] [--s3-delay-ms 15]
                      [--only WORDS] [--smoke]

The benchmark starts ZooKeeper and SeaweedFS on loopback, and ``delay_proxy.py`` (its own process)
in front of each: every chunk a client sends reaches the server ``--zk-delay-ms`` (ZooKeeper) or
``--s3-delay-ms`` (S3) after it was sent, replies come back undelayed. A ``snapcoord serve``
process reaches both stores only through the proxies, and so does the raw side: kazoo (one
session, like the coordinator's) and boto3 (as many connections as clients) doing the storage work
each RPC stands for. The gRPC hop from the clients to the coordinator is not delayed: the rows
show what storage latency does to each call.

Each row alternates ours and raw in ``--rounds`` slices of ``--seconds`` at each concurrency of
``--clients`` (threads calling back to back) and prints p50 and p99 of each side and their calls/s
(Little's law: clients / mean latency; a row whose calls need an untimed setup, such as a record
to delete, times only the call). Units, measured at each concurrency first:

- ``in S3 PUTs``: our p50 / the p50 of one raw 1 KiB PUT through the proxy with boto3's defaults
  (which wait for ``100 Continue`` before the body: two delayed exchanges, as an application's
  own PUT to S3 pays). The target: a small Register, Get, Delete or Report under half of one. The
  raw side of the rows sends small bodies without that wait, as the coordinator does; the unit
  without it is printed too;
- ``in ZK trips``: our p50 / the p50 of one raw kazoo get through the proxy (a ZooKeeper round
  trip; ``exactly_once``'s goal: a batch within 3);
- ``own ms``: our p50 minus the raw side's p50 minus a bare gRPC round trip's (a health check
  through the same coordinator): the coordinator's own work per call beyond transport and storage.
  Negative when it needs fewer storage round trips than the raw side (e.g. a payload kept in
  ZooKeeper instead of S3).

``exactly_once, per batch`` is the connector's ``ExactlyOnceWriter`` called for batch N after
N-1, as Spark's driver calls it, with a sink that writes nothing and no Spark: its coordinator
steps only (on a classic driver it also reads the query id and, with ``checkpoint_location``,
the batch's offsets file; ``bench/run spark_sink_remote`` times the whole of it with Spark). Its
raw side is a raw delete of N-1's record and payload plus a raw registration of N's.

``--smoke`` runs every row once, briefly (CI; no timing asserted); ``--only register,batch``
runs only the rows whose names contain one of the words.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from common import Sample, for_seconds, real_servers
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kazoo.client import KazooClient

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.sink.writer import ExactlyOnceWriter
from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    common_pb2,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

HERE = Path(__file__).resolve().parent

#: ``op(client, k)``: the client's index (0..c-1) and its call number.
Op = Callable[[int, int], object]
T = TypeVar("T")


# --- the delay proxies -----------------------------------------------------------------------------


@contextmanager
def delay_proxies(routes: Sequence[tuple[str, float]]) -> Iterator[list[str]]:
    """``delay_proxy.py`` in its own process for ``(host:port, delay_ms)`` routes; yields the
    proxies' ``127.0.0.1:port``, in order; stops the process on exit."""
    args = [f"{target}@{delay_ms}" for target, delay_ms in routes]
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "delay_proxy.py"), *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready "):
            raise SystemExit(f"delay_proxy.py did not start (exit {proc.poll()}): {line!r}")
        yield [f"127.0.0.1:{port}" for port in line.split()[1:]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- timing ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side of a row: the timed call, and what runs untimed before each one (e.g. making the
    record a delete removes)."""

    op: Op
    setup: Op | None = None


@dataclass(frozen=True)
class Latencies(Sample):
    """Latencies of calls made by ``clients`` threads at once."""

    clients: int = 1

    @property
    def p50_ms(self) -> float:
        return self.median_ms

    @property
    def ops_s(self) -> float:
        """Calls per second with ``clients`` calls always in flight (Little's law)."""
        return self.clients / statistics.fmean(self.latencies_s)


def run_slice(side: Side, clients: int, seconds: float, start_at: list[int]) -> list[float]:
    """``clients`` threads call ``side`` back to back for ``seconds``; every timed call's latency."""
    latencies: list[list[float]] = [[] for _ in range(clients)]

    def step(c: int, k: int) -> None:
        if side.setup is not None:
            side.setup(c, k)
        started = time.perf_counter()
        side.op(c, k)
        latencies[c].append(time.perf_counter() - started)

    for_seconds(clients, seconds, step, start_at)
    return [x for per_client in latencies for x in per_client]


@dataclass(frozen=True)
class Row:
    name: str
    clients: int
    ours: Latencies
    raw: Latencies | None
    baseline: str


@dataclass
class Bench:
    seconds: float
    rounds: int
    warmup_s: float
    only: list[str]
    rows: list[Row] = field(default_factory=list)
    #: Unit rows by (name, clients): the raw 1 KiB PUT, the raw ZooKeeper get, the bare gRPC hop.
    units: dict[tuple[str, int], Latencies] = field(default_factory=dict)

    def wants(self, name: str) -> bool:
        return not self.only or any(o in name.lower() for o in self.only)

    def _sides(self, clients: int, sides: list[Side]) -> list[list[float]]:
        """Warm each side up, then alternate them ``rounds`` times (order reversed every other
        round, so that drift hits both alike); each side's latencies."""
        at = [[0] * clients for _ in sides]
        for side, start in zip(sides, at, strict=True):
            run_slice(side, clients, self.warmup_s, start)
        out: list[list[float]] = [[] for _ in sides]
        for r in range(self.rounds):
            order = list(range(len(sides)))
            if r % 2:
                order.reverse()
            for i in order:
                out[i] += run_slice(sides[i], clients, self.seconds, at[i])
        return out

    def unit(self, name: str, clients: int, side: Side) -> Latencies:
        (seconds,) = self._sides(clients, [side])
        result = Latencies(name, seconds, clients)
        self.units[name, clients] = result
        print(
            f"{name:<52} {clients:>3} {result.p50_ms:8.2f} {result.p99_ms:8.2f} {result.ops_s:8.0f}",
            flush=True,
        )
        return result

    def pair(self, name: str, clients: int, ours: Side, raw: Side, baseline: str) -> None:
        if not self.wants(name):
            return
        ours_s, raw_s = self._sides(clients, [ours, raw])
        row = Row(
            name, clients, Latencies(name, ours_s, clients), Latencies(baseline, raw_s, clients), baseline
        )
        self.rows.append(row)
        print(self.format(row), flush=True)

    def format(self, row: Row) -> str:
        put = self.units[UNIT_PUT, row.clients].p50_ms
        zk = self.units[UNIT_ZK, row.clients].p50_ms
        hop = self.units[UNIT_HOP, row.clients].p50_ms
        o, r = row.ours, row.raw
        assert r is not None
        return (
            f"{row.name:<52} {row.clients:>3} {o.p50_ms:8.2f} {o.p99_ms:8.2f} {o.ops_s:8.0f} "
            f"{r.p50_ms:8.2f} {r.p99_ms:8.2f} {r.ops_s:8.0f} {o.ops_s / r.ops_s:7.2f} "
            f"{o.p50_ms / put:7.2f} {o.p50_ms / zk:7.1f} {o.p50_ms - r.p50_ms - hop:7.2f}  {row.baseline}"
        )


UNIT_PUT = "raw S3 PUT, 1 KiB (boto3's defaults)"
UNIT_PUT_NO_EXPECT = "raw S3 PUT, 1 KiB, no Expect: 100-continue"
UNIT_ZK = "raw ZooKeeper get"
UNIT_HOP = "bare gRPC round trip (health check)"
HEADER = (
    f"{'operation':<52} {'c':>3} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>8} "
    f"{'raw p50':>8} {'raw p99':>8} {'raw/s':>8} {'ops/raw':>7} {'in PUTs':>7} {'in ZK':>7} {'own ms':>7}"
    "  raw side"
)


# --- what the coordinator and the raw side run ---------------------------------------------------


def by_client(stubs: list[T]) -> Callable[[int], T]:
    """Client ``c``'s stub: the clients spread over the channels."""
    return lambda c: stubs[c % len(stubs)]


def offsets(n: int, base: int = 10**6) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream="events", partition=p, offset=base + p) for p in range(n)]


class NullSink:
    """A sink for ``exactly_once`` that writes nothing: its position is the count of batches the
    writer ran, and a rollback (which a run without failures never needs) is counted."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches = 0
        self.rollbacks = 0

    def positions(self) -> list[Offset]:
        return [Offset(self.name, 0, self.batches)]

    def rollback_to(self, positions: Sequence[Offset]) -> None:
        self.rollbacks += 1

    def write(self, df: object, batch_id: int) -> None:
        self.batches += 1


class Raw:
    """The raw storage work, through the proxies: kazoo on one session, boto3 with a connection per
    client."""

    def __init__(self, zk: KazooClient, s3: S3Client, bucket: str, run_id: str) -> None:
        self.zk, self.s3, self.bucket = zk, s3, bucket
        self.base = f"/bench-{run_id}/raw"
        self.prefix = f"bench-{run_id}/raw"
        zk.ensure_path(f"{self.base}/n")
        zk.ensure_path(f"{self.base}/r")
        for c in range(256):  # a node per client that the raw side reads and sets
            zk.create(f"{self.base}/n/{c}", b"x" * 300)
        s3.put_object(Bucket=bucket, Key=f"{self.prefix}/read", Body=os.urandom(300))

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def put(self, name: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self.key(name), Body=body)

    def s3_get(self) -> None:
        self.s3.get_object(Bucket=self.bucket, Key=f"{self.prefix}/read")["Body"].read()

    def get(self, c: int) -> None:
        self.zk.get(f"{self.base}/n/{c}")

    def get_with_payload(self, c: int) -> None:
        """A record's read: its node, then its payload."""
        self.get(c)
        self.s3_get()

    def progress(self, c: int) -> None:
        """A progress report's work: the job and its shard read, the shard set."""
        self.get(c)
        self.get(c)
        self.commit(sets=[c], data=b"x" * 400)

    def commit(self, creates: Sequence[str] = (), sets: Sequence[int] = (), deletes: Sequence[str] = (),
               data: bytes = b"x" * 300) -> None:  # fmt: skip
        tx = self.zk.transaction()
        for name in creates:
            tx.create(f"{self.base}/r/{name}", data)
        for c in sets:
            tx.set_data(f"{self.base}/n/{c}", data)
        for name in deletes:
            tx.delete(f"{self.base}/r/{name}")
        results = tx.commit()
        assert not any(isinstance(r, Exception) for r in results), results

    def register(self, name: str, payload: bytes) -> None:
        """A registration's work: the payload's put, then the record and its expiry entry."""
        self.put(name, payload)
        self.commit(creates=[name, f"{name}.i"])

    def delete(self, name: str) -> None:
        """A deletion's work: read the record, delete it and its entry, then its payload."""
        self.zk.get(f"{self.base}/r/{name}")
        self.commit(deletes=[name, f"{name}.i"])
        self.s3.delete_object(Bucket=self.bucket, Key=self.key(name))


def measure_at(bench: Bench, clients: int, target: str, raw: Raw, default_put: S3Client) -> None:
    print(f"\n## c={clients}", flush=True)
    channels = [grpc.insecure_channel(target) for _ in range(4)]
    connector_clients = [CoordinatorClient(target, timeout_s=120) for _ in range(4)]
    try:
        _measure_at(bench, clients, channels, connector_clients, raw, default_put)
    finally:
        for x in connector_clients:
            x.close()
        for ch in channels:
            ch.close()


def _measure_at(
    bench: Bench,
    clients: int,
    channels: list[grpc.Channel],
    connector: list[CoordinatorClient],
    raw: Raw,
    default_put: S3Client,
) -> None:
    P = by_client([producer_pb2_grpc.ProducerOffsetServiceStub(x) for x in channels])
    S = by_client([snapshot_pb2_grpc.SnapshotServiceStub(x) for x in channels])
    B = by_client([backlog_pb2_grpc.BacklogServiceStub(x) for x in channels])
    H = by_client([health_pb2_grpc.HealthStub(x) for x in channels])

    print(f"{'unit':<52} {'c':>3} {'p50 ms':>8} {'p99 ms':>8} {'ops/s':>8}", flush=True)
    kib = os.urandom(1024)
    bench.unit(
        UNIT_PUT,
        clients,
        Side(lambda c, k: default_put.put_object(Bucket=raw.bucket, Key=raw.key(f"unit-{c}-{k}"), Body=kib)),
    )
    bench.unit(UNIT_PUT_NO_EXPECT, clients, Side(lambda c, k: raw.put(f"unit-{c}-{k}", kib)))
    bench.unit(UNIT_ZK, clients, Side(lambda c, k: raw.get(c)))
    bench.unit(
        UNIT_HOP,
        clients,
        Side(lambda c, k: H(c).Check(health_pb2.HealthCheckRequest(), timeout=60)),
    )
    print(HEADER, flush=True)
    t = f"{uuid.uuid4().hex[:6]}-{clients}"
    ten = offsets(10)
    payload = producer_pb2.ProducerSnapshot(offsets=ten).SerializeToString()  # a same-size raw payload

    def register(c: int, k: int, prefix: str = "r") -> None:
        request = producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"{prefix}{t}-{c}-{k}", offsets=ten)
        assert P(c).RegisterProducerOffsets(request, timeout=60).registered

    bench.pair(
        "RegisterProducerOffsets, 10 offsets",
        clients,
        Side(register),
        Side(lambda c, k: raw.register(f"r{t}-{c}-{k}", payload)),
        "S3 put + multi(record, expiry entry)",
    )
    if bench.wants("GetProducerOffsets"):
        for c in range(clients):  # the records the row reads
            for i in range(5):
                register(c, i, "g")
    bench.pair(
        "GetProducerOffsets",
        clients,
        Side(
            lambda c, k: P(c).GetProducerOffsets(
                producer_pb2.GetProducerOffsetsRequest(producer_id=f"g{t}-{c}-{k % 5}"), timeout=60
            )
        ),
        Side(lambda c, k: raw.get_with_payload(c)),
        "get + S3 get",
    )

    def delete(c: int, k: int) -> None:
        request = producer_pb2.DeleteProducerOffsetsRequest(producer_id=f"d{t}-{c}-{k}")
        assert P(c).DeleteProducerOffsets(request, timeout=60).deleted

    bench.pair(
        "DeleteProducerOffsets",
        clients,
        Side(delete, setup=lambda c, k: register(c, k, "d")),
        Side(
            lambda c, k: raw.delete(f"d{t}-{c}-{k}"),
            setup=lambda c, k: raw.register(f"d{t}-{c}-{k}", payload),
        ),
        "get + multi(delete record, entry) + S3 delete",
    )
    for size, label in ((512, "512 B"), (4096, "4 KiB")):
        body = os.urandom(size)
        app = f"rep{size}-{t}"
        tasks = 2000

        def create(c: int, k: int, app: str = app, tasks: int = tasks) -> None:
            if k % tasks == 0:
                S(c).CreateSnapshot(
                    snapshot_pb2.CreateSnapshotRequest(
                        app_id=f"{app}-{c}", task_ids=[f"t{i}" for i in range(tasks)]
                    ),
                    timeout=60,
                )

        def report(c: int, k: int, app: str = app, body: bytes = body, tasks: int = tasks) -> None:
            S(c).ReportTaskSnapshot(
                snapshot_pb2.ReportTaskSnapshotRequest(
                    app_id=f"{app}-{c}",
                    generation=k // tasks + 1,
                    task=snapshot_pb2.TaskSnapshot(
                        task_id=f"t{k % tasks}", committed_offsets=offsets(4), checkpoints={"state": body}
                    ),
                ),
                timeout=60,
            )

        def raw_report(c: int, k: int, app: str = app, body: bytes = body) -> None:
            raw.put(f"{app}-{c}-{k}", body)
            raw.get(c)
            raw.commit(creates=[f"{app}-{c}-{k}"], sets=[c])

        bench.pair(
            f"ReportTaskSnapshot, {label} checkpoint",
            clients,
            Side(report, setup=create),
            Side(raw_report),
            "S3 put + get + multi(create, set)",
        )

    jobs = f"job-{t}"
    if bench.wants("ReportProgress"):
        for c in range(clients):
            B(c).MarkBacklog(
                backlog_pb2.MarkBacklogRequest(job_id=f"{jobs}-{c}", boundaries=offsets(20, 10**12)),
                timeout=60,
            )
    bench.pair(
        "ReportProgress, 20 partitions",
        clients,
        Side(
            lambda c, k: B(c).ReportProgress(
                backlog_pb2.ReportProgressRequest(job_id=f"{jobs}-{c}", positions=offsets(20, 1000 * k)),
                timeout=60,
            )
        ),
        Side(lambda c, k: raw.progress(c)),
        "2 get + multi(set shard)",
    )

    sinks = [NullSink(f"sink-{c}") for c in range(clients)]
    writers = [
        ExactlyOnceWriter(sinks[c], connector[c % len(connector)], query_name=f"latency-{t}-{c}")
        for c in range(clients)
    ]
    last: dict[int, int] = {}

    def raw_batch(c: int, k: int) -> None:
        if c in last:
            raw.delete(f"eo{t}-{c}-{last[c]}")
        raw.register(f"eo{t}-{c}-{k}", payload)
        last[c] = k

    try:
        bench.pair(
            "exactly_once, per batch",
            clients,
            Side(lambda c, k: writers[c](None, k)),
            Side(raw_batch),
            "delete N-1 (as above) + register N (as above)",
        )
    finally:
        for w in writers:
            w.close()
    assert not any(s.rollbacks for s in sinks), "a batch found a record of its own earlier attempt"


def summary(bench: Bench, clients: Sequence[int], zk_delay_ms: float, s3_delay_ms: float) -> None:
    """One line per row: each concurrency's p50 / p99 and calls/s against the raw side's."""
    print(
        f"\n## summary: ZooKeeper +{zk_delay_ms:g} ms, S3 +{s3_delay_ms:g} ms per request (client to server)"
    )
    cells = ["p50 / p99 ms", "in S3 PUTs", "ops/s ours / raw"]
    header = " | ".join(f"c={c} {x}" for c in clients for x in cells)
    print(f"| row | {header} |")
    print("|---" * (1 + len(cells) * len(clients)) + "|")
    for name, in_order in _by_name(bench.rows).items():
        parts: list[str] = []
        for c in clients:
            row = in_order.get(c)
            if row is None or row.raw is None:
                parts += ["-"] * len(cells)
                continue
            put = bench.units[UNIT_PUT, c].p50_ms
            parts += [
                f"{row.ours.p50_ms:.1f} / {row.ours.p99_ms:.1f}",
                f"{row.ours.p50_ms / put:.2f}",
                f"{row.ours.ops_s:.0f} / {row.raw.ops_s:.0f} ({row.ours.ops_s / row.raw.ops_s:.2f})",
            ]
        print(f"| {name} | " + " | ".join(parts) + " |")
    units = "; ".join(
        f"c={c}: S3 PUT {bench.units[UNIT_PUT, c].p50_ms:.1f} ms "
        f"({bench.units[UNIT_PUT_NO_EXPECT, c].p50_ms:.1f} ms without Expect: 100-continue), "
        f"ZooKeeper get {bench.units[UNIT_ZK, c].p50_ms:.2f} ms, "
        f"gRPC hop {bench.units[UNIT_HOP, c].p50_ms:.2f} ms"
        for c in clients
        if (UNIT_PUT, c) in bench.units
    )
    print(f"units (p50): {units}")


def _by_name(rows: list[Row]) -> dict[str, dict[int, Row]]:
    out: dict[str, dict[int, Row]] = {}
    for row in rows:
        out.setdefault(row.name, {})[row.clients] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one slice (default 2.0)")
    parser.add_argument("--rounds", type=int, default=3, help="slices per side and row (default 3)")
    parser.add_argument("--clients", default="1,64", help="concurrency levels (default 1,64)")
    parser.add_argument("--zk-delay-ms", type=float, default=1.0, help="ZooKeeper's added delay (default 1)")
    parser.add_argument("--s3-delay-ms", type=float, default=15.0, help="S3's added delay (default 15)")
    parser.add_argument("--only", default="", help="comma-separated parts of row names to run (default: all)")
    parser.add_argument("--smoke", action="store_true", help="every row once, briefly (CI)")
    args = parser.parse_args()
    warmup_s = 1.0
    if args.smoke:
        args.seconds, args.rounds, args.clients, warmup_s = 0.2, 1, "1,2", 0.1
    counts = [int(x) for x in args.clients.split(",")]
    bench = Bench(
        args.seconds, args.rounds, warmup_s, [o.strip().lower() for o in args.only.split(",") if o.strip()]
    )
    with ExitStack() as stack:
        zk, s3 = stack.enter_context(real_servers())
        zk_proxy, s3_proxy = stack.enter_context(
            delay_proxies(
                [
                    (zk.hosts.split(",")[0], args.zk_delay_ms),
                    (s3.endpoint_url.split("//", 1)[1], args.s3_delay_ms),
                ]
            )
        )
        s3_url = f"http://{s3_proxy}"
        os.environ.update({**s3.env(), "AWS_ENDPOINT_URL_S3": s3_url})  # the coordinator's S3: the proxy
        run_id = uuid.uuid4().hex[:8]
        print(
            f"# latency: ZooKeeper {zk.hosts} behind {zk_proxy} (+{args.zk_delay_ms:g} ms), "
            f"S3 {s3.endpoint_url} behind {s3_url} (+{args.s3_delay_ms:g} ms); "
            f"{args.rounds} x {args.seconds}s slices per side; "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
        )
        raw_zk = KazooClient(hosts=zk_proxy)
        raw_zk.start()
        stack.callback(raw_zk.close)
        stack.callback(raw_zk.stop)
        raw = Raw(raw_zk, _s3_client(s3_url, max(counts), as_coordinator=True), s3.bucket, run_id)
        default_put = _s3_client(s3_url, max(counts), as_coordinator=False)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapcoord-bench-latency-")))
        coordinator_args = [
            "--metadata", f"zk://{zk_proxy}/bench-{run_id}/coordinator",
            "--blobs", f"s3://{s3.bucket}/bench-{run_id}/coordinator",
            "--cleanup-interval", "0s", "--log-level", "WARNING",
        ]  # fmt: skip
        proc = stack.enter_context(CoordinatorProcess(tmp, args=coordinator_args, start_timeout_s=180))
        for c in counts:
            measure_at(bench, c, proc.target, raw, default_put)
    summary(bench, counts, args.zk_delay_ms, args.s3_delay_ms)


def _s3_client(endpoint_url: str, connections: int, *, as_coordinator: bool) -> Any:
    """boto3 on ``endpoint_url`` (path-style) with a connection per client (its default pool of
    10 would queue the raw side's calls at higher concurrency). ``as_coordinator``: small bodies
    go without ``Expect: 100-continue``, as the coordinator sends them (botocore's default waits a
    round trip for the server's go-ahead before every body)."""
    import boto3
    from botocore.config import Config

    from snapcoord.coordinator.storage.s3 import _no_expect_for_small_bodies

    config = Config(s3={"addressing_style": "path"}, max_pool_connections=max(10, connections))
    client = boto3.client("s3", endpoint_url=endpoint_url, config=config)
    if as_coordinator:
        client.meta.events.register_first("before-send.s3", _no_expect_for_small_bodies)
    return client


if __name__ == "__main__":
    main()
