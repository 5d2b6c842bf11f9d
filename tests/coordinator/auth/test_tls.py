"""TLS and mutual TLS on the gRPC port with real certificates, and rotation without a restart."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.access import TEAM_A_TOKEN, Pki, principals, tls_channel, write_auth_file
from harness.certs import Pair, expired_window
from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from harness.process import wait_until
from snapcoord.coordinator.auth.audit import LOGGER_NAME
from snapcoord.v1 import producer_pb2, producer_pb2_grpc, snapshot_pb2, snapshot_pb2_grpc


def _health(channel: grpc.Channel) -> int:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    return int(reply.status)


def _fails(channel: grpc.Channel) -> grpc.StatusCode:
    """The code of a health check that must fail (at the handshake: no credentials involved)."""
    try:
        with pytest.raises(grpc.RpcError) as e:
            _health(channel)
    finally:
        channel.close()
    assert isinstance(e.value, grpc.Call)
    return e.value.code()


@pytest.fixture
def tls_server(tmp_path: Path, pki: Pki) -> Iterator[InProcessCoordinator]:
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, tls_cert=str(pki.server.cert), tls_key=str(pki.server.key)) as server,
    ):
        yield server


def test_tls_serves_a_client_that_trusts_the_ca(tls_server: InProcessCoordinator, pki: Pki) -> None:
    channel = tls_channel(tls_server.target, ca=pki.ca.pem)
    assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
    channel.close()


def test_a_plaintext_client_cannot_talk_to_a_tls_server(tls_server: InProcessCoordinator) -> None:
    assert _fails(grpc.insecure_channel(tls_server.target)) == grpc.StatusCode.UNAVAILABLE


def test_a_client_that_trusts_another_ca_fails(tls_server: InProcessCoordinator, pki: Pki) -> None:
    assert _fails(tls_channel(tls_server.target, ca=pki.other_ca.pem)) == grpc.StatusCode.UNAVAILABLE


def test_an_expired_server_certificate_fails(tmp_path: Path, pki: Pki) -> None:
    start, end = expired_window()
    expired = pki.ca.issue(
        pki.directory, "coordinator", valid_from=start, valid_until=end, file_stem="expired"
    )
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, tls_cert=str(expired.cert), tls_key=str(expired.key)) as server,
    ):
        assert _fails(tls_channel(server.target, ca=pki.ca.pem)) == grpc.StatusCode.UNAVAILABLE


def test_a_server_certificate_and_key_that_do_not_match_fail_the_start(tmp_path: Path, pki: Pki) -> None:
    other = pki.ca.issue(pki.directory, "other", file_stem="other")
    with (
        embedded_deps(tmp_path) as deps,
        pytest.raises(ValueError, match="do not load as a pair"),
        serve_in_process(deps, tls_cert=str(pki.server.cert), tls_key=str(other.key)),
    ):
        pass


def _replace(pair: Pair, cert: Path, key: Path) -> None:
    """Rotate: new key first, then the certificate, each by rename (as cert-manager or a script would)."""
    for src, dst in ((pair.key_pem, key), (pair.cert_pem, cert)):
        tmp = dst.with_name(dst.name + ".tmp")
        tmp.write_bytes(src)
        os.replace(tmp, dst)


def test_a_certificate_rotated_on_disk_is_served_to_new_connections_without_a_restart(
    tmp_path: Path, pki: Pki
) -> None:
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(pki.server.cert_pem)
    key.write_bytes(pki.server.key_pem)
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, tls_cert=str(cert), tls_key=str(key)) as server,
    ):
        old = tls_channel(server.target, ca=pki.ca.pem)
        assert _health(old) == health_pb2.HealthCheckResponse.SERVING
        assert _fails(tls_channel(server.target, ca=pki.other_ca.pem)) == grpc.StatusCode.UNAVAILABLE

        # The new certificate comes from another CA, so which one a connection got is unambiguous.
        _replace(pki.other_ca.issue(pki.directory, "coordinator", file_stem="rotated"), cert, key)

        def new_certificate_served() -> bool:
            channel = tls_channel(server.target, ca=pki.other_ca.pem)
            try:
                return bool(_health(channel) == health_pb2.HealthCheckResponse.SERVING)
            except grpc.RpcError:
                return False
            finally:
                channel.close()

        wait_until(new_certificate_served, timeout=30, interval=0.1, what="the rotated certificate")
        assert _fails(tls_channel(server.target, ca=pki.ca.pem)) == grpc.StatusCode.UNAVAILABLE
        # The connection made before the rotation keeps working.
        assert _health(old) == health_pb2.HealthCheckResponse.SERVING
        old.close()


# --- mutual TLS ------------------------------------------------------------------------------------


@pytest.fixture
def mtls_server(tmp_path: Path, pki: Pki) -> Iterator[InProcessCoordinator]:
    """Mutual TLS, no auth file: any certificate the CA signed is an (admin) principal."""
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(
            deps,
            tls_cert=str(pki.server.cert),
            tls_key=str(pki.server.key),
            tls_client_ca=str(pki.ca.pem_path),
        ) as server,
    ):
        yield server


def test_mtls_refuses_a_client_without_a_certificate(mtls_server: InProcessCoordinator, pki: Pki) -> None:
    assert _fails(tls_channel(mtls_server.target, ca=pki.ca.pem)) == grpc.StatusCode.UNAVAILABLE


def test_mtls_refuses_a_client_certificate_from_another_ca(
    mtls_server: InProcessCoordinator, pki: Pki
) -> None:
    stranger = pki.other_ca.issue(pki.directory, "stranger", client=True, dns_names=(), ips=())
    channel = tls_channel(mtls_server.target, ca=pki.ca.pem, client=stranger)
    assert _fails(channel) == grpc.StatusCode.UNAVAILABLE


def test_mtls_client_identity_is_the_principal(
    mtls_server: InProcessCoordinator, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    client = pki.ca.issue(pki.directory, "spark-driver-7", client=True, dns_names=(), ips=())
    channel = tls_channel(mtls_server.target, ca=pki.ca.pem, client=client)
    producer_pb2_grpc.ProducerOffsetServiceStub(channel).DeleteProducerOffsets(
        producer_pb2.DeleteProducerOffsetsRequest(producer_id="p"), timeout=30
    )
    channel.close()
    audit = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    assert len(audit) == 1 and " principal=spark-driver-7 " in audit[0], audit


def test_mtls_with_an_auth_file_maps_the_certificate_to_its_principal(tmp_path: Path, pki: Pki) -> None:
    auth = write_auth_file(tmp_path / "auth.json", principals())
    team_a = pki.ca.issue(pki.directory, "team-a-driver", client=True, dns_names=(), ips=())
    unknown = pki.ca.issue(pki.directory, "nobody", client=True, dns_names=(), ips=())
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(
            deps,
            tls_cert=str(pki.server.cert),
            tls_key=str(pki.server.key),
            tls_client_ca=str(pki.ca.pem_path),
            auth_file=str(auth),
        ) as server,
    ):
        channel = tls_channel(server.target, ca=pki.ca.pem, client=team_a)
        snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        # Inside team A's scope: allowed.
        snapshots.GetCurrentSnapshot(snapshot_pb2.GetCurrentSnapshotRequest(app_id="team-a-app"), timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            snapshots.GetCurrentSnapshot(
                snapshot_pb2.GetCurrentSnapshotRequest(app_id="team-b-app"), timeout=30
            )
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        channel.close()

        channel = tls_channel(server.target, ca=pki.ca.pem, client=unknown)
        with pytest.raises(grpc.RpcError) as e:
            snapshot_pb2_grpc.SnapshotServiceStub(channel).GetCurrentSnapshot(
                snapshot_pb2.GetCurrentSnapshotRequest(app_id="team-a-app"), timeout=30
            )
        assert isinstance(e.value, grpc.Call) and e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "'nobody'" in (e.value.details() or "")
        channel.close()

        # A token on top of an unlisted certificate authenticates as the token's principal.
        channel = tls_channel(server.target, ca=pki.ca.pem, client=unknown, token=TEAM_A_TOKEN)
        snapshot_pb2_grpc.SnapshotServiceStub(channel).GetCurrentSnapshot(
            snapshot_pb2.GetCurrentSnapshotRequest(app_id="team-a-app"), timeout=30
        )
        channel.close()


def test_ca_for_clients_is_also_checked_at_start(tmp_path: Path, pki: Pki) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with (
        embedded_deps(tmp_path) as deps,
        pytest.raises(ValueError, match=r"no-such-ca\.pem"),
        serve_in_process(
            deps, tls_cert=str(pki.server.cert), tls_key=str(pki.server.key), tls_client_ca=str(missing)
        ),
    ):
        pass
