"""Throughput of every hot RPC against its raw ZooKeeper + S3 bound, and of leases against etcd.

    bench/run hot_rpcs [--seconds 1.0] [--rounds 4] [--clients 1,16] [--processes 2] [--scale 100000]
                       [--in-process] [--no-etcd] [--fsync] [--smoke]

Each row runs the RPC through a real gRPC channel to a ``snapcoord serve`` process (as deployed;
``--in-process`` runs it in this process instead, sharing the load generator's GIL) on real
ZooKeeper and SeaweedFS, and the raw kazoo + boto3 operations that RPC needs, one after another
(the raw bound), at the same concurrency. The two sides alternate in short slices (``--rounds`` of
``--seconds`` each), so a noisy neighbour hits both alike; ratio = our ops/s / raw ops/s, with the
lowest and highest per-round ratio as the noise band. ``zk req`` is the ZooKeeper requests one
call of ours issued (counted by ZooKeeper on the coordinator's session, its ``cons`` command; in
process, kazoo requests on its client), against the raw side's.

``ceiling`` is the ratio a coordinator doing no work of its own would reach: the raw operations
plus a bare gRPC round trip per RPC (a health check through the same server, measured at each
concurrency first; for the rows whose request carries a checkpoint, a health check whose request
carries as many bytes), one after another. On a machine where a gRPC round trip costs more than a
ZooKeeper request, it is well below 1 for the RPCs that need one ZooKeeper round trip. ``own ms``
is what is left per op: 1/ours minus the ceiling's time per op, the coordinator's own work (its
Python, its extra requests, thread hand-offs), the part a change to the server can still win
(negative: faster than the ceiling, by sending fewer requests than the raw side, or noise).

The lease rows compare a pure lease acquire + renew (no snapshots) with etcd's lease grant +
keepalive through its JSON gateway, on an etcd this benchmark starts on loopback (Debian
``etcd-server``; ``bench/run`` installs it). Both stores run with the same durability: by default
neither fsyncs a write (ZooKeeper ``forceSync=no``, as in the tests; etcd ``--unsafe-no-fsync``), so
the rows compare the servers rather than this machine's disk; ``--fsync`` runs both as deployed,
each write on disk before it is acknowledged (the raw bounds then fsync too).

Every row runs again at the highest concurrency against ``snapcoord serve --processes N``
(``--processes``, default 2: N worker processes sharing the port with SO_REUSEPORT, one connection
per client). The cores rows then compare ``--processes N`` with ``--processes 1`` directly, and
the N-process lease pair with etcd (``zk req`` counts nothing there: both sides are ours).

The scale figures (``--scale``, default 100k producer records, with 10k apps and 10k leases)
give a server's start time and RSS, and a janitor pass's time and ZooKeeper requests (the first
pass includes the orphan sweep, which walks the upload intents; the second is a pass between
sweeps).

``--smoke`` runs every row once, briefly, to prove the benchmark still works (CI does this).
``--only lease,progress`` runs only the rows whose names contain one of the words (``completion``
and ``scale`` select those figures), to measure one change without the whole run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http.client import HTTPConnection
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from common import for_seconds, in_process_coordinator, real_servers
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kazoo.client import KazooClient

from harness.coordinator import CoordinatorProcess
from harness.zookeeper import four_letter_word
from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    commit_pb2,
    commit_pb2_grpc,
    common_pb2,
    lease_pb2,
    lease_pb2_grpc,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: ``op(client, k)``: client index (0..c-1) and that client's call number.
Op = Callable[[int, int], object]


# --- counting ZooKeeper requests -----------------------------------------------------------------

_counts: dict[int, int] = {}
_count_lock = threading.Lock()


def _install_request_counter() -> None:
    """Count every request each kazoo client sends (its ``_call``), keyed by client."""
    original = KazooClient._call

    def counting(self: KazooClient, request: object, async_object: object) -> object:
        with _count_lock:
            _counts[id(self)] = _counts.get(id(self), 0) + 1
        return original(self, request, async_object)

    KazooClient._call = counting


def _requests_of(client_ids: set[int]) -> int:
    with _count_lock:
        return sum(v for k, v in _counts.items() if k in client_ids)


def _coordinator_clients(raw: set[int]) -> set[int]:
    with _count_lock:
        return {k for k in _counts if k not in raw}


def session_requests(zk_hosts: str, excluded_sessions: set[int]) -> int:
    """Requests ZooKeeper has received on its client sessions other than ``excluded_sessions``
    (its ``cons`` command): what a coordinator in another process sent."""
    host, port = zk_hosts.split(",")[0].rsplit(":", 1)
    total = 0
    for line in four_letter_word(host, int(port), "cons").splitlines():
        stats = line[line.find("(") + 1 : line.rfind(")")].split(",")
        fields = dict(f.split("=", 1) for f in stats if "=" in f)
        if "sid" in fields and int(fields["sid"], 16) not in excluded_sessions:
            total += int(fields["recved"])
    return total


# --- the throughput loop ---------------------------------------------------------------------------


def run_for(op: Op, clients: int, seconds: float, start_at: list[int]) -> tuple[int, float]:
    """``clients`` threads call ``op`` back to back for ``seconds``; (calls, elapsed)."""
    before = sum(start_at)
    elapsed = for_seconds(clients, seconds, op, start_at)
    return sum(start_at) - before, elapsed


@dataclass
class Row:
    name: str
    clients: int
    raw_ops_s: float
    ours_ops_s: float
    ratios: list[float]
    ours_req: float
    raw_req: float
    baseline: str
    #: The coordinator's ``--processes``.
    processes: int = 1
    #: The ratio a server doing no work of its own would reach: the raw operations plus ``rpcs``
    #: bare gRPC round trips (health RPCs at this concurrency), one after another. NaN: no bound.
    ceiling: float = float("nan")

    @property
    def ratio(self) -> float:
        return self.ours_ops_s / self.raw_ops_s if self.raw_ops_s else float("nan")

    @property
    def own_ms(self) -> float:
        """Milliseconds per op beyond the ceiling's (raw operations plus bare gRPC round trips):
        what the coordinator's own work costs, per op at this concurrency (NaN: no ceiling)."""
        return 1000 * (1 / self.ours_ops_s - 1 / (self.raw_ops_s * self.ceiling))


