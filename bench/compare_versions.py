"""This checkout's coordinator against another checkout's, RPC by RPC, in one run.

    bench/run compare_versions --other /path/to/other/checkout [--seconds 1.0] [--rounds 4] [--only TEXT]

Both run as ``snapcoord serve`` processes (the other one with its own sources first on
PYTHONPATH) on the same ZooKeeper and SeaweedFS, and each row alternates short slices between
them at the same concurrency, so that a noisy neighbour hits both alike: ratio = this checkout's
calls/s / the other's, with the lowest and highest slice ratio as the noise band. The rows are the
hot RPCs of ``hot_rpcs`` (whose ratios are against the raw ZooKeeper + S3 bound instead).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from pathlib import Path

import grpc
from common import real_servers
from hot_rpcs import Bench, Op, offsets, summary

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


class Target:
    """Stubs on one coordinator, one channel per client."""

    def __init__(self, address: str, clients: int) -> None:
        self.channels = [
            grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(clients)
        ]
        self.producers = [producer_pb2_grpc.ProducerOffsetServiceStub(c) for c in self.channels]
        self.snaps = [snapshot_pb2_grpc.SnapshotServiceStub(c) for c in self.channels]
        self.leases = [lease_pb2_grpc.LeaseServiceStub(c) for c in self.channels]
        self.backlog = [backlog_pb2_grpc.BacklogServiceStub(c) for c in self.channels]

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def rows(t: Target, clients: int, tag: str) -> dict[str, tuple[Op, str]]:
    """Each row's op on ``t`` after its setup (records to read, snapshots to report to)."""
    ten, blob = offsets(10), os.urandom(1024)
    big = os.urandom(1024 * 1024)
    for c in range(clients):
        for i in range(20):
            t.producers[c].RegisterProducerOffsets(
                producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"p{tag}-{c}-{i}", offsets=ten),
                timeout=60,
            )
        app = f"read{tag}-{c}"
        t.snaps[c].CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=list("abcd")), timeout=60
        )
        for task in "abcd":
            t.snaps[c].ReportTaskSnapshot(
                snapshot_pb2.ReportTaskSnapshotRequest(
                    app_id=app,
                    generation=1,
                    task=snapshot_pb2.TaskSnapshot(
                        task_id=task, committed_offsets=offsets(4), checkpoints={"s": blob}
                    ),
                ),
                timeout=60,
            )
    t.backlog[0].MarkBacklog(
        backlog_pb2.MarkBacklogRequest(
            job_id=f"job{tag}",
            boundaries=[common_pb2.Offset(stream="s", partition=p, offset=10**12) for p in range(100)],
        ),
        timeout=60,
    )

    def report(size: int, body: bytes) -> Op:
        def op(c: int, k: int) -> None:
            tasks, gen = 2000, k // 2000 + 1
            app = f"rep{size}{tag}-{c}"
            if k % tasks == 0:
                t.snaps[c].CreateSnapshot(
                    snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=[f"t{i}" for i in range(tasks)]),
                    timeout=60,
                )
            t.snaps[c].ReportTaskSnapshot(
                snapshot_pb2.ReportTaskSnapshotRequest(
                    app_id=app,
                    generation=gen,
                    task=snapshot_pb2.TaskSnapshot(
                        task_id=f"t{k % tasks}", committed_offsets=offsets(4), checkpoints={"s": body}
                    ),
                ),
                timeout=60,
            )

        return op

    def pair(snapshots: bool) -> Op:
        def op(c: int, k: int) -> None:
            lease_id = f"l{tag}-{snapshots}-{c}-{k}"
            refs = [common_pb2.SnapshotRef(app_id=f"read{tag}-{c}", generation=1)] if snapshots else []
            t.leases[c].AcquireSnapshots(
                lease_pb2.AcquireSnapshotsRequest(lease_id=lease_id, duration_ms=600_000, snapshots=refs),
                timeout=60,
            )
            t.leases[c].RenewLease(
                lease_pb2.RenewLeaseRequest(lease_id=lease_id, duration_ms=600_000), timeout=60
            )

        return op

    return {
        "RegisterProducerOffsets (10 offsets)": (
            lambda c, k: t.producers[c].RegisterProducerOffsets(
                producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"r{tag}-{c}-{k}", offsets=ten),
                timeout=60,
            ),
            "",
        ),
        "GetProducerOffsets": (
            lambda c, k: t.producers[c].GetProducerOffsets(
                producer_pb2.GetProducerOffsetsRequest(producer_id=f"p{tag}-{c}-{k % 20}"), timeout=60
            ),
            "",
        ),
        "CreateSnapshot (4 tasks)": (
            lambda c, k: t.snaps[c].CreateSnapshot(
                snapshot_pb2.CreateSnapshotRequest(app_id=f"cr{tag}-{c}", task_ids=list("abcd")), timeout=60
            ),
            "",
        ),
        "ReportTaskSnapshot, 1 KiB checkpoint": (report(1024, blob), ""),
        "ReportTaskSnapshot, 1 MiB checkpoint": (report(1024 * 1024, big), ""),
        "GetCurrentSnapshot consistent=false (cached)": (
            lambda c, k: t.snaps[c].GetCurrentSnapshot(
                snapshot_pb2.GetCurrentSnapshotRequest(app_id=f"read{tag}-{c}"), timeout=60
            ),
            "",
        ),
        "GetCurrentSnapshot consistent=true": (
            lambda c, k: t.snaps[c].GetCurrentSnapshot(
                snapshot_pb2.GetCurrentSnapshotRequest(app_id=f"read{tag}-{c}", consistent=True), timeout=60
            ),
            "",
        ),
        "GetSnapshot, 4 tasks x 1 KiB": (
            lambda c, k: t.snaps[c].GetSnapshot(
                snapshot_pb2.GetSnapshotRequest(
                    app_id=f"read{tag}-{c}", generation=1, include_checkpoints=True
                ),
                timeout=60,
            ),
            "",
        ),
        "AcquireSnapshots(1) + RenewLease": (pair(True), ""),
        "lease acquire + renew, no snapshots": (pair(False), ""),
        "ReportProgress, 100 partitions": (
            lambda c, k: t.backlog[c].ReportProgress(
                backlog_pb2.ReportProgressRequest(
                    job_id=f"job{tag}",
                    positions=[
                        common_pb2.Offset(stream="s", partition=p, offset=1000 * k + c) for p in range(100)
                    ],
                ),
                timeout=60,
            ),
            "",
        ),
    }


