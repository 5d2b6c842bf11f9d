"""Server CPU per call: how many ms of the coordinator process's CPU one RPC costs.

    bench/run cpu_per_call [--calls 2000] [--clients 4] [--rounds 3] [--only WORDS] [--other DIR]
                           [--profile RPC]

Runs ``snapcoord serve`` on real ZooKeeper + SeaweedFS (one process, so that /proc counts only
its CPU: user + system time of all its threads), sends ``--calls`` calls of each RPC from
``--clients`` threads, and prints server CPU ms per call next to a bare health RPC's, with the
ZooKeeper requests per call (counted by ZooKeeper, its ``cons`` command, less what the servers
send while idle). ``--only`` keeps the rows whose names contain one of the comma-separated words
(and health). With ``--other DIR`` the coordinator of another checkout (its sources first on
PYTHONPATH) runs every row too, in its own process and chroot, alternating with this checkout's
row by row: before and after in one run, with the ratio of their CPU per call. With ``--profile
RPC`` (a row name below), py-spy samples this checkout's server during that row and the output
adds the functions where its threads spent the most time (self and inclusive): py-spy is not a
dependency of the project (``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
from common import ROOT, real_servers
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.coordinator import CoordinatorProcess
from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    common_pb2,
    lease_pb2,
    lease_pb2_grpc,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def drive(op: Callable[[int, int], object], calls: int, clients: int) -> float:
    """``calls`` calls of ``op`` spread over ``clients`` threads started together; wall seconds."""
    from harness.concurrency import run_threads

    per = calls // clients

    def client(c: int) -> None:
        for k in range(per):
            op(c, k)

    started = time.perf_counter()
    run_threads(clients, client)
    return time.perf_counter() - started


def summarize_profile(raw: Path, top: int = 25) -> None:
    """py-spy's collapsed stacks -> the functions with the most samples (self, inclusive)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  for f in stack.split(";")[1:]]  # fmt: skip
        total += n
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    print(f"\n## profile: {total} samples; top self time")
    for name, n in own.most_common(top):
        print(f"{n / total * 100:6.1f}%  {name}")
    print("\n## top inclusive time")
    for name, n in inclusive.most_common(top):
        print(f"{n / total * 100:6.1f}%  {name}")


def session_requests(zk: str) -> int:
    """Requests ZooKeeper has received on all its client sessions so far (its ``cons`` command).
    Rows run one server at a time, so the difference across a row is that server's requests, plus
    what both send while idle (measured apart, and taken off)."""
    from harness.zookeeper import four_letter_word

    host, port = zk.split(",")[0].rsplit(":", 1)
    total = 0
    for line in four_letter_word(host, int(port), "cons").splitlines():
        stats = line[line.find("(") + 1 : line.rfind(")")].split(",")
        fields = dict(f.split("=", 1) for f in stats if "=" in f)
        if "sid" in fields:
            total += int(fields["recved"])
    return total