class Bench:
    def __init__(self, seconds: float, rounds: int, warmup: int, only: Sequence[str] = ()) -> None:
        self.seconds = seconds
        #: Lower-case parts of row names to run (``--only``); empty: every row.
        self.only = [o.lower() for o in only]
        self.rounds = rounds
        self.warmup = warmup
        self.rows: list[Row] = []
        self.raw_clients: set[int] = set()
        #: Requests the coordinator has sent so far: its kazoo clients' counts when it runs in this
        #: process, ZooKeeper's per-session counts (``cons``) when it runs as its own process.
        self.ours_requests: Callable[[], int] = lambda: _requests_of(_coordinator_clients(self.raw_clients))
        #: Bare gRPC round trips per second through the coordinator, by (concurrency, processes,
        #: request bytes).
        self.hop_ops_s: dict[tuple[int, int, int], float] = {}
        #: A health RPC whose request carries n bytes, for ``pair(request_bytes=n)``'s ceiling.
        self.sized_health: Callable[[int], Op] | None = None
        #: The ``--processes`` of the coordinator the rows being measured run against.
        self.processes = 1

    def hop(self, clients: int, health: Op, request_bytes: int = 0) -> float:
        """Measure bare health RPCs/s at ``clients`` (the gRPC cost every call of ours pays on top
        of its raw operations); the ceiling column divides by it. ``request_bytes``: the health
        requests carry that many bytes (the ceiling of a row whose request carries a payload)."""
        at = [0] * clients
        for c in range(clients):
            for _ in range(self.warmup):
                health(c, 0)
        n, t = run_for(health, clients, self.seconds * self.rounds, at)
        self.hop_ops_s[clients, self.processes, request_bytes] = n / t
        carrying = f", carrying {request_bytes} bytes" if request_bytes else ""
        print(f"bare gRPC round trip (health RPC{carrying}): {n / t:.0f}/s at c={clients}", flush=True)
        return n / t

    def wants(self, name: str) -> bool:
        """True when ``--only`` selects the row (or figure) named ``name``."""
        return not self.only or any(o in name.lower() for o in self.only)

    def pair(
        self,
        name: str,
        clients: int,
        raw: Op,
        ours: Op,
        baseline: str,
        *,
        rpcs: int = 1,
        request_bytes: int = 0,
    ) -> Row | None:
        """Alternate raw and ours, ``rounds`` slices each, and record the row (None: not selected
        by ``--only``). ``rpcs``: our RPCs per op, for the ceiling (0: the raw side is not a
        storage bound, no ceiling). ``request_bytes``: the payload our request carries; the
        ceiling's gRPC round trip then carries as much (moving it is gRPC's cost, not ours)."""
        if not self.wants(name):
            return None
        if request_bytes and (clients, self.processes, request_bytes) not in self.hop_ops_s:
            assert self.sized_health is not None, "set sized_health before a row with request_bytes"
            self.hop(clients, self.sized_health(request_bytes), request_bytes)
        raw_at, ours_at = [0] * clients, [0] * clients
        for c in range(clients):  # warm-up calls, unrecorded (connections, caches, JIT of paths)
            for _ in range(self.warmup):
                raw(c, raw_at[c])
                raw_at[c] += 1
                ours(c, ours_at[c])
                ours_at[c] += 1
        raw_n = ours_n = 0
        raw_t = ours_t = 0.0
        ratios: list[float] = []
        raw_req = ours_req = 0
        for r in range(self.rounds):
            sides = [("raw", raw, raw_at), ("ours", ours, ours_at)]
            if r % 2:
                sides.reverse()
            per: dict[str, float] = {}
            for side, op, at in sides:
                count: Callable[[], int] = self.ours_requests
                if side == "raw":
                    count = functools.partial(_requests_of, self.raw_clients)
                before = count()
                n, t = run_for(op, clients, self.seconds, at)
                sent = count() - before
                per[side] = n / t
                if side == "raw":
                    raw_n, raw_t, raw_req = raw_n + n, raw_t + t, raw_req + sent
                else:
                    ours_n, ours_t, ours_req = ours_n + n, ours_t + t, ours_req + sent
            ratios.append(per["ours"] / per["raw"])
        row = Row(
            name,
            clients,
            raw_n / raw_t,
            ours_n / ours_t,
            ratios,
            ours_req / max(ours_n, 1),
            raw_req / max(raw_n, 1),
            baseline,
            self.processes,
        )
        hop = self.hop_ops_s.get((clients, self.processes, request_bytes))
        if rpcs and hop:
            raw_s = raw_t / raw_n
            row = replace(row, ceiling=raw_s / (raw_s + rpcs / hop))
        self.rows.append(row)
        print(_format(row), flush=True)
        return row


HEADER = (
    f"{'operation':<50} {'c':>3} {'ours/s':>8} {'raw/s':>8} {'ratio':>6} {'noise':>11} "
    f"{'ceiling':>7} {'zk req':>9} {'own ms':>6}  baseline"
)


def _format(row: Row) -> str:
    band = f"{min(row.ratios):.2f}-{max(row.ratios):.2f}"
    req = f"{row.ours_req:4.1f}/{row.raw_req:<4.1f}"
    return (
        f"{row.name:<50} {row.clients:>3} {row.ours_ops_s:8.0f} {row.raw_ops_s:8.0f} "
        f"{row.ratio:6.2f} {band:>11} {row.ceiling:7.2f} {req:>9} {row.own_ms:6.2f}  {row.baseline}"
    )