def main() -> None:
    from harness.coordinator import CoordinatorProcess

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--other", required=True, help="the other checkout (its coordinator/src and client/src)"
    )
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--only", default="", help="run only the rows whose name contains this")
    args = parser.parse_args()
    other = Path(args.other).resolve()
    other_path = f"{other}/coordinator/src:{other}/client/src"
    run_id = uuid.uuid4().hex[:8]
    bench = Bench(args.seconds, args.rounds, warmup=5)
    with real_servers() as (zk, s3), tempfile.TemporaryDirectory(prefix="snapcoord-compare-") as tmp:
        os.environ.update(s3.env())
        servers = []
        for side, env in (("other", {"PYTHONPATH": other_path}), ("this", {})):
            argv = [
                "--metadata", f"zk://{zk.hosts}/compare-{run_id}-{side}", "--blobs",
                f"s3://{s3.bucket}/compare-{run_id}-{side}", "--cleanup-interval", "0s",
                "--log-level", "WARNING", "--lease-max-holders", "1000", "--lease-max-snapshots", "1",
            ]  # fmt: skip
            servers.append(CoordinatorProcess(Path(tmp) / side, args=argv, env=env, start_timeout_s=180))
        with servers[0] as theirs, servers[1] as ours:
            load = os.getloadavg()[0]
            print(f"# compare_versions: this checkout vs {other}; {os.cpu_count()} cores, load {load:.1f}")
            for clients in [int(x) for x in args.clients.split(",")]:
                a, b = Target(theirs.target, clients), Target(ours.target, clients)
                tag = f"{run_id}-{clients}"
                other_rows, our_rows = rows(a, clients, tag), rows(b, clients, tag)
                print(f"\n## c={clients}", flush=True)
                for name, (op, _) in our_rows.items():
                    if args.only not in name:
                        continue
                    bench.pair(name, clients, other_rows[name][0], op, f"the same RPC on {other.name}")
                a.close()
                b.close()
    summary(bench.rows)


if __name__ == "__main__":
    main()