def rows_for(channel: grpc.Channel, clients: int) -> dict[str, Callable[[int, int], object]]:
    """The measured calls against the coordinator behind ``channel``, after the state they need
    (a completed snapshot, held leases, a marked backlog) is in place."""
    health = health_pb2_grpc.HealthStub(channel)
    snaps = snapshot_pb2_grpc.SnapshotServiceStub(channel)
    leases = lease_pb2_grpc.LeaseServiceStub(channel)
    snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["a"]), timeout=60)
    snaps.ReportTaskSnapshot(
        snapshot_pb2.ReportTaskSnapshotRequest(
            app_id="app",
            generation=1,
            task=snapshot_pb2.TaskSnapshot(
                task_id="a", committed_offsets=[common_pb2.Offset(stream="s", partition=0, offset=1)]
            ),
        ),
        timeout=60,
    )
    for c in range(clients):
        leases.AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(lease_id=f"cpu-{c}", duration_ms=600_000), timeout=60
        )
    held = [common_pb2.SnapshotRef(app_id="app", generation=1)]
    tasks = [f"t{i}" for i in range(2000)]  # as hot_rpcs: a header with a large task set
    payload = os.urandom(1024)
    reported: collections.Counter[str] = collections.Counter()

    big = os.urandom(1024 * 1024)

    def report(c: int, k: int, body: bytes = payload, kind: str = "rep") -> None:
        """A report of ``body`` by the next task of client ``c``'s snapshot (a new one when
        all reported: its CreateSnapshot is one call in 2,000)."""
        app = f"{kind}-{c}"
        generation, task = divmod(reported[app], len(tasks))
        reported[app] += 1
        if task == 0:
            snaps.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=tasks), timeout=60)
        snaps.ReportTaskSnapshot(
            snapshot_pb2.ReportTaskSnapshotRequest(
                app_id=app,
                generation=generation + 1,
                task=snapshot_pb2.TaskSnapshot(
                    task_id=tasks[task],
                    committed_offsets=[
                        common_pb2.Offset(stream="events", partition=p, offset=10**6 + p) for p in range(4)
                    ],
                    checkpoints={"state": body},
                ),
            ),
            timeout=60,
        )

    backlog = backlog_pb2_grpc.BacklogServiceStub(channel)
    backlog.MarkBacklog(
        backlog_pb2.MarkBacklogRequest(
            job_id="job",
            boundaries=[common_pb2.Offset(stream="s", partition=p, offset=10**12) for p in range(100)],
        ),
        timeout=60,
    )

    progress_at = itertools.count(1)

    def report_progress(c: int, k: int) -> object:
        # Every call moves the positions on (k restarts with each pass), so every call writes.
        at = next(progress_at)
        positions = [common_pb2.Offset(stream="s", partition=p, offset=at) for p in range(100)]
        return backlog.ReportProgress(
            backlog_pb2.ReportProgressRequest(job_id="job", positions=positions), timeout=60
        )

    producers = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
    registered = itertools.count()
    ten = [common_pb2.Offset(stream="events", partition=p, offset=10**6 + p) for p in range(10)]

    return {
        "health": lambda c, k: health.Check(health_pb2.HealthCheckRequest(), timeout=60),
        "GetCurrentSnapshot consistent=true": lambda c, k: snaps.GetCurrentSnapshot(
            snapshot_pb2.GetCurrentSnapshotRequest(app_id="app", consistent=True), timeout=60
        ),
        "GetCurrentSnapshot cached": lambda c, k: snaps.GetCurrentSnapshot(
            snapshot_pb2.GetCurrentSnapshotRequest(app_id="app"), timeout=60
        ),
        # As hot_rpcs: the client's snapshot is CREATED, so each call answers it (a read).
        "CreateSnapshot (4 tasks)": lambda c, k: snaps.CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(app_id=f"cr-{c}", task_ids=["a", "b", "c", "d"]),
            timeout=60,
        ),
        # As hot_rpcs: a new producer each call (its record made, with its expiry entry).
        "RegisterProducerOffsets (10 offsets)": lambda c, k: producers.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"r-{next(registered)}", offsets=ten),
            timeout=60,
        ),
        "ReportTaskSnapshot, 1 KiB checkpoint": report,
        "ReportTaskSnapshot, 1 MiB checkpoint": lambda c, k: report(c, k, big, "big"),
        "RenewLease": lambda c, k: leases.RenewLease(
            lease_pb2.RenewLeaseRequest(lease_id=f"cpu-{c}", duration_ms=600_000), timeout=60
        ),
        # One call = AcquireSnapshots of one snapshot (held already after the first, by
        # every client's lease) + RenewLease: the two RPCs of the hot_rpcs row. Neither
        # rewrites the shared pin index once the snapshot is held (each writes its record).
        "AcquireSnapshots(1) + RenewLease": lambda c, k: (
            leases.AcquireSnapshots(
                lease_pb2.AcquireSnapshotsRequest(
                    lease_id=f"cpu-pin-{c}", duration_ms=600_000, snapshots=held
                ),
                timeout=60,
            ),
            leases.RenewLease(
                lease_pb2.RenewLeaseRequest(lease_id=f"cpu-pin-{c}", duration_ms=600_000), timeout=60
            ),
        ),
        "ReportProgress 100 partitions": report_progress,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the rows (median kept)")
    parser.add_argument("--profile", default="", help="row name to sample with py-spy")
    parser.add_argument("--only", default="", help="comma-separated parts of row names to run")
    parser.add_argument(
        "--other",
        type=Path,
        help="another checkout: its coordinator runs every row too, alternating with this one's",
    )
    args = parser.parse_args()
    run_id = uuid.uuid4().hex[:8]
    only = [o.strip().lower() for o in args.only.split(",") if o.strip()]
    servers = ["this"] + (["other"] if args.other else [])
    with (
        real_servers() as (zk, s3),
        tempfile.TemporaryDirectory(prefix="snapcoord-cpu-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        os.environ.update(s3.env())
        procs: dict[str, CoordinatorProcess] = {}
        rows: dict[str, dict[str, Callable[[int, int], object]]] = {}
        channels = []
        for label in servers:
            argv = [
                "--metadata", f"zk://{zk.hosts}/cpu-{run_id}-{label}",
                "--blobs", f"s3://{s3.bucket}/cpu-{run_id}-{label}",
                "--cleanup-interval", "0s", "--log-level", "WARNING",
            ]  # fmt: skip
            env = {}
            if label == "other":
                env["PYTHONPATH"] = f"{args.other}/coordinator/src:{args.other}/client/src"
            workdir = Path(tmp) / label
            workdir.mkdir()
            procs[label] = stack.enter_context(
                CoordinatorProcess(workdir, args=argv, env=env, start_timeout_s=180)
            )
            channel = grpc.insecure_channel(procs[label].target)
            channels.append(channel)
            rows[label] = {
                name: op
                for name, op in rows_for(channel, args.clients).items()
                if not only or name == "health" or any(o in name.lower() for o in only)
            }
        names = list(rows["this"])
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {
            (name, label): [] for name in names for label in servers
        }
        for label in servers:
            for op in rows[label].values():
                drive(op, 50 * args.clients, args.clients)  # warm-up
        # What the servers send while idle (pings, each one's clock check: a write a second),
        # taken off each row's count.
        idle_at, idle_started = session_requests(zk.hosts), time.perf_counter()
        time.sleep(3.0)
        idle_per_s = (session_requests(zk.hosts) - idle_at) / (time.perf_counter() - idle_started)
        for r in range(args.rounds):
            for name in names:
                # Alternate which server goes first, so that drift in the load hits both alike.
                for label in servers if r % 2 == 0 else servers[::-1]:
                    pid = procs[label].pid
                    spy = None
                    spy_bin = shutil.which(
                        "py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}"
                    )
                    if name == args.profile and label == "this" and spy_bin:
                        out = Path(tmp) / "profile.txt"
                        spy = subprocess.Popen(
                            [spy_bin, "record", "--pid", str(pid), "--format", "raw", "--rate", "200",
                             "--threads", "--gil", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        )  # fmt: skip
                        time.sleep(1.0)  # attached
                    before, requests = cpu_s(pid), session_requests(zk.hosts)
                    wall = drive(rows[label][name], args.calls, args.clients)
                    used = cpu_s(pid) - before
                    sent = session_requests(zk.hosts) - requests - idle_per_s * wall
                    results[name, label].append(
                        (used / args.calls * 1000, args.calls / wall, sent / args.calls)
                    )
                    if spy is not None:
                        spy.send_signal(2)
                        spy.wait(timeout=60)
                        args.profile = ""  # once
                        summarize_profile(out)
        for channel in channels:
            channel.close()

    def median(samples: list[tuple[float, float, float]], i: int) -> float:
        return sorted(s[i] for s in samples)[len(samples) // 2]

    print(f"\n## server CPU per call ({args.calls} calls x {args.rounds} rounds, {args.clients} clients)")
    if args.other:
        print(f"(this: {ROOT}; other: {args.other}; cpu ratio: this / other, lowest-highest per round)")
    header = f"{'rpc':<40}"
    for label in servers:
        header += f" {label + ' ms CPU':>13} {'calls/s':>8} {'zk req':>6}"
    if args.other:
        header += f" {'cpu ratio':>9} {'band':>9}"
    print(header)
    for name in names:
        line = f"{name:<40}"
        for label in servers:
            samples = results[name, label]
            line += f" {median(samples, 0):13.3f} {median(samples, 1):8.0f} {median(samples, 2):6.2f}"
        if args.other:
            ratios = [a[0] / b[0] for a, b in zip(results[name, "this"], results[name, "other"], strict=True)]
            ratio = median(results[name, "this"], 0) / median(results[name, "other"], 0)
            line += f" {ratio:9.2f} {min(ratios):4.2f}-{max(ratios):4.2f}"
        print(line)


if __name__ == "__main__":
    main()
