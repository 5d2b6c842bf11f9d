"""Snapshot leases: AcquireSnapshots latency for 1, 10 and 100 snapshots per call, and the lag
from a lease's expiry to its removal by the janitor at the default cleanup interval.

    bench/run leases [--n 100] [--expiry-samples 8]

AcquireSnapshots is timed through a real gRPC channel to an in-process coordinator on real
ZooKeeper and S3, interleaved with the raw kazoo work it has to do at least: one get per snapshot
header and one multi creating the lease and one pin index per snapshot. The expiry lag runs a
coordinator with its janitor on the default interval (60 s) and the default clock-skew margin
(5 s): a lease counts until expiry + skew by design, so the lag is skew plus up to one interval.
This part takes about two minutes.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid

import grpc
from common import Sample, in_process_coordinator, measure_pair, print_table, real_servers
from kazoo.client import KazooClient

from snapcoord.v1 import common_pb2, lease_pb2, lease_pb2_grpc, snapshot_pb2, snapshot_pb2_grpc


def acquire_latency(zk_hosts: str, bucket: str, n: int) -> list[tuple[Sample, Sample | None]]:
    run_id = uuid.uuid4().hex[:8]
    chroot = f"/bench-{run_id}"
    raw = KazooClient(hosts=zk_hosts)
    raw.start()
    raw.ensure_path(f"{chroot}/raw/pins")
    coordinator = in_process_coordinator(f"zk://{zk_hosts}{chroot}/coordinator", f"s3://{bucket}{chroot}")
    rows: list[tuple[Sample, Sample | None]] = []
    try:
        with coordinator as port, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
            leases = lease_pb2_grpc.LeaseServiceStub(channel)
            for generation in range(1, 101):
                snapshots.CreateSnapshot(
                    snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["q"]), timeout=30
                )
                snapshots.ReportTaskSnapshot(
                    snapshot_pb2.ReportTaskSnapshotRequest(
                        app_id="app", generation=generation, task=snapshot_pb2.TaskSnapshot(task_id="q")
                    ),
                    timeout=30,
                )
            for count in (1, 10, 100):
                refs = [common_pb2.SnapshotRef(app_id="app", generation=g) for g in range(1, count + 1)]
                prefix = uuid.uuid4().hex[:6]

                def ours(i: int, refs: list[common_pb2.SnapshotRef] = refs, prefix: str = prefix) -> None:
                    request = lease_pb2.AcquireSnapshotsRequest(
                        lease_id=f"{prefix}-{i}", duration_ms=600_000, snapshots=refs
                    )
                    assert not leases.AcquireSnapshots(request, timeout=60).unavailable

                def drop(i: int, prefix: str = prefix) -> None:
                    # Each call is a new lease on the same snapshots: drop it (untimed), so that
                    # the snapshots' holders stay within --lease-max-holders.
                    assert leases.DropLease(
                        lease_pb2.DropLeaseRequest(lease_id=f"{prefix}-{i}"), timeout=60
                    ).dropped

                def baseline(i: int, count: int = count, prefix: str = prefix) -> None:
                    for _ in range(count):
                        raw.exists(f"{chroot}/raw")
                    tx = raw.transaction()
                    tx.create(f"{chroot}/raw/{prefix}-{i}", b"{}")
                    for g in range(1, count + 1):
                        tx.create(f"{chroot}/raw/pins/{prefix}-{i}-{g}", b"{}")
                    tx.commit()

                base, mine = measure_pair(
                    f"raw: {count} get + multi({count + 1} creates)",
                    baseline,
                    f"AcquireSnapshots, {count} snapshot(s)",
                    ours,
                    n,
                    warmup=5,
                    undo=drop,
                )
                rows += [(base, None), (mine, base)]
    finally:
        raw.delete(chroot, recursive=True)
        raw.stop()
        raw.close()
    return rows


def expiry_lag(zk_hosts: str, bucket: str, samples: int) -> list[float]:
    """Seconds from each lease's expires_at_ms to the moment its record is gone."""
    run_id = uuid.uuid4().hex[:8]
    chroot = f"/bench-{run_id}"
    raw = KazooClient(hosts=zk_hosts)
    raw.start()
    # The default janitor interval and clock-skew margin, spelled out: the lag depends on them.
    coordinator = in_process_coordinator(
        f"zk://{zk_hosts}{chroot}", f"s3://{bucket}{chroot}", cleanup_interval="60s", max_clock_skew="5s"
    )
    lags: list[float] = []
    try:
        with coordinator as port, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            leases = lease_pb2_grpc.LeaseServiceStub(channel)
            pending: dict[str, int] = {}
            for i in range(samples):  # staggered over one interval, so the lags spread over it
                time.sleep(random.uniform(0, 60 / samples))
                reply = leases.AcquireSnapshots(
                    lease_pb2.AcquireSnapshotsRequest(lease_id=f"short-{i}", duration_ms=1_000), timeout=30
                )
                pending[f"short-{i}"] = reply.lease.expires_at_ms
            deadline = time.monotonic() + 180
            while pending and time.monotonic() < deadline:
                for lease_id, expires_at_ms in list(pending.items()):
                    if raw.exists(f"{chroot}/leases/records/{lease_id}") is None:
                        lags.append(time.time() - expires_at_ms / 1000)
                        del pending[lease_id]
                time.sleep(0.1)
    finally:
        raw.delete(chroot, recursive=True)
        raw.stop()
        raw.close()
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100, help="recorded calls per size (default 100)")
    parser.add_argument(
        "--expiry-samples", type=int, default=8, help="leases timed for the expiry lag (0: skip)"
    )
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(f"# leases: n={args.n}; ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}")
        print_table(
            "AcquireSnapshots vs the raw ZooKeeper operations", acquire_latency(zk.hosts, s3.bucket, args.n)
        )
        if args.expiry_samples:
            lags = expiry_lag(zk.hosts, s3.bucket, args.expiry_samples)
            print("\n## lease expiry lag at the default cleanup interval (60 s) and clock-skew margin (5 s)")
            print(
                f"{len(lags)} leases: min {min(lags):.1f} s, median {statistics.median(lags):.1f} s, "
                f"max {max(lags):.1f} s after expires_at_ms"
            )


if __name__ == "__main__":
    main()