# --- etcd ------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def etcd_server(*, fsync: bool) -> Iterator[str]:
    """A single-member etcd on loopback (its own data dir), stopped on exit; yields host:port.
    Without ``fsync`` it skips fsync as the benchmark's ZooKeeper does (``--unsafe-no-fsync``):
    with fsync on one side only, etcd's grant + keepalive ran 17-26% slower at c=1 here (the same at c=16)."""
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not Path(binary).exists():
        raise SystemExit("etcd not found: install the Debian package etcd-server (bench/run does)")
    client, peer = _free_port(), _free_port()
    with tempfile.TemporaryDirectory(prefix="snapcoord-etcd-") as tmp:
        url = f"http://127.0.0.1:{client}"
        proc = subprocess.Popen(
            [
                binary,
                "--name",
                "bench",
                "--data-dir",
                f"{tmp}/data",
                "--listen-client-urls",
                url,
                "--advertise-client-urls",
                url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"bench=http://127.0.0.1:{peer}",
                *([] if fsync else ["--unsafe-no-fsync"]),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(f"{tmp}/etcd.log", "wb"),  # noqa: SIM115 - closed with the process
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                        if json.loads(r.read()).get("health") == "true":
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"etcd did not start: {Path(tmp, 'etcd.log').read_text()[-2000:]}")
                time.sleep(0.2)
            yield f"127.0.0.1:{client}"
        finally:
            proc.terminate()
            proc.wait(timeout=30)


class EtcdLeases:
    """Lease grant + keepalive through etcd's JSON gateway, one keep-alive HTTP connection per client."""

    def __init__(self, hostport: str, clients: int) -> None:
        self._conns = [HTTPConnection(hostport, timeout=30) for _ in range(clients)]

    def _post(self, c: int, path: str, body: dict[str, object]) -> dict[str, object]:
        conn = self._conns[c]
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"etcd {path}: {response.status} {data[:200]!r}")
        result: dict[str, object] = json.loads(data)
        return result

    def pair(self, c: int, k: int) -> None:
        granted = self._post(c, "/v3/lease/grant", {"TTL": 600})
        kept = self._post(c, "/v3/lease/keepalive", {"ID": granted["ID"]})
        assert "result" in kept and int(kept["result"]["TTL"]) > 0, kept  # type: ignore[index]

    def close(self) -> None:
        for conn in self._conns:
            conn.close()


# --- the rows ------------------------------------------------------------------------------------


@contextmanager
def reports_running(stub: snapshot_pb2_grpc.SnapshotServiceStub, app: str) -> Iterator[None]:
    """One thread reporting tasks of ``app`` back to back (a new generation every 1000)."""
    stop = threading.Event()
    failed: list[BaseException] = []

    def loop() -> None:
        k = 0
        try:
            while not stop.is_set():
                if k % 1000 == 0:
                    stub.CreateSnapshot(
                        snapshot_pb2.CreateSnapshotRequest(
                            app_id=app, task_ids=[f"t{i}" for i in range(1000)]
                        ),
                        timeout=60,
                    )
                gen = k // 1000 + 1
                stub.ReportTaskSnapshot(
                    snapshot_pb2.ReportTaskSnapshotRequest(
                        app_id=app,
                        generation=gen,
                        task=snapshot_pb2.TaskSnapshot(task_id=f"t{k % 1000}", committed_offsets=offsets(4)),
                    ),
                    timeout=60,
                )
                k += 1
        except BaseException as e:  # re-raised below
            failed.append(e)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]


def offsets(n: int) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream="events", partition=p, offset=10**6 + p) for p in range(n)]


# --- the calls (bench/scale_out.py runs them too) ------------------------------------------------


class Stubs:
    """A stub of every service on each of ``channels``; client ``c`` calls through channel
    ``c % len(channels)``. One letter per service, as the rows read: ``S(c).CreateSnapshot(...)``."""

    def __init__(self, channels: Sequence[grpc.Channel]) -> None:
        self.producers = [producer_pb2_grpc.ProducerOffsetServiceStub(x) for x in channels]
        self.snaps = [snapshot_pb2_grpc.SnapshotServiceStub(x) for x in channels]
        self.leases = [lease_pb2_grpc.LeaseServiceStub(x) for x in channels]
        self.backlog = [backlog_pb2_grpc.BacklogServiceStub(x) for x in channels]
        self.commits = [commit_pb2_grpc.CommitClaimServiceStub(x) for x in channels]
        self.health = [health_pb2_grpc.HealthStub(x) for x in channels]

    def P(self, c: int) -> producer_pb2_grpc.ProducerOffsetServiceStub:
        return self.producers[c % len(self.producers)]

    def S(self, c: int) -> snapshot_pb2_grpc.SnapshotServiceStub:
        return self.snaps[c % len(self.snaps)]

    def L(self, c: int) -> lease_pb2_grpc.LeaseServiceStub:
        return self.leases[c % len(self.leases)]

    def B(self, c: int) -> backlog_pb2_grpc.BacklogServiceStub:
        return self.backlog[c % len(self.backlog)]

    def C(self, c: int) -> commit_pb2_grpc.CommitClaimServiceStub:
        return self.commits[c % len(self.commits)]

    def H(self, c: int) -> health_pb2_grpc.HealthStub:
        return self.health[c % len(self.health)]


def health_op(stubs: Stubs) -> Op:
    """A bare health check: the gRPC round trip every call pays."""
    return lambda c, k: stubs.H(c).Check(health_pb2.HealthCheckRequest(), timeout=60)


def register_op(stubs: Stubs, tag: str) -> Op:
    """RegisterProducerOffsets of 10 offsets under a new producer id per call."""
    ten = offsets(10)
    return lambda c, k: stubs.P(c).RegisterProducerOffsets(
        producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"r{tag}-{c}-{k}", offsets=ten),
        timeout=60,
    )


def create_snapshot_op(stubs: Stubs, tag: str) -> Op:
    """CreateSnapshot of 4 tasks, again and again on one app per client."""
    return lambda c, k: stubs.S(c).CreateSnapshot(
        snapshot_pb2.CreateSnapshotRequest(app_id=f"cr{tag}-{c}", task_ids=["a", "b", "c", "d"]),
        timeout=60,
    )


def make_read_apps(stubs: Stubs, tag: str, clients: int, checkpoint: bytes) -> None:
    """For each client an app ``read{tag}-{c}`` with one completed snapshot of 4 tasks, each
    with ``checkpoint``: what the read rows read back."""
    for c in range(clients):
        app = f"read{tag}-{c}"
        created = stubs.S(c).CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=["a", "b", "c", "d"]),
            timeout=60,
        )
        for task in "abcd":
            stubs.S(c).ReportTaskSnapshot(
                snapshot_pb2.ReportTaskSnapshotRequest(
                    app_id=app,
                    generation=created.generation,
                    task=snapshot_pb2.TaskSnapshot(
                        task_id=task, committed_offsets=offsets(4), checkpoints={"state": checkpoint}
                    ),
                ),
                timeout=60,
            )


