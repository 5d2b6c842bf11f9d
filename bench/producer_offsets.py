"""RegisterProducerOffsets, GetProducerOffsets and AdvanceProducerOffsets against the raw
ZooKeeper + S3 work they wrap.

    bench/run producer_offsets [--n 300] [--offsets 10] [--spaced 0]

A registration is one S3 put (the offsets payload) plus one ZooKeeper transaction (record and
expiry index entry); a read is one ZooKeeper get plus one S3 get. An advance (``exactly_once``'s
call per batch: drop batch N-1's record, register batch N's) of offsets small enough to live in
the record is one ZooKeeper transaction when this process wrote N-1's record; its raw bound is one
kazoo transaction deleting one node and creating the next; beside it, the same call through a
second coordinator that did not write N-1's record (it reads both records first, as every advance
did before) and, with ``--spaced``, both kinds 0.5 s apart, as batches come. Each RPC is timed
through a real gRPC channel to an in-process coordinator on real servers, interleaved call by call
with the raw work (or the other kind of call) on the same payload, and reported as a ratio.
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

from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def run(
    zk_hosts: str, s3: S3Client, bucket: str, n: int, n_offsets: int, spaced: int
) -> list[tuple[Sample, Sample | None]]:
    run_id = uuid.uuid4().hex[:8]
    chroot = f"/bench-{run_id}"
    raw_zk = KazooClient(hosts=zk_hosts)
    raw_zk.start()
    raw_zk.ensure_path(f"{chroot}/raw")
    blobs = f"s3://{bucket}/bench-{run_id}/coordinator"
    coordinator = in_process_coordinator(f"zk://{zk_hosts}{chroot}/coordinator", blobs)
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
            with (
                in_process_coordinator(f"zk://{zk_hosts}{chroot}/coordinator", blobs) as other_port,
                grpc.insecure_channel(f"127.0.0.1:{other_port}") as other_channel,
            ):
                elsewhere = producer_pb2_grpc.ProducerOffsetServiceStub(other_channel)
                advances = measure_advance(stub, elsewhere, raw_zk, f"{chroot}/raw-advance", n, spaced)
    finally:
        raw_zk.delete(chroot, recursive=True)
        raw_zk.stop()
        raw_zk.close()
    return [(raw_reg, None), (ours_reg, raw_reg), (raw_read, None), (ours_read, raw_read), *advances]


class Chain:
    """One query's batches: ``step()`` advances to the next batch through ``stubs[batch % len]``.
    With two stubs (two coordinators on the same stores) every advance goes through the one that
    did not write the previous record: it has no copy of it, and reads both records first."""

    def __init__(self, name: str, stubs: list[producer_pb2_grpc.ProducerOffsetServiceStub]) -> None:
        self.name = name
        self.stubs = stubs
        self.batch = 0
        first = producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"{name}.b0", offsets=BATCH_OFFSETS)
        assert stubs[0].RegisterProducerOffsets(first, timeout=30).registered

    def step(self, _: int = 0) -> None:
        self.batch += 1
        request = producer_pb2.AdvanceProducerOffsetsRequest(
            producer_id=f"{self.name}.b{self.batch}",
            offsets=BATCH_OFFSETS,
            previous_producer_id=f"{self.name}.b{self.batch - 1}",
        )
        response = self.stubs[self.batch % len(self.stubs)].AdvanceProducerOffsets(request, timeout=30)
        assert response.registered and response.previous_deleted


#: One sink position, as ``exactly_once`` registers per batch (inline: no S3 call).
BATCH_OFFSETS = [common_pb2.Offset(stream="orders", partition=0, offset=1_000_000)]


def measure_advance(
    here: producer_pb2_grpc.ProducerOffsetServiceStub,
    elsewhere: producer_pb2_grpc.ProducerOffsetServiceStub,
    raw_zk: KazooClient,
    raw_root: str,
    n: int,
    spaced: int,
) -> list[tuple[Sample, Sample | None]]:
    """``exactly_once``'s call per batch: through the coordinator that wrote the previous batch's
    record (its copy stands in for the read: one ZooKeeper transaction), and through one that did
    not (a read of both records, then the transaction), against one raw delete + create
    transaction; back to back, then ``spaced`` calls of each 0.5 s apart (as batches come)."""
    record = b"x" * 560  # about the stored size of an ``exactly_once`` batch record
    raw_zk.ensure_path(raw_root)
    raw_zk.create(f"{raw_root}/b0", record)
    raw_batch = [0]

    def raw_advance(_: int) -> None:
        raw_batch[0] += 1
        tx = raw_zk.transaction()
        tx.delete(f"{raw_root}/b{raw_batch[0] - 1}")
        tx.create(f"{raw_root}/b{raw_batch[0]}", record)
        results = tx.commit()
        assert not any(isinstance(r, Exception) for r in results), results

    blind, read_first = Chain("q", [here]), Chain("r", [here, elsewhere])
    raw, ours = measure_pair(
        "raw kazoo delete + create transaction", raw_advance, "Advance, previous written here", blind.step, n
    )
    other, again = measure_pair(
        "Advance, previous written elsewhere",
        read_first.step,
        "Advance, previous written here",
        blind.step,
        n,
    )
    rows: list[tuple[Sample, Sample | None]] = [(raw, None), (ours, raw), (other, None), (again, other)]
    if spaced:
        apart: dict[str, list[float]] = {"here": [], "elsewhere": []}
        for _ in range(spaced):
            for side, step in (("here", blind.step), ("elsewhere", read_first.step)):
                time.sleep(0.5)
                start = time.perf_counter()
                step()
                apart[side].append(time.perf_counter() - start)
        far = Sample("Advance 0.5 s apart, previous elsewhere", apart["elsewhere"])
        rows += [(far, None), (Sample("Advance 0.5 s apart, previous here", apart["here"]), far)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="recorded calls per operation (default 300)")
    parser.add_argument("--offsets", type=int, default=10, help="offsets per registration (default 10)")
    parser.add_argument(
        "--spaced", type=int, default=0, help="advances of each kind 0.5 s apart, as batches come (default 0)"
    )
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(
            f"# producer_offsets: n={args.n}, {args.offsets} offsets per call; "
            f"ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}"
        )
        print_table(
            "producer offsets vs the raw ZooKeeper + S3 operations",
            run(zk.hosts, s3.client(), s3.bucket, args.n, args.offsets, args.spaced),
        )


if __name__ == "__main__":
    main()
