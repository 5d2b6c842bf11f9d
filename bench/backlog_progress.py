"""ReportProgress for 10, 1,000 and 10,000 partitions per call against the raw ZooKeeper work it does.

    bench/run backlog_progress [--n 300]

A report reads the job record and the progress shards it touches (1,024 partitions each), then
writes the changed shards in one transaction; the boundaries come from the replica's memory after
the first call, so a steady-state report makes no S3 call. Each RPC is timed through a real gRPC
channel to an in-process coordinator on real servers, interleaved call by call with the raw kazoo
calls it makes: a get of a same-size job record, a get of each same-size shard, and one multi of
set_data on those shards. Every call moves every position forward (so every shard is rewritten)
and stays behind the boundary (the steady state of a job catching up). A last row reports 10
partitions of the 10,000-partition job: a report costs what it carries, not what the job holds.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Callable, Iterator

import grpc
from common import LARGE_REPLIES, Sample, in_process_coordinator, measure_pair, print_table, real_servers
from kazoo.client import KazooClient

from snapcoord.v1 import backlog_pb2, backlog_pb2_grpc, common_pb2

BOUNDARY = 10**12  # never reached: every report is a backlog report
BASE = 10**9


def _requests(job_id: str, reported: int, count: int) -> Iterator[backlog_pb2.ReportProgressRequest]:
    """``count`` reports of the first ``reported`` partitions, each one ahead of the previous."""
    # Built before timing starts: what is measured is the call, not building its request.
    requests = [
        backlog_pb2.ReportProgressRequest(
            job_id=job_id,
            positions=[
                common_pb2.Offset(stream="orders", partition=p, offset=BASE + 1000 * c + p)
                for p in range(reported)
            ],
        )
        for c in range(count)
    ]
    return iter(requests)


def _ours(
    stub: backlog_pb2_grpc.BacklogServiceStub, requests: Iterator[backlog_pb2.ReportProgressRequest]
) -> Callable[[int], None]:
    def call(i: int) -> None:
        reply = stub.ReportProgress(next(requests), timeout=60)
        assert reply.status.processing_backlog and not reply.newly_finished

    return call


def run(zk_hosts: str, bucket: str, n: int) -> list[tuple[Sample, Sample | None]]:
    run_id = uuid.uuid4().hex[:8]
    chroot = f"/bench-{run_id}"
    raw_zk = KazooClient(hosts=zk_hosts)
    raw_zk.start()
    raw_zk.ensure_path(f"{chroot}/raw")
    coordinator = in_process_coordinator(
        f"zk://{zk_hosts}{chroot}/coordinator", f"s3://{bucket}/bench-{run_id}/coordinator"
    )
    rows: list[tuple[Sample, Sample | None]] = []
    try:
        with (
            coordinator as port,
            grpc.insecure_channel(f"127.0.0.1:{port}", options=LARGE_REPLIES) as channel,
        ):
            stub = backlog_pb2_grpc.BacklogServiceStub(channel)
            cases = [
                (10, 10, n),
                (1000, 1000, max(20, n // 2)),
                (10_000, 10_000, max(10, n // 10)),
                (10_000, 10, n),
            ]
            for partitions, reported, calls in cases:
                job_id = f"job-{partitions}-{reported}"
                stub.MarkBacklog(
                    backlog_pb2.MarkBacklogRequest(
                        job_id=job_id,
                        boundaries=[
                            common_pb2.Offset(stream="orders", partition=p, offset=BOUNDARY)
                            for p in range(partitions)
                        ],
                    ),
                    timeout=60,
                )
                warmup = 5
                ours = _ours(stub, _requests(job_id, reported, 2 * (calls + warmup) + 1))
                ours(0)  # first call: loads the boundaries into the replica's cache
                raw = _raw_report(raw_zk, chroot, job_id, reported, run_id)
                raw_sample, our_sample = measure_pair(
                    f"raw kazoo get + {_shards(reported)} get + multi",
                    raw,
                    f"ReportProgress {reported} of {partitions} (gRPC)",
                    ours,
                    calls,
                    warmup=warmup,
                )
                rows += [(raw_sample, None), (our_sample, raw_sample)]
    finally:
        raw_zk.delete(chroot, recursive=True)
        raw_zk.stop()
        raw_zk.close()
    return rows


def _shards(reported: int) -> int:
    return -(-reported // 1024)


def _raw_report(
    zk: KazooClient, chroot: str, job_id: str, reported: int, run_id: str
) -> Callable[[int], None]:
    """The raw kazoo calls of one report, on copies of the coordinator's own nodes (same sizes)."""
    job_path = f"{chroot}/coordinator/backlog/jobs/{job_id}"
    record, _ = zk.get(job_path)
    shard_names = sorted(c for c in zk.get_children(job_path) if c.startswith("s-"))[: _shards(reported)]
    raw_dir = f"{chroot}/raw/{job_id}"
    zk.create(raw_dir, record)
    copies = []
    for name in shard_names:
        data, _ = zk.get(f"{job_path}/{name}")
        zk.create(f"{raw_dir}/{name}", data)
        copies.append((f"{raw_dir}/{name}", data))

    def raw(i: int) -> None:
        zk.get(raw_dir)
        for path, _ in copies:
            zk.get(path)
        tx = zk.transaction()
        for path, data in copies:
            tx.set_data(path, data)
        tx.commit()

    return raw


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--n", type=int, default=300, help="recorded calls for 10 partitions; n/2 for 1,000, n/10 for 10,000"
    )
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(f"# backlog_progress: n={args.n}; ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}")
        print_table(
            "ReportProgress vs the raw ZooKeeper operations it makes",
            run(zk.hosts, s3.bucket, args.n),
        )


if __name__ == "__main__":
    main()