def cached_read_op(stubs: Stubs, tag: str) -> Op:
    """GetCurrentSnapshot consistent=false of the client's app of ``make_read_apps``."""
    return lambda c, k: stubs.S(c).GetCurrentSnapshot(
        snapshot_pb2.GetCurrentSnapshotRequest(app_id=f"read{tag}-{c}"), timeout=60
    )


def lease_pair_op(stubs: Stubs, tag: str) -> Op:
    """A new lease on no snapshots (AcquireSnapshots), then its renewal (RenewLease)."""

    def pair(c: int, k: int) -> None:
        lease_id = f"pl{tag}-{c}-{k}"
        stubs.L(c).AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(lease_id=lease_id, duration_ms=600_000), timeout=60
        )
        stubs.L(c).RenewLease(lease_pb2.RenewLeaseRequest(lease_id=lease_id, duration_ms=600_000), timeout=60)

    return pair


def report_progress_op(stubs: Stubs, job: str) -> Op:
    """MarkBacklog of a job of 100 partitions (now), then an op reporting progress on all of
    them (every client on the same job)."""
    stubs.B(0).MarkBacklog(
        backlog_pb2.MarkBacklogRequest(
            job_id=job,
            boundaries=[common_pb2.Offset(stream="s", partition=p, offset=10**12) for p in range(100)],
        ),
        timeout=60,
    )
    return lambda c, k: stubs.B(c).ReportProgress(
        backlog_pb2.ReportProgressRequest(
            job_id=job,
            positions=[common_pb2.Offset(stream="s", partition=p, offset=1000 * k + c) for p in range(100)],
        ),
        timeout=60,
    )


@contextmanager
def coordinator(
    bench: Bench,
    zk_hosts: str,
    metadata: str,
    blobs: str,
    in_process: bool,
    raw_sessions: set[int],
    **flags: str,
) -> Iterator[str]:
    """The coordinator under test, yielding its target: ``snapcoord serve`` in its own process, as
    deployed (requests counted on ZooKeeper's side), or in this process (``--in-process``: it then
    shares the load generator's GIL; requests counted on its kazoo clients)."""
    if in_process:
        with in_process_coordinator(metadata, blobs, **flags) as port:
            yield f"127.0.0.1:{port}"
        return
    args = ["--metadata", metadata, "--blobs", blobs, "--cleanup-interval", "0s", "--log-level", "WARNING"]
    for name, value in flags.items():
        args += [f"--{name.replace('_', '-')}", value]
    with (
        tempfile.TemporaryDirectory(prefix="snapcoord-bench-hot-") as tmp,
        CoordinatorProcess(Path(tmp), args=args, start_timeout_s=180) as proc,
    ):
        bench.ours_requests = lambda: session_requests(zk_hosts, raw_sessions)
        yield proc.target


