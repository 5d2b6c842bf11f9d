"""RegisterProducerOffsets and GetProducerOffsets against the raw ZooKeeper + S3 work they wrap.

    bench/run producer_offsets [--n 300] [--offsets 10]

A registration is one S3 put (the offsets payload) plus one ZooKeeper transaction (record and
expiry index entry); a read is one ZooKeeper get plus one S3 get. Each RPC is timed through a real
gRPC channel to an in-process coordinator on real servers, interleaved call by call with the raw
kazoo create + boto3 put (or kazoo get + boto3 get) of the same payload, and reported as a ratio.
"""

from __future__ import annotations

import argparse
import os
import uuid
from typing import TYPE_CHECKING

import grpc
from common import Sample, in_process_coordinator, measure_pair, print_table, real_servers
from kazoo.client import KazooClient

from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def run(
    zk_hosts: str, s3: S3Client, bucket: str, n: int, n_offsets: int
) -> list[tuple[Sample, Sample | None]]:
    run_id = uuid.uuid4().hex[:8]
    chroot = f"/bench-{run_id}"
    raw_zk = KazooClient(hosts=zk_hosts)
    raw_zk.start()
    raw_zk.ensure_path(f"{chroot}/raw")
    coordinator = in_process_coordinator(
        f"zk://{zk_hosts}{chroot}/coordinator", f"s3://{bucket}/bench-{run_id}/coordinator"
    )
    offsets = [
        common_pb2.Offset(stream="orders", partition=p, offset=1_000_000 + p) for p in range(n_offsets)
    ]
    payload = producer_pb2.ProducerSnapshot(offsets=offsets).SerializeToString()  # a same-size raw payload
    try:
        with coordinator as port, grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)

            def raw_register(i: int) -> None:
                s3.put_object(Bucket=bucket, Key=f"bench-{run_id}/raw/{i}.json", Body=payload)
                raw_zk.create(f"{chroot}/raw/p{i}", b'{"object_key":"x"}')

            def our_register(i: int) -> None:
                request = producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"p{i}", offsets=offsets)
                assert stub.RegisterProducerOffsets(request, timeout=30).registered

            def raw_get(i: int) -> None:
                raw_zk.get(f"{chroot}/raw/p{max(i, 0)}")
                s3.get_object(Bucket=bucket, Key=f"bench-{run_id}/raw/{max(i, 0)}.json")["Body"].read()

            def our_get(i: int) -> None:
                stub.GetProducerOffsets(
                    producer_pb2.GetProducerOffsetsRequest(producer_id=f"p{max(i, 0)}"), timeout=30
                )

            raw_reg, ours_reg = measure_pair(
                "raw kazoo create + boto3 put",
                raw_register,
                "RegisterProducerOffsets (gRPC)",
                our_register,
                n,
            )
            raw_read, ours_read = measure_pair(
                "raw kazoo get + boto3 get", raw_get, "GetProducerOffsets (gRPC)", our_get, n
            )
    finally:
        raw_zk.delete(chroot, recursive=True)
        raw_zk.stop()
        raw_zk.close()
    return [(raw_reg, None), (ours_reg, raw_reg), (raw_read, None), (ours_read, raw_read)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="recorded calls per operation (default 300)")
    parser.add_argument("--offsets", type=int, default=10, help="offsets per registration (default 10)")
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(
            f"# producer_offsets: n={args.n}, {args.offsets} offsets per call; "
            f"ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}"
        )
        print_table(
            "producer offsets vs the raw ZooKeeper + S3 operations",
            run(zk.hosts, s3.client(), s3.bucket, args.n, args.offsets),
        )


if __name__ == "__main__":
    main()
