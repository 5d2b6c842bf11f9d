"""``--health-port``: the plaintext health-only listener that Kubernetes probes use under mutual TLS.

Against a real ``snapcoord serve`` requiring client certificates: a probe without any certificate
(the Python health stub, the ``snapcoord health`` CLI, and grpcurl, a Go gRPC client like kubelet's
probe) gets SERVING from the health port; the gRPC port still refuses a client without a
certificate; and the health port answers nothing but grpc.health.v1 (no API, no reflection).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.access import Pki, principals, tls_channel, write_auth_file
from harness.coordinator import CoordinatorProcess, coordinator_config, embedded_deps, snapcoord_command
from snapcoord.coordinator import api
from snapcoord.coordinator.server.app import build_server
from snapcoord.v1 import producer_pb2, producer_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
def mtls_process(tmp_path: Path, pki: Pki) -> Iterator[CoordinatorProcess]:
    """``snapcoord serve`` with mutual TLS, an auth file and ``--health-port 0``."""
    auth = write_auth_file(tmp_path / "auth.json", principals())
    ops = pki.ca.issue(pki.directory, "ops-probe", client=True, dns_names=(), ips=())
    args = [
        "--tls-cert", str(pki.server.cert),
        "--tls-key", str(pki.server.key),
        "--tls-client-ca", str(pki.ca.pem_path),
        "--auth-file", str(auth),
        "--health-port", "0",
    ]  # fmt: skip
    # The harness's own readiness check goes to the gRPC port, so it needs a client certificate.
    credentials = grpc.ssl_channel_credentials(pki.ca.pem, ops.key_pem, ops.cert_pem)
    with CoordinatorProcess(tmp_path / "coordinator", args=args, health_credentials=credentials) as process:
        assert process.health_port is not None and process.health_port != process.grpc_port
        yield process


def _health_target(process: CoordinatorProcess) -> str:
    return f"127.0.0.1:{process.health_port}"


@pytest.mark.process
def test_a_probe_without_a_certificate_gets_serving_from_the_health_port(
    mtls_process: CoordinatorProcess,
) -> None:
    with grpc.insecure_channel(_health_target(mtls_process)) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", *api.SERVICE_NAMES):  # what the manifests' probes may ask for
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert reply.status == SERVING, service
    # `snapcoord health` without any TLS variable: what an exec probe would run.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCOORD_")}
    done = subprocess.run(
        [*snapcoord_command(), "health", "--target", _health_target(mtls_process), "--timeout", "30s"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SERVING" in done.stdout


@pytest.mark.process
def test_grpcurl_like_kubelet_gets_serving_in_plaintext(
    mtls_process: CoordinatorProcess, tmp_path: Path
) -> None:
    grpcurl = Path(sys.executable).parent / "grpcurl"
    binary = str(grpcurl) if grpcurl.exists() else shutil.which("grpcurl")
    assert binary, "grpcurl is not installed: run scripts/install-test-deps"
    # The health port has no reflection, so grpcurl gets the health proto from a protoset, as
    # kubelet's probe has it compiled in.
    protoset = tmp_path / "health.protoset"
    files = descriptor_pb2.FileDescriptorSet()
    health_pb2.DESCRIPTOR.CopyToProto(files.file.add())
    protoset.write_bytes(files.SerializeToString())
    done = subprocess.run(
        [binary, "-plaintext", "-protoset", str(protoset), "-max-time", "30", "-d", '{"service": ""}',
         _health_target(mtls_process), "grpc.health.v1.Health/Check"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {"status": "SERVING"}


@pytest.mark.process
def test_the_grpc_port_still_refuses_a_client_without_a_certificate(
    mtls_process: CoordinatorProcess, pki: Pki
) -> None:
    for channel in (
        tls_channel(mtls_process.target, ca=pki.ca.pem),
        grpc.insecure_channel(mtls_process.target),
    ):
        with channel, pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNAVAILABLE
    # ... while a client with a certificate of the CA is served (the fixture's check did the same).
    driver = pki.ca.issue(pki.directory, "team-a-driver", client=True, dns_names=(), ips=())
    with tls_channel(mtls_process.target, ca=pki.ca.pem, client=driver) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert reply.status == SERVING


@pytest.mark.process
def test_the_health_port_serves_nothing_but_health(mtls_process: CoordinatorProcess) -> None:
    with grpc.insecure_channel(_health_target(mtls_process)) as channel:
        # An API call, which the gRPC port would authorise: unknown here.
        with pytest.raises(grpc.RpcError) as e:
            producer_pb2_grpc.ProducerOffsetServiceStub(channel).GetProducerOffsets(
                producer_pb2.GetProducerOffsetsRequest(producer_id="team-a-sink"), timeout=30
            )
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # Reflection (which would list the API) is not there either.
        reflection = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        with pytest.raises(grpc.RpcError) as e:
            list(reflection(iter([b"\x3a\x00"]), timeout=30))  # list_services = ""
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # A service the server does not have: NOT_FOUND, as on the gRPC port.
        with pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30
            )
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_taken_health_port_fails_the_build(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with embedded_deps(tmp_path) as deps, pytest.raises(OSError, match="health port"):
            build_server(coordinator_config(health_port=str(port)), deps)


def test_the_health_port_says_not_serving_once_the_drain_starts_and_closes_after_it(
    tmp_path: Path,
) -> None:
    with embedded_deps(tmp_path) as deps:
        server, _ = build_server(coordinator_config(health_port="0"), deps)
        server.start()
        try:
            assert server.health_port is not None
            target = f"127.0.0.1:{server.health_port}"
            with grpc.insecure_channel(target) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                assert stub.Check(health_pb2.HealthCheckRequest(), timeout=30).status == SERVING
                server.health.enter_graceful_shutdown()  # the first step of shutdown()
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
                assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            server.shutdown(0)
        with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as e:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNAVAILABLE
