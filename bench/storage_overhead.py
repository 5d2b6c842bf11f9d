"""What snapcoord's storage layer and server add on top of the raw ZooKeeper, S3 and gRPC calls.

    bench/run storage_overhead [--n 300]

Each row times one operation through our backend (ZooKeeperMetadataStore, S3BlobStore) or our
server (interceptors, metrics, health) and divides its median by the raw kazoo/boto3/grpc call
measured a moment before in the same run. Single client, sequential, loopback.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from common import Sample, in_process_coordinator, measure, measure_pair, print_table, real_servers
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kazoo.client import KazooClient

from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.local.blob_files import LocalBlobStore
from snapcoord.coordinator.storage.local.embedded import EmbeddedMetadataStore
from snapcoord.coordinator.storage.metadata import Create, SetData

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

PAYLOAD = os.urandom(256)


def bench_zookeeper(hosts: str, n: int) -> list[tuple[Sample, Sample | None]]:
    chroot = f"/bench-{uuid.uuid4().hex[:8]}"
    raw = KazooClient(hosts=hosts)
    raw.start()
    raw.ensure_path(f"{chroot}/raw")
    store = open_metadata_store(f"zk://{hosts}{chroot}")
    store.ensure_path("/ours")
    try:
        raw_create, our_create = measure_pair(
            "kazoo create",
            lambda i: raw.create(f"{chroot}/raw/c{i}", PAYLOAD),
            "ZooKeeperMetadataStore.create",
            lambda i: store.create(f"/ours/c{i}", PAYLOAD),
            n,
        )
        raw_get, our_get = measure_pair(
            "kazoo get",
            lambda i: raw.get(f"{chroot}/raw/c{max(i, 0)}"),
            "ZooKeeperMetadataStore.get",
            lambda i: store.get(f"/ours/c{max(i, 0)}"),
            n,
        )

        def raw_multi(i: int) -> None:
            tx = raw.transaction()
            tx.create(f"{chroot}/raw/m{i}", PAYLOAD)
            tx.set_data(f"{chroot}/raw/c{max(i, 0)}", PAYLOAD)
            tx.commit()

        def our_multi(i: int) -> None:
            store.transaction([Create(f"/ours/m{i}", PAYLOAD), SetData(f"/ours/c{max(i, 0)}", PAYLOAD, -1)])

        raw_tx, our_tx = measure_pair(
            "kazoo multi(create, set_data)",
            raw_multi,
            "ZooKeeperMetadataStore.transaction(2 ops)",
            our_multi,
            n,
        )
    finally:
        store.close()
        raw.delete(chroot, recursive=True)
        raw.stop()
        raw.close()
    return [
        (raw_create, None),
        (our_create, raw_create),
        (raw_get, None),
        (our_get, raw_get),
        (raw_tx, None),
        (our_tx, raw_tx),
    ]


def bench_s3(client: S3Client, bucket: str, n: int) -> list[tuple[Sample, Sample | None]]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    store = open_blob_store(f"s3://{bucket}/{prefix}/ours")
    raw_put, our_put = measure_pair(
        "boto3 put_object 256 B",
        lambda i: client.put_object(Bucket=bucket, Key=f"{prefix}/raw/o{i}", Body=PAYLOAD),
        "S3BlobStore.put 256 B",
        lambda i: store.put(f"o{i}", PAYLOAD),
        n,
    )
    raw_get, our_get = measure_pair(
        "boto3 get_object 256 B",
        lambda i: client.get_object(Bucket=bucket, Key=f"{prefix}/raw/o{max(i, 0)}")["Body"].read(),
        "S3BlobStore.get 256 B",
        lambda i: store.get(f"o{max(i, 0)}"),
        n,
    )
    for info in store.list():
        store.delete(info.key)
    for i in range(-20, n):
        client.delete_object(Bucket=bucket, Key=f"{prefix}/raw/o{i}")
    store.close()
    return [(raw_put, None), (our_put, raw_put), (raw_get, None), (our_get, raw_get)]


def bench_embedded(n: int) -> list[tuple[Sample, Sample | None]]:
    with tempfile.TemporaryDirectory(prefix="snapcoord-bench-embedded-") as tmp:
        meta = EmbeddedMetadataStore(Path(tmp) / "metadata")
        blobs = LocalBlobStore(Path(tmp) / "blobs")
        meta.ensure_path("/ours")
        rows: list[tuple[Sample, Sample | None]] = [
            (measure("EmbeddedMetadataStore.create", n, lambda i: meta.create(f"/ours/c{i}", PAYLOAD)), None),
            (measure("EmbeddedMetadataStore.get", n, lambda i: meta.get(f"/ours/c{max(i, 0)}")), None),
            (measure("LocalBlobStore.put 256 B", n, lambda i: blobs.put(f"o{i}", PAYLOAD)), None),
            (measure("LocalBlobStore.get 256 B", n, lambda i: blobs.get(f"o{max(i, 0)}")), None),
        ]
        meta.close()
        blobs.close()
    return rows


def bench_grpc(zk_hosts: str, bucket: str, n: int) -> list[tuple[Sample, Sample | None]]:
    """Health/Check through the coordinator (interceptors, metrics) vs a bare grpcio echo."""
    raw_server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    echo = grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)
    raw_server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Echo", {"Echo": echo})])
    raw_port = raw_server.add_insecure_port("127.0.0.1:0")
    raw_server.start()

    chroot = f"/bench-{uuid.uuid4().hex[:8]}"
    try:
        with (
            in_process_coordinator(f"zk://{zk_hosts}{chroot}", f"s3://{bucket}/{chroot.strip('/')}") as port,
            grpc.insecure_channel(f"127.0.0.1:{raw_port}") as raw_ch,
            grpc.insecure_channel(f"127.0.0.1:{port}") as ch,
        ):
            call = raw_ch.unary_unary("/bench.Echo/Echo")
            stub = health_pb2_grpc.HealthStub(ch)
            check = health_pb2.HealthCheckRequest()
            raw, ours = measure_pair(
                "grpcio unary echo (bare server)",
                lambda i: call(b"ping", timeout=10),
                "coordinator Health/Check",
                lambda i: stub.Check(check, timeout=10),
                n,
            )
    finally:
        raw_server.stop(None).wait()
    return [(raw, None), (ours, raw)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=300, help="recorded calls per operation (default 300)")
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(f"# storage_overhead: n={args.n} per operation; ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}")
        print_table("ZooKeeper metadata store vs raw kazoo", bench_zookeeper(zk.hosts, args.n))
        print_table("S3 blob store vs raw boto3", bench_s3(s3.client(), s3.bucket, args.n))
        print_table("gRPC server overhead", bench_grpc(zk.hosts, s3.bucket, args.n))
        print_table("embedded defaults (absolute; no raw baseline)", bench_embedded(args.n))


if __name__ == "__main__":
    main()
