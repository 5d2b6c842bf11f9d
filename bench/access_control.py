"""The cost of TLS and of token checks on RPC latency, against plaintext in the same run.

    bench/run access_control [--n 300]

Four coordinators on the same real ZooKeeper and S3 (each on its own chroot and prefix): plaintext
and no access control; TLS; TLS with a bearer token checked against an auth file (a writer scoped
to an id prefix, so the scope check runs too); mutual TLS with the principal from the client
certificate. Each is called through one long-lived channel (as a driver does: the handshake is
paid once per connection, not per call), and the four are interleaved call by call so that drift
in the servers hits all of them alike. GetCurrentSnapshot is answered from the coordinator's cache,
so it shows the fixed per-call cost best; RegisterProducerOffsets writes S3 and ZooKeeper.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc
from common import Sample, in_process_coordinator, print_table, real_servers

from harness.certs import CertificateAuthority
from snapcoord.coordinator.auth.authfile import token_sha256
from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc, snapshot_pb2, snapshot_pb2_grpc

TOKEN = "bench-token-0123456789abcdef"
Metadata = tuple[tuple[str, str], ...]


def _auth_file(directory: Path) -> Path:
    scopes = {kind: ["bench-"] for kind in ("producer_id", "app_id", "lease_id", "job_id")}
    path = directory / "auth.json"
    entry = {"name": "bench", "role": "writer", "token_sha256": token_sha256(TOKEN), "cert": "bench-driver"}
    path.write_text(json.dumps({"principals": [{**entry, "scopes": scopes}]}))
    return path


@contextmanager
def _modes(zk_hosts: str, bucket: str, directory: Path) -> Iterator[dict[str, tuple[grpc.Channel, Metadata]]]:
    """mode name -> a channel to a coordinator serving that mode, and the metadata of each call."""
    ca = CertificateAuthority.create(directory, "bench")
    server = ca.issue(directory, "coordinator", file_stem="server")
    client = ca.issue(directory, "bench-driver", client=True, dns_names=(), ips=())
    auth = _auth_file(directory)
    tls = {"tls_cert": str(server.cert), "tls_key": str(server.key)}
    flags: dict[str, dict[str, str]] = {
        "plaintext": {},
        "TLS": tls,
        "TLS + token": {**tls, "auth_file": str(auth)},
        "TLS + token (header)": {**tls, "auth_file": str(auth)},
        "mTLS + auth file": {**tls, "tls_client_ca": str(ca.pem_path), "auth_file": str(auth)},
    }
    run_id = uuid.uuid4().hex[:8]
    with ExitStack() as stack:
        channels: dict[str, tuple[grpc.Channel, Metadata]] = {}
        for i, (mode, mode_flags) in enumerate(flags.items()):
            port = stack.enter_context(
                in_process_coordinator(
                    f"zk://{zk_hosts}/bench-{run_id}/m{i}", f"s3://{bucket}/bench-{run_id}/m{i}", **mode_flags
                )
            )
            target = f"127.0.0.1:{port}"
            if mode == "plaintext":
                channel = grpc.insecure_channel(target)
            else:
                mutual = "tls_client_ca" in mode_flags
                creds = grpc.ssl_channel_credentials(
                    root_certificates=ca.pem,
                    private_key=client.key_pem if mutual else None,
                    certificate_chain=client.cert_pem if mutual else None,
                )
                if mode == "TLS + token":  # as the Python client sends it over TLS
                    creds = grpc.composite_channel_credentials(
                        creds, grpc.access_token_call_credentials(TOKEN)
                    )
                channel = grpc.secure_channel(target, creds)
            stack.callback(channel.close)
            # The same token as a plain header: the server's work is the same, without the client's
            # call-credentials plugin (which grpc runs per call on a thread of its own).
            metadata: Metadata = (("authorization", f"Bearer {TOKEN}"),) if mode.endswith("(header)") else ()
            channels[mode] = (channel, metadata)
        yield channels


def measure_interleaved(
    ops: dict[str, Callable[[int], object]], n: int, *, warmup: int = 20
) -> dict[str, Sample]:
    for i in range(warmup):
        for op in ops.values():
            op(-1 - i)
    latencies: dict[str, list[float]] = {name: [] for name in ops}
    for i in range(n):
        for name, op in ops.items():
            start = time.perf_counter()
            op(i)
            latencies[name].append(time.perf_counter() - start)
    return {name: Sample(name, values) for name, values in latencies.items()}


def run(zk_hosts: str, bucket: str, n: int) -> list[tuple[Sample, Sample | None]]:
    offsets = [common_pb2.Offset(stream="orders", partition=p, offset=1_000 + p) for p in range(10)]
    rows: list[tuple[Sample, Sample | None]] = []
    with (
        tempfile.TemporaryDirectory(prefix="snapcoord-bench-auth-") as tmp,
        _modes(zk_hosts, bucket, Path(tmp)) as channels,
    ):
        get_ops: dict[str, Callable[[int], object]] = {}
        register_ops: dict[str, Callable[[int], object]] = {}
        for mode, (channel, metadata) in channels.items():
            snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
            producers = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
            get_request = snapshot_pb2.GetCurrentSnapshotRequest(app_id="bench-app")

            def get(
                i: int,
                stub: snapshot_pb2_grpc.SnapshotServiceStub = snapshots,
                request: snapshot_pb2.GetCurrentSnapshotRequest = get_request,
                metadata: Metadata = metadata,
            ) -> None:
                stub.GetCurrentSnapshot(request, timeout=30, metadata=metadata)

            def register(
                i: int,
                stub: producer_pb2_grpc.ProducerOffsetServiceStub = producers,
                metadata: Metadata = metadata,
            ) -> None:
                request = producer_pb2.RegisterProducerOffsetsRequest(
                    producer_id=f"bench-p{i}", offsets=offsets
                )
                assert stub.RegisterProducerOffsets(request, timeout=30, metadata=metadata).registered

            get_ops[f"GetCurrentSnapshot, {mode}"] = get
            register_ops[f"RegisterProducerOffsets, {mode}"] = register
        for ops in (get_ops, register_ops):
            samples = list(measure_interleaved(ops, n).values())
            baseline = samples[0]
            rows.append((baseline, None))
            rows.extend((sample, baseline) for sample in samples[1:])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--n", type=int, default=300, help="recorded calls per operation and mode (default 300)"
    )
    args = parser.parse_args()
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        print(f"# access_control: n={args.n}; ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}")
        print_table(
            "TLS and token checks vs plaintext (ratio: vs the plaintext row above)",
            run(zk.hosts, s3.bucket, args.n),
        )


if __name__ == "__main__":
    main()