def run(
    bench: Bench,
    zk_hosts: str,
    s3: S3Client,
    bucket: str,
    client_counts: list[int],
    etcd: str | None,
    in_process: bool = False,
    extra_processes: int = 1,
) -> None:
    """Every hot RPC at each of ``client_counts`` against one coordinator process, then (unless
    in process) at the highest count against ``--processes extra_processes``."""
    run_id = uuid.uuid4().hex[:8]
    chroot = f"/bench-{run_id}"
    raw = KazooClient(hosts=zk_hosts)
    raw.start()
    bench.raw_clients.add(id(raw))
    base = f"{chroot}/raw"
    raw.ensure_path(f"{base}/n")
    blob = os.urandom(1024)
    for i in range(64):  # nodes the raw side reads and sets (one per client)
        raw.create(f"{base}/n/{i}", blob[:300])
    prefix = f"bench-{run_id}/raw"

    def do_gets(c: int, count: int) -> None:
        for _ in range(count):
            raw.get(f"{base}/n/{c}")

    def multi(c: int, k: int, creates: int, sets: int, data: bytes = b"x" * 300) -> None:
        tx = raw.transaction()
        for j in range(creates):
            tx.create(f"{base}/c{c}-{k}-{j}-{time.perf_counter_ns()}", data)
        for _ in range(sets):
            tx.set_data(f"{base}/n/{c}", data)
        results = tx.commit()
        assert not any(isinstance(r, Exception) for r in results), results

    def put(c: int, k: int, body: bytes) -> None:
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{c}-{k}-{time.perf_counter_ns()}", Body=body)

    def raw_steps(
        c: int,
        k: int,
        *,
        gets: int,
        multis: list[tuple[int, int]],
        data: bytes = b"x" * 300,
        body: bytes = b"",
    ) -> None:
        """An S3 put of ``body`` (when given), ``gets`` gets, then each (creates, sets) multi."""
        if body:
            put(c, k, body)
        do_gets(c, gets)
        for creates, sets in multis:
            multi(c, k, creates, sets, data)

    s3.put_object(Bucket=bucket, Key=f"{prefix}/read", Body=blob)
    ten_payload = os.urandom(200)  # about what 10 encoded offsets take
    s3.put_object(Bucket=bucket, Key=f"{prefix}/offsets", Body=ten_payload)

    def measure(processes: int, counts: list[int]) -> None:
        # Every AcquireSnapshots(1) pair below creates a new lease on the client's one snapshot, so that
        # snapshot gathers a holder per pair: allow the most holders (one snapshot per lease keeps the
        # worst-case request within ZooKeeper's limit). A longer run than 1,000 pairs per client would
        # need fresh snapshots.
        server = coordinator(
            bench,
            zk_hosts,
            f"zk://{zk_hosts}{chroot}/coordinator-p{processes}",
            f"s3://{bucket}/bench-{run_id}-p{processes}",
            in_process,
            {raw.client_id[0]},
            lease_max_holders="1000",
            lease_max_snapshots="1",
            processes=str(processes),
        )
        with server as target:
            # Over several processes, one connection per client (the kernel spreads connections
            # over the processes sharing the port, not calls).
            options = [("grpc.use_local_subchannel_pool", 1)]
            channels = [
                grpc.insecure_channel(target, options=options)
                for _ in range(4 if processes == 1 else max(4, max(counts)))
            ]
            stubs = Stubs(channels)
            P, S, L, C, H = stubs.P, stubs.S, stubs.L, stubs.C, stubs.H

            # One request first, so that the coordinator's kazoo client exists to be counted.
            H(0).Check(health_pb2.HealthCheckRequest(), timeout=30)

            def sized_health(size: int) -> Op:
                """A health RPC carrying ``size`` bytes (as the name of a service the server does
                not know, so NOT_FOUND): a bare gRPC round trip that moves a payload's bytes."""
                request = health_pb2.HealthCheckRequest(service="x" * size)

                def check(c: int, k: int) -> None:
                    try:
                        H(c).Check(request, timeout=60)
                    except grpc.RpcError as e:
                        if e.code() != grpc.StatusCode.NOT_FOUND:
                            raise
                        return
                    raise AssertionError("a health check of an unknown service answered")

                return check

            bench.sized_health = sized_health
            ten = offsets(10)
            tag = uuid.uuid4().hex[:6]

            def measure_at(clients: int) -> None:
                bench.processes = processes
                print(
                    f"\n## c={clients}" + (f", --processes {processes}" if processes > 1 else ""),
                    flush=True,
                )
                bench.hop(clients, health_op(stubs))
                print(HEADER, flush=True)
                t = f"{tag}-{clients}-{processes}"

                # RegisterProducerOffsets: read the record, commit it with its expiry entry.
                bench.pair(
                    "RegisterProducerOffsets (10 offsets)",
                    clients,
                    lambda c, k: raw_steps(c, k, gets=0, multis=[(2, 0)], body=ten_payload),
                    register_op(stubs, t),
                    "s3 put + multi(record, expiry entry)",
                )

                def raw_get_producer(c: int, k: int) -> None:
                    do_gets(c, 1)
                    s3.get_object(Bucket=bucket, Key=f"{prefix}/offsets")["Body"].read()

                for c in range(clients):  # every record the next row reads exists
                    for i in range(50):
                        P(c).RegisterProducerOffsets(
                            producer_pb2.RegisterProducerOffsetsRequest(
                                producer_id=f"p{t}-{c}-{i}", offsets=ten
                            ),
                            timeout=60,
                        )
                bench.pair(
                    "GetProducerOffsets",
                    clients,
                    raw_get_producer,
                    lambda c, k: P(c).GetProducerOffsets(
                        producer_pb2.GetProducerOffsetsRequest(producer_id=f"p{t}-{c}-{k % 50}"),
                        timeout=60,
                    ),
                    "get + s3 get",
                )
                # CreateSnapshot: read the app, commit the header, the app's pointer, a deadline entry.
                bench.pair(
                    "CreateSnapshot (4 tasks)",
                    clients,
                    lambda c, k: raw_steps(c, k, gets=1, multis=[(2, 1)]),
                    create_snapshot_op(stubs, t),
                    "get + multi(2 creates, set)",
                )
                for size, label in ((1024, "1 KiB"), (1024 * 1024, "1 MiB")):
                    body = os.urandom(size)
                    made: dict[int, int] = {}

                    def report(
                        c: int, k: int, body: bytes = body, size: int = size, made: dict[int, int] = made
                    ) -> None:
                        tasks = 2000
                        gen = k // tasks + 1
                        app = f"rep{size}{t}-{c}"
                        if k % tasks == 0 and made.get(c) != gen:
                            S(c).CreateSnapshot(
                                snapshot_pb2.CreateSnapshotRequest(
                                    app_id=app, task_ids=[f"t{i}" for i in range(tasks)]
                                ),
                                timeout=60,
                            )
                            made[c] = gen
                        S(c).ReportTaskSnapshot(
                            snapshot_pb2.ReportTaskSnapshotRequest(
                                app_id=app,
                                generation=gen,
                                task=snapshot_pb2.TaskSnapshot(
                                    task_id=f"t{k % tasks}",
                                    committed_offsets=offsets(4),
                                    checkpoints={"state": body},
                                ),
                            ),
                            timeout=60,
                        )

                    def raw_report(c: int, k: int, body: bytes = body) -> None:
                        raw_steps(c, k, gets=1, multis=[(1, 1)], body=body)

                    bench.pair(
                        f"ReportTaskSnapshot, {label} checkpoint",
                        clients,
                        raw_report,
                        report,
                        "s3 put + get + multi(create, set)",
                        request_bytes=size,
                    )

                # A completed snapshot of 4 tasks x 1 KiB per client, to read back.
                make_read_apps(stubs, t, clients, blob)
                bench.pair(
                    "GetCurrentSnapshot consistent=false (cached)",
                    clients,
                    health_op(stubs),
                    cached_read_op(stubs, t),
                    "a bare health RPC",
                    rpcs=0,
                )
                bench.pair(
                    "GetCurrentSnapshot consistent=true",
                    clients,
                    lambda c, k: do_gets(c, 2),
                    lambda c, k: S(c).GetCurrentSnapshot(
                        snapshot_pb2.GetCurrentSnapshotRequest(app_id=f"read{t}-{c}", consistent=True),
                        timeout=60,
                    ),
                    "get app + get header",
                )
                with reports_running(S(0), f"busy{t}"):
                    # While the app is being snapshotted (a report every few ms changes its
                    # header), cached reads against consistent ones of the same app.
                    busy = f"busy{t}"
                    bench.pair(
                        "GetCurrentSnapshot cached vs consistent, during reports",
                        clients,
                        lambda c, k: S(c).GetCurrentSnapshot(
                            snapshot_pb2.GetCurrentSnapshotRequest(app_id=busy, consistent=True),
                            timeout=60,
                        ),
                        lambda c, k: S(c).GetCurrentSnapshot(
                            snapshot_pb2.GetCurrentSnapshotRequest(app_id=busy), timeout=60
                        ),
                        "GetCurrentSnapshot consistent=true",
                        rpcs=0,
                    )

                def raw_get_snapshot(c: int, k: int) -> None:
                    do_gets(c, 1)  # the header (which lists its tasks)
                    for _ in range(4):
                        do_gets(c, 1)
                        s3.get_object(Bucket=bucket, Key=f"{prefix}/read")["Body"].read()

                bench.pair(
                    "GetSnapshot, 4 tasks x 1 KiB",
                    clients,
                    raw_get_snapshot,
                    lambda c, k: S(c).GetSnapshot(
                        snapshot_pb2.GetSnapshotRequest(
                            app_id=f"read{t}-{c}", generation=1, include_checkpoints=True
                        ),
                        timeout=60,
                    ),
                    "get + 4 x (get + s3 get)",
                )

                refs = {
                    c: [common_pb2.SnapshotRef(app_id=f"read{t}-{c}", generation=1)] for c in range(clients)
                }

                def acquire_renew(c: int, k: int) -> None:
                    lease_id = f"l{t}-{c}-{k}"
                    L(c).AcquireSnapshots(
                        lease_pb2.AcquireSnapshotsRequest(
                            lease_id=lease_id, duration_ms=600_000, snapshots=refs[c]
                        ),
                        timeout=60,
                    )
                    L(c).RenewLease(
                        lease_pb2.RenewLeaseRequest(lease_id=lease_id, duration_ms=600_000), timeout=60
                    )

                bench.pair(
                    "AcquireSnapshots(1) + RenewLease",
                    clients,
                    lambda c, k: raw_steps(c, k, gets=2, multis=[(2, 1), (0, 1)]),
                    acquire_renew,
                    "2 get + multi(lease, entry, pin) + multi(set)",
                    rpcs=2,
                )

                pure_pair = lease_pair_op(stubs, t)
                bench.pair(
                    "lease acquire + renew, no snapshots",
                    clients,
                    lambda c, k: raw_steps(c, k, gets=0, multis=[(2, 0), (0, 1)]),
                    pure_pair,
                    "multi(lease, entry) + multi(set)",
                    rpcs=2,
                )
                if etcd is not None:
                    etcd_client = EtcdLeases(etcd, clients)
                    try:
                        bench.pair(
                            "lease acquire + renew vs etcd grant + keepalive",
                            clients,
                            etcd_client.pair,
                            pure_pair,
                            "etcd lease grant + keepalive (JSON gateway)",
                            rpcs=0,
                        )
                    finally:
                        etcd_client.close()

                # ReportProgress with 100 partitions: read the job and its shard, commit the shard.
                bench.pair(
                    "ReportProgress, 100 partitions",
                    clients,
                    lambda c, k: raw_steps(c, k, gets=2, multis=[(0, 1)], data=b"x" * 2000),
                    report_progress_op(stubs, f"job{t}"),
                    "2 get + multi(set shard)",
                )

                # ClaimCommit of a new number: read the table and the claim node, then one multi
                # that sets the table (a new highest number) and creates the claim.
                table = f"table{t}"
                bench.pair(
                    "ClaimCommit, a new number",
                    clients,
                    lambda c, k: raw_steps(c, k, gets=2, multis=[(1, 1)], data=b"x" * 150),
                    lambda c, k: C(c).ClaimCommit(
                        commit_pb2.ClaimCommitRequest(
                            table_id=f"{table}-{c}", seq=k, epoch=1, attempt=f"b{k}"
                        ),
                        timeout=60,
                    ),
                    "2 get + multi(set, create)",
                )

            for clients in counts:
                measure_at(clients)
            for x in channels:
                x.close()

    try:
        measure(1, client_counts)
        if extra_processes > 1 and not in_process:
            measure(extra_processes, [max(client_counts)])
    finally:
        raw.delete(chroot, recursive=True)
        raw.stop()
        raw.close()


