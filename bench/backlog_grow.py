"""MarkBacklog growing a job's mark by one partition (a source that grew), next to the marks a
driver sends otherwise: one naming nothing new (a restarted driver) and a reset.

    bench/run backlog_grow [--n 30]

A grow replaces the mark in one ZooKeeper transaction that carries every shard's progress over
(``backlog.decide.grow``), after uploading the grown boundaries object, so its cost grows with the
job: measured for jobs of 10, 1,000 and 10,000 partitions with every position reported (the
largest shards). Each grown call adds one new partition; the repeated mark and the reset are
timed on the same job. Every call goes through a real gRPC channel to an in-process coordinator
on real servers (ZooKeeper, SeaweedFS).
"""

from __future__ import annotations

import argparse
import itertools
import os
import uuid
from collections.abc import Callable

import grpc
from common import LARGE_REPLIES, Sample, in_process_coordinator, measure, print_table, real_servers

from snapcoord.v1 import backlog_pb2, backlog_pb2_grpc, common_pb2

BOUNDARY = 10**12
BASE = 10**9


def _offsets(partitions: range, offset: int) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream="orders", partition=p, offset=offset + p) for p in partitions]


def _mark(
    stub: backlog_pb2_grpc.BacklogServiceStub,
    job_id: str,
    offsets: list[common_pb2.Offset],
    reset: bool = False,
) -> backlog_pb2.BacklogStatus:
    reply: backlog_pb2.BacklogStatus = stub.MarkBacklog(
        backlog_pb2.MarkBacklogRequest(job_id=job_id, boundaries=offsets, reset=reset), timeout=120
    )
    return reply


def _cases(stub: backlog_pb2_grpc.BacklogServiceStub, partitions: int, n: int) -> list[Sample]:
    job_id = f"grow-{partitions}-{uuid.uuid4().hex[:6]}"
    _mark(stub, job_id, _offsets(range(partitions), BOUNDARY))
    stub.ReportProgress(
        backlog_pb2.ReportProgressRequest(job_id=job_id, positions=_offsets(range(partitions), BASE)),
        timeout=120,
    )
    added = itertools.count(10**6)  # partitions no call named before

    def grow(i: int) -> None:
        p = next(added)
        reply = _mark(stub, job_id, _offsets(range(p, p + 1), BOUNDARY))
        assert len(reply.added) == 1

    def again(i: int) -> None:
        reply = _mark(stub, job_id, _offsets(range(1), 5))
        assert not reply.added

    def reset(i: int) -> None:
        _mark(stub, f"{job_id}-reset", _offsets(range(partitions), BOUNDARY + i), reset=True)

    timed: list[tuple[str, Callable[[int], None]]] = [
        (f"MarkBacklog growing {partitions} by 1 (gRPC)", grow),
        (f"MarkBacklog naming nothing new, {partitions}", again),
        (f"MarkBacklog reset, {partitions}", reset),
    ]
    return [measure(name, n, op, warmup=3) for name, op in timed]


def run(zk_hosts: str, bucket: str, n: int) -> list[tuple[Sample, Sample | None]]:
    run_id = uuid.uuid4().hex[:8]
    coordinator = in_process_coordinator(
        f"zk://{zk_hosts}/bench-{run_id}/coordinator", f"s3://{bucket}/bench-{run_id}/coordinator"
    )
    rows: list[tuple[Sample, Sample | None]] = []
    with (
        coordinator as port,
        grpc.insecure_channel(f"127.0.0.1:{port}", options=LARGE_REPLIES) as channel,
    ):
        stub = backlog_pb2_grpc.BacklogServiceStub(channel)
        # Grows add a partition each: the 10,000-partition job stays under the default limit.
        for partitions, calls in ((10, n), (1000, n), (9_900, max(5, n // 3))):
            rows += [(sample, None) for sample in _cases(stub, partitions, calls)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=30, help="recorded calls per case (n/3 at 10,000)")
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(f"# backlog_grow: n={args.n}; ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}")
        rows = run(zk.hosts, s3.bucket, args.n)
        print_table("MarkBacklog: a grow by one partition, a repeated mark, a reset", rows)


if __name__ == "__main__":
    main()
