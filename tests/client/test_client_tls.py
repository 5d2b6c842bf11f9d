"""TLS (mutual, with certificates made by openssl for the test) and the bearer token, against a bare
grpc server whose LeaseService records what arrives."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from snapcoord.client import CoordinatorClient, RetryPolicy, TlsConfig, Unavailable
from snapcoord.v1 import lease_pb2, lease_pb2_grpc

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, and a server and a client certificate it signed (both valid for DNS:localhost)."""
    d = tmp_path_factory.mktemp("pki")
    ca = "-subj /CN=test-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign"
    openssl("req", "-x509", *EC, *f"-keyout ca.key -out ca.pem -days 2 {ca}".split(), cwd=d)
    for name in ("server", "client"):
        (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost\n")
        openssl("req", *EC, *f"-keyout {name}.key -out {name}.csr -subj /CN={name}".split(), cwd=d)
        sign = f"-in {name}.csr -out {name}.pem -extfile {name}.ext -days 2"
        openssl("x509", "-req", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", *sign.split(), cwd=d)
    return d


class RecordingLeases(lease_pb2_grpc.LeaseServiceServicer):
    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    def GetLease(self, request: lease_pb2.GetLeaseRequest, context: grpc.ServicerContext) -> lease_pb2.Lease:
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata()})
        return lease_pb2.Lease(lease_id=request.lease_id, duration_ms=1000, expires_at_ms=2000)


@pytest.fixture
def servicer() -> RecordingLeases:
    return RecordingLeases()


def _serve(servicer: RecordingLeases, credentials: grpc.ServerCredentials | None) -> tuple[grpc.Server, int]:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    lease_pb2_grpc.add_LeaseServiceServicer_to_server(servicer, server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port


@pytest.fixture
def mtls_port(pki: Path, servicer: RecordingLeases) -> Iterator[int]:
    credentials = grpc.ssl_server_credentials(
        [((pki / "server.key").read_bytes(), (pki / "server.pem").read_bytes())],
        root_certificates=(pki / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server, port = _serve(servicer, credentials)
    yield port
    server.stop(None)


@pytest.mark.process
def test_mutual_tls_with_a_token(pki: Path, mtls_port: int, servicer: RecordingLeases) -> None:
    tls = TlsConfig.from_files(pki / "ca.pem", pki / "client.key", pki / "client.pem")
    assert "PRIVATE KEY" not in repr(tls)
    with CoordinatorClient(f"localhost:{mtls_port}", tls=tls, token="s3cret", timeout_s=10) as client:
        lease = client.get_lease("over-tls")
        assert "s3cret" not in repr(client)
    assert lease.lease_id == "over-tls"
    assert servicer.metadata[-1]["authorization"] == "Bearer s3cret"


@pytest.mark.process
def test_the_server_name_can_be_overridden(pki: Path, mtls_port: int) -> None:
    tls = TlsConfig.from_files(
        pki / "ca.pem", pki / "client.key", pki / "client.pem", server_name="localhost"
    )
    with CoordinatorClient(f"127.0.0.1:{mtls_port}", tls=tls, timeout_s=10) as client:
        assert client.get_lease("by-ip").lease_id == "by-ip"


@pytest.mark.process
def test_a_client_without_its_certificate_is_refused(pki: Path, mtls_port: int) -> None:
    tls = TlsConfig.from_files(pki / "ca.pem")
    no_retry = RetryPolicy(max_attempts=1)
    with (
        CoordinatorClient(f"localhost:{mtls_port}", tls=tls, timeout_s=10, retry=no_retry) as client,
        pytest.raises(Unavailable),
    ):
        client.get_lease("refused")


def test_token_on_a_plaintext_channel(servicer: RecordingLeases) -> None:
    server, port = _serve(servicer, None)
    try:
        with CoordinatorClient(f"127.0.0.1:{port}", token="t0k", timeout_s=10) as client:
            client.get_lease("plain")
        with CoordinatorClient(f"127.0.0.1:{port}", timeout_s=10) as client:
            client.get_lease("anonymous")
    finally:
        server.stop(None)
    assert servicer.metadata[0]["authorization"] == "Bearer t0k"
    assert "authorization" not in servicer.metadata[1]