def cores(bench: Bench, zk_hosts: str, bucket: str, clients: int, etcd: str | None, processes: int) -> None:
    """The same RPCs against ``snapcoord serve --processes 1`` and ``--processes N`` (separate
    processes sharing a port with SO_REUSEPORT, each its own ZooKeeper session), interleaved; and
    the N-process lease pair against etcd. One connection per client, so that the kernel can
    spread them over the processes."""

    bench.ours_requests = lambda: 0  # both sides are coordinators: no raw count to compare
    run_id = uuid.uuid4().hex[:8]
    print(
        f"\n## cores: --processes {processes} vs --processes 1 (c={clients}), and vs etcd\n{HEADER}",
        flush=True,
    )
    ten = offsets(10)
    with tempfile.TemporaryDirectory(prefix="snapcoord-bench-cores-") as tmp:
        servers = []
        for n in (1, processes):
            args = [
                "--processes", str(n), "--metadata", f"zk://{zk_hosts}/bench-{run_id}-p{n}",
                "--blobs", f"s3://{bucket}/bench-{run_id}-p{n}", "--cleanup-interval", "0s",
                "--log-level", "WARNING",
            ]  # fmt: skip
            servers.append(CoordinatorProcess(Path(tmp) / f"p{n}", args=args, start_timeout_s=180))
        with servers[0] as one, servers[1] as many:
            stubs: dict[
                int,
                tuple[
                    list[producer_pb2_grpc.ProducerOffsetServiceStub], list[lease_pb2_grpc.LeaseServiceStub]
                ],
            ] = {}
            channels = []
            for n, proc in ((1, one), (processes, many)):
                chans = [
                    grpc.insecure_channel(proc.target, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(clients)
                ]
                channels += chans
                stubs[n] = (
                    [producer_pb2_grpc.ProducerOffsetServiceStub(c) for c in chans],
                    [lease_pb2_grpc.LeaseServiceStub(c) for c in chans],
                )
                for c in range(clients):
                    stubs[n][0][c].RegisterProducerOffsets(
                        producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"p{c}", offsets=ten),
                        timeout=60,
                    )

            def get(n: int) -> Op:
                def op(c: int, k: int) -> None:
                    stubs[n][0][c].GetProducerOffsets(
                        producer_pb2.GetProducerOffsetsRequest(producer_id=f"p{c}"), timeout=60
                    )

                return op

            def pair(n: int) -> Op:
                def op(c: int, k: int) -> None:
                    lease_id = f"l{n}-{c}-{k}"
                    leases = stubs[n][1][c]
                    leases.AcquireSnapshots(
                        lease_pb2.AcquireSnapshotsRequest(lease_id=lease_id, duration_ms=600_000), timeout=60
                    )
                    leases.RenewLease(
                        lease_pb2.RenewLeaseRequest(lease_id=lease_id, duration_ms=600_000), timeout=60
                    )

                return op

            try:
                bench.pair(
                    f"GetProducerOffsets, {processes} processes",
                    clients,
                    get(1),
                    get(processes),
                    "1 process",
                    rpcs=0,
                )
                bench.pair(
                    f"lease acquire + renew, {processes} processes",
                    clients,
                    pair(1),
                    pair(processes),
                    "1 process",
                    rpcs=0,
                )
                if etcd is not None:
                    etcd_client = EtcdLeases(etcd, clients)
                    try:
                        bench.pair(
                            f"lease acquire + renew, {processes} processes vs etcd",
                            clients,
                            etcd_client.pair,
                            pair(processes),
                            "etcd lease grant + keepalive (JSON gateway)",
                            rpcs=0,
                        )
                    finally:
                        etcd_client.close()
            finally:
                for channel in channels:
                    channel.close()


