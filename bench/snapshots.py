"""Generation snapshots: ReportTaskSnapshot, cached vs consistent GetCurrentSnapshot, and how the
cost of completing a snapshot grows with its number of tasks.

    bench/run snapshots [--n 300] [--tasks 10,100,1000]

Everything goes through a real gRPC channel to an in-process coordinator on real ZooKeeper and
S3. Baselines measured in the same run: a raw kazoo multi(create, set_data) (the commit a report
makes), the same plus a raw boto3 put (a report with one checkpoint), and a raw kazoo get (what a
consistent read costs at least).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import TYPE_CHECKING

import grpc
from common import Sample, in_process_coordinator, measure_pair, print_table, real_servers
from kazoo.client import KazooClient

from snapcoord.v1 import common_pb2, snapshot_pb2, snapshot_pb2_grpc

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CHECKPOINT = os.urandom(256)


def report(app: str, generation: int, task: str, checkpoint: bool) -> snapshot_pb2.ReportTaskSnapshotRequest:
    return snapshot_pb2.ReportTaskSnapshotRequest(
        app_id=app,
        generation=generation,
        task=snapshot_pb2.TaskSnapshot(
            task_id=task,
            committed_offsets=[
                common_pb2.Offset(stream="events", partition=p, offset=10**6) for p in range(4)
            ],
            checkpoints={"store": CHECKPOINT} if checkpoint else {},
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="recorded calls per operation (default 300)")
    parser.add_argument("--tasks", default="10,100,1000", help="task counts for the completion cost")
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(f"# snapshots: n={args.n}; ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}")
        run(zk.hosts, s3.client(), s3.bucket, args.n, [int(t) for t in args.tasks.split(",")])


def run(zk_hosts: str, s3: S3Client, bucket: str, n: int, task_counts: list[int]) -> None:
    run_id = uuid.uuid4().hex[:8]
    chroot = f"/bench-{run_id}"
    raw = KazooClient(hosts=zk_hosts)
    raw.start()
    raw.ensure_path(f"{chroot}/raw")
    raw.create(f"{chroot}/raw/header", b"{}")
    coordinator = in_process_coordinator(
        f"zk://{zk_hosts}{chroot}/coordinator", f"s3://{bucket}/bench-{run_id}"
    )
    try:
        with coordinator as port, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
            rows: list[tuple[Sample, Sample | None]] = []

            def raw_commit(i: int) -> None:
                tx = raw.transaction()
                tx.create(f"{chroot}/raw/t{i}-{time.perf_counter_ns()}", b"{}")
                tx.set_data(f"{chroot}/raw/header", b"{}")
                tx.commit()

            def raw_commit_and_put(i: int) -> None:
                s3.put_object(
                    Bucket=bucket, Key=f"bench-{run_id}/raw/{i}-{time.perf_counter_ns()}", Body=CHECKPOINT
                )
                raw_commit(i)

            for checkpoint, baseline, label in (
                (False, raw_commit, "raw kazoo multi(create, set_data)"),
                (True, raw_commit_and_put, "raw boto3 put + kazoo multi"),
            ):
                app = f"report-{checkpoint}"
                tasks = [f"t{i}" for i in range(n + 40)]
                stub.CreateSnapshot(
                    snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=tasks), timeout=30
                )
                requests = {i: report(app, 1, f"t{i + 20}", checkpoint) for i in range(-20, n)}

                def ours(
                    i: int, requests: dict[int, snapshot_pb2.ReportTaskSnapshotRequest] = requests
                ) -> None:
                    stub.ReportTaskSnapshot(requests[i], timeout=30)

                what = "1 checkpoint of 256 B" if checkpoint else "offsets only"
                base, mine = measure_pair(label, baseline, f"ReportTaskSnapshot ({what})", ours, n)
                rows += [(base, None), (mine, base)]

            def raw_get(i: int) -> None:
                raw.get(f"{chroot}/raw/header")

            consistent = snapshot_pb2.GetCurrentSnapshotRequest(app_id="report-False", consistent=True)
            cached = snapshot_pb2.GetCurrentSnapshotRequest(app_id="report-False", consistent=False)
            base, ours_consistent = measure_pair(
                "raw kazoo get", raw_get, "GetCurrentSnapshot consistent=true",
                lambda i: stub.GetCurrentSnapshot(consistent, timeout=30), n,
            )  # fmt: skip
            _, ours_cached = measure_pair(
                "raw kazoo get", raw_get, "GetCurrentSnapshot consistent=false (cached)",
                lambda i: stub.GetCurrentSnapshot(cached, timeout=30), n,
            )  # fmt: skip
            rows += [(base, None), (ours_consistent, base), (ours_cached, base)]
            print_table("snapshot RPCs vs the raw ZooKeeper + S3 operations", rows)

            print("\n## completing one snapshot, reports sent one after another (offsets only)")
            print(f"{'tasks':>6} {'total s':>9} {'per report ms':>14} {'median ms':>10} {'p99 ms':>8}")
            for count in task_counts:
                app = f"complete-{count}"
                tasks = [f"task-{i}" for i in range(count)]
                stub.CreateSnapshot(
                    snapshot_pb2.CreateSnapshotRequest(app_id=app, task_ids=tasks), timeout=30
                )
                latencies = []
                started = time.perf_counter()
                for task in tasks:
                    t0 = time.perf_counter()
                    last = stub.ReportTaskSnapshot(report(app, 1, task, False), timeout=60)
                    latencies.append(time.perf_counter() - t0)
                total = time.perf_counter() - started
                assert last.state == snapshot_pb2.Snapshot.COMPLETED
                sample = Sample(app, latencies)
                per_report = total / count * 1000
                stats = f"{sample.median_ms:10.2f} {sample.p99_ms:8.2f}"
                print(f"{count:>6} {total:9.2f} {per_report:14.2f} {stats}")
    finally:
        raw.delete(chroot, recursive=True)
        raw.stop()
        raw.close()


if __name__ == "__main__":
    main()
