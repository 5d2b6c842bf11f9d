"""Server CPU per call: how many ms of the coordinator process's CPU one RPC costs.

    bench/run cpu_per_call [--calls 2000] [--clients 4] [--profile RPC]

Runs ``snapcoord serve`` on real ZooKeeper + SeaweedFS (one process, so that /proc counts only
its CPU: user + system time of all its threads), sends ``--calls`` calls of each RPC from
``--clients`` threads, and prints server CPU ms per call next to a bare health RPC's. With
``--profile RPC`` (a row name below), py-spy samples the server during that row and the output
adds the functions where its threads spent the most time (self and inclusive): py-spy is not a
dependency of the project (``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import collections
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
from common import real_servers
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    common_pb2,
    lease_pb2,
    lease_pb2_grpc,
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


def main() -> None:
    from harness.coordinator import CoordinatorProcess

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the rows (median kept)")
    parser.add_argument("--profile", default="", help="row name to sample with py-spy")
    args = parser.parse_args()
    run_id = uuid.uuid4().hex[:8]
    with real_servers() as (zk, s3), tempfile.TemporaryDirectory(prefix="snapcoord-cpu-") as tmp:
        os.environ.update(s3.env())
        argv = [
            "--metadata", f"zk://{zk.hosts}/cpu-{run_id}", "--blobs", f"s3://{s3.bucket}/cpu-{run_id}",
            "--cleanup-interval", "0s", "--log-level", "WARNING",
        ]  # fmt: skip
        with CoordinatorProcess(Path(tmp), args=argv, start_timeout_s=180) as proc:
            channel = grpc.insecure_channel(proc.target)
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
            for c in range(args.clients):
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
                    snaps.CreateSnapshot(
                        snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=tasks), timeout=60
                    )
                snaps.ReportTaskSnapshot(
                    snapshot_pb2.ReportTaskSnapshotRequest(
                        app_id=app,
                        generation=generation + 1,
                        task=snapshot_pb2.TaskSnapshot(
                            task_id=tasks[task],
                            committed_offsets=[
                                common_pb2.Offset(stream="events", partition=p, offset=10**6 + p)
                                for p in range(4)
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
                    boundaries=[
                        common_pb2.Offset(stream="s", partition=p, offset=10**12) for p in range(100)
                    ],
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

            rows: dict[str, Callable[[int, int], object]] = {
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
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
            for op in rows.values():
                drive(op, 50 * args.clients, args.clients)  # warm-up
            for _ in range(args.rounds):
                for name, op in rows.items():
                    spy = None
                    spy_bin = shutil.which(
                        "py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}"
                    )
                    if name == args.profile and spy_bin:
                        out = Path(tmp) / "profile.txt"
                        spy = subprocess.Popen(
                            [spy_bin, "record", "--pid", str(proc.pid), "--format", "raw", "--rate", "200",
                             "--threads", "--gil", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        )  # fmt: skip
                        time.sleep(1.0)  # attached
                    before = cpu_s(proc.pid)
                    wall = drive(op, args.calls, args.clients)
                    used = cpu_s(proc.pid) - before
                    results[name].append((used / args.calls * 1000, args.calls / wall))
                    if spy is not None:
                        spy.send_signal(2)
                        spy.wait(timeout=60)
                        args.profile = ""  # once
                        summarize_profile(out)
            channel.close()
    print(f"\n## server CPU per call ({args.calls} calls x {args.rounds} rounds, {args.clients} clients)")
    print(f"{'rpc':<40} {'ms CPU/call':>12} {'calls/s':>9}")
    for name, samples in results.items():
        cpu = sorted(x for x, _ in samples)[len(samples) // 2]
        rate = sorted(y for _, y in samples)[len(samples) // 2]
        print(f"{name:<40} {cpu:12.3f} {rate:9.0f}")


if __name__ == "__main__":
    main()