def scale(zk_hosts: str, bucket: str, producers: int) -> None:
    """With ``producers`` producer records, a tenth as many apps (one CREATED snapshot each) and
    a tenth as many leases live: a server's start time and RSS, and one janitor pass's time and
    ZooKeeper requests. Records and leases are written with raw kazoo in the coordinator's layout
    (their own encoders), apps through the snapshot registry."""
    from concurrent.futures import ThreadPoolExecutor

    from snapcoord.coordinator.config import settings as coordinator_config
    from snapcoord.coordinator.domain.leases import Lease, encode_lease
    from snapcoord.coordinator.domain.producer_codec import encode_producer_record
    from snapcoord.coordinator.domain.producers import new_record
    from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
    from snapcoord.coordinator.producers import layout as producer_layout
    from snapcoord.coordinator.services import Deps, Services
    from snapcoord.coordinator.snapshots.leases import layout as lease_layout
    from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store

    apps = leases = max(1, producers // 10)
    chroot = f"/bench-scale-{uuid.uuid4().hex[:8]}"
    print(f"\n## scale: {producers} producer records, {apps} apps, {leases} leases live", flush=True)
    raw = KazooClient(hosts=zk_hosts)
    raw.start()
    now = int(time.time() * 1000)
    day = 86_400_000
    nodes: list[tuple[str, bytes]] = []
    for i in range(producers):
        record = new_record(f"producer-{i:06d}", now, day, f"producers/{uuid.uuid4().hex}.json")
        nodes += [
            (producer_layout.record_path(record.producer_id), encode_producer_record(record)),
            (producer_layout.index_path(record), b""),
        ]
    skew = coordinator_config.load({}, {}).leases.max_clock_skew_ms
    for i in range(leases):
        lease = Lease(f"lease-{i:06d}", day, now + day, (), f"inc{i:09d}")
        nodes += [
            (lease_layout.record_path(lease.lease_id), encode_lease(lease)),
            (lease_layout.incarnation_path(lease), b""),
            (lease_layout.index_path(lease, skew), b""),
        ]
    started = time.perf_counter()
    made = {path for path, _ in nodes}  # a record is its incarnation's parent: created in order
    for parent in sorted({path.rsplit("/", 1)[0] for path, _ in nodes} - made):
        raw.ensure_path(f"{chroot}/coordinator{parent}")
    for i in range(0, len(nodes), 2000):  # pipelined: every create of a batch sent before any reply
        pending = [
            raw.create_async(f"{chroot}/coordinator{path}", data) for path, data in nodes[i : i + 2000]
        ]
        for result in pending:
            result.get(timeout=120)
    print(f"wrote {len(nodes)} nodes with raw kazoo in {time.perf_counter() - started:.1f}s", flush=True)

    metadata_uri, blobs_uri = f"zk://{zk_hosts}{chroot}/coordinator", f"s3://{bucket}{chroot}"
    cfg = coordinator_config.load(
        {"metadata": metadata_uri, "blobs": blobs_uri, "cleanup_interval": "0s"}, {}
    )
    deps = Deps(metadata=open_metadata_store(metadata_uri), blobs=open_blob_store(blobs_uri))
    try:
        services = Services.build(cfg, deps, CoordinatorMetrics(new_registry()))
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: services.snapshots.create(f"app-{i:06d}", ["t0"], 0, 0, {}), range(apps)))
        print(f"created {apps} apps in {time.perf_counter() - started:.1f}s", flush=True)
        raw_ids = {id(raw)}
        for n in (1, 2):
            before = _requests_of(_coordinator_clients(raw_ids) - raw_ids)
            started = time.perf_counter()
            removed = services.janitor.run_once()
            took = time.perf_counter() - started
            sent = _requests_of(_coordinator_clients(raw_ids) - raw_ids) - before
            print(
                f"janitor pass {n}: {took * 1000:.0f} ms, {sent} ZooKeeper requests, removed {removed}",
                flush=True,
            )
    finally:
        deps.blobs.close()
        deps.metadata.close()
    with tempfile.TemporaryDirectory(prefix="snapcoord-bench-scale-") as tmp:
        args = ["--metadata", metadata_uri, "--blobs", blobs_uri, "--log-level", "WARNING"]
        with CoordinatorProcess(Path(tmp), args=args, start_timeout_s=300) as proc:
            pid = proc._proc.pid  # type: ignore[union-attr]
            rss = next(
                x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS")
            )
            print(
                f"server start to SERVING: {proc.serving_after_s:.2f}s; {rss.split(':')[1].strip()} RSS",
                flush=True,
            )
            proc.terminate()
    # No recursive delete of the 230k nodes (minutes, one request each): this ZooKeeper is the
    # benchmark's own, removed with its data directory at exit.
    raw.stop()
    raw.close()


def zk_write_ms(zk_hosts: str, n: int) -> float:
    """Median ms of one raw kazoo transaction like a report's (create a node, set another), one
    after another: the ZooKeeper write rate a completing snapshot is measured against."""
    raw = KazooClient(hosts=zk_hosts)
    raw.start()
    base = f"/bench-zkw-{uuid.uuid4().hex[:8]}"
    raw.ensure_path(f"{base}/n")
    latencies = []
    for i in range(n):
        t0 = time.perf_counter()
        tx = raw.transaction()
        tx.create(f"{base}/t{i}", b"x" * 300)
        tx.set_data(f"{base}/n", b"x" * 300)
        results = tx.commit()
        latencies.append(time.perf_counter() - t0)
        assert not any(isinstance(r, Exception) for r in results), results
    raw.delete(base, recursive=True)
    raw.stop()
    raw.close()
    return statistics.median(latencies) * 1000


def completion(bench: Bench, zk_hosts: str, bucket: str, task_counts: list[int], in_process: bool) -> None:
    """Reports sent one after another until the snapshot completes: time per report should not
    grow with the task count (linear total), against a raw ZooKeeper transaction's time."""
    run_id = uuid.uuid4().hex[:8]
    server = coordinator(
        bench, zk_hosts, f"zk://{zk_hosts}/bench-{run_id}", f"s3://{bucket}/bench-{run_id}", in_process, set()
    )
    with server as target, grpc.insecure_channel(target) as channel:
        stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        print("\n## completing one snapshot, reports one after another (offsets only)")
        print(
            f"{'tasks':>6} {'total s':>9} {'ms/report':>10} {'first 10% ms':>13} {'last 10% ms':>12} "
            f"{'raw multi ms':>13} {'vs ZK rate':>10}"
        )
        for count in task_counts:
            app = f"complete-{count}"
            tasks = [f"task-{i}" for i in range(count)]
            stub.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=tasks), timeout=60)
            latencies = []
            started = time.perf_counter()
            last = None
            for task in tasks:
                t0 = time.perf_counter()
                last = stub.ReportTaskSnapshot(
                    snapshot_pb2.ReportTaskSnapshotRequest(
                        app_id=app,
                        generation=1,
                        task=snapshot_pb2.TaskSnapshot(task_id=task, committed_offsets=offsets(4)),
                    ),
                    timeout=60,
                )
                latencies.append(time.perf_counter() - t0)
            total = time.perf_counter() - started
            assert last is not None and last.state == snapshot_pb2.Snapshot.COMPLETED
            tenth = max(1, count // 10)
            first = statistics.mean(latencies[:tenth]) * 1000
            end = statistics.mean(latencies[-tenth:]) * 1000
            # The ZooKeeper write rate right after (same load): a report is one such transaction
            # plus its reads, so the ratio says how far from the write rate completion runs.
            zk_ms = zk_write_ms(zk_hosts, min(count, 200))
            per = total / count * 1000
            row = f"{count:>6} {total:9.2f} {per:10.2f} {first:13.2f} {end:12.2f}"
            print(f"{row} {zk_ms:13.2f} {per / zk_ms:9.1f}x")


def summary(rows: list[Row]) -> None:
    print(
        "\n## summary: ratio = ours ops/s / raw ops/s (>= 0.80 is the goal) "
        "[ceiling: the raw operations plus bare gRPC round trips]"
    )
    columns = sorted({(r.clients, r.processes) for r in rows})
    with_ceilings = any(r.ceiling == r.ceiling for r in rows)  # not NaN somewhere
    names = list(dict.fromkeys(r.name for r in rows))
    titles = [f"c={c}" + (f", {p} processes" if p > 1 else "") for c, p in columns]
    print(f"{'operation':<50} " + " ".join(f"{t:>24}" for t in titles))
    for name in names:
        cells = []
        for c, p in columns:
            row = next((r for r in rows if r.name == name and r.clients == c and r.processes == p), None)
            cell = "-"
            if row:
                cell = f"{row.ratio:5.2f} ({min(row.ratios):.2f}-{max(row.ratios):.2f})"
                if with_ceilings:
                    cell += f" [{row.ceiling:.2f}]" if row.ceiling == row.ceiling else " [ -  ]"
            cells.append(cell)
        print(f"{name:<50} " + " ".join(f"{x:>24}" for x in cells))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one slice (default 1.0)")
    parser.add_argument("--rounds", type=int, default=4, help="slices per side and row (default 4)")
    parser.add_argument("--clients", default="1,16", help="concurrency levels (default 1,16)")
    parser.add_argument("--tasks", default="100,1000", help="task counts for the completion figure")
    parser.add_argument(
        "--scale", type=int, default=100_000, help="producer records for the scale figures (0 skips them)"
    )
    parser.add_argument("--no-etcd", action="store_true", help="skip the etcd comparison")
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="--processes of the last column and the cores rows (default 2; 1 skips them)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the hot RPCs' coordinator in the benchmark's own process (default: its own process)",
    )
    parser.add_argument(
        "--fsync",
        action="store_true",
        help="ZooKeeper and etcd fsync every write, as deployed (default: neither does)",
    )
    parser.add_argument("--smoke", action="store_true", help="every row once, briefly (CI)")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated parts of row names to run (case-insensitive, e.g. 'lease,progress'); "
        "'completion' and 'scale' select those figures. Default: everything",
    )
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds, args.clients, args.tasks, args.scale = 0.2, 1, "1,2", "10", 1000
    warmup = 1 if args.smoke else 5
    _install_request_counter()
    bench = Bench(args.seconds, args.rounds, warmup, [o.strip() for o in args.only.split(",") if o.strip()])
    with real_servers(fsync=args.fsync) as (zk, s3):
        os.environ.update(s3.env())
        print(
            f"# hot_rpcs: {args.rounds} x {args.seconds}s slices per side; ZooKeeper {zk.hosts}; "
            f"S3 {s3.endpoint_url}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
            f"ZooKeeper and etcd {'fsync each write' if args.fsync else 'skip fsync'}"
        )
        counts = [int(x) for x in args.clients.split(",")]
        with contextlib.ExitStack() as stack:
            etcd = None if args.no_etcd else stack.enter_context(etcd_server(fsync=args.fsync))
            run(bench, zk.hosts, s3.client(), s3.bucket, counts, etcd, args.in_process, args.processes)
            if args.processes > 1:
                cores(bench, zk.hosts, s3.bucket, max(counts), etcd, args.processes)
        if bench.wants("completion"):
            completion(bench, zk.hosts, s3.bucket, [int(x) for x in args.tasks.split(",")], args.in_process)
        if args.scale and bench.wants("scale"):
            scale(zk.hosts, s3.bucket, args.scale)
    summary(bench.rows)


if __name__ == "__main__":
    main()
