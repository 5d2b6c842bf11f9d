"""TLS to ZooKeeper's secure client port (--zk-tls-*), against the Debian ZooKeeper with Netty,
requiring client certificates."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.certs import CertificateAuthority, Pair
from harness.zookeeper import ZooKeeperServer, ZooKeeperTls
from snapcoord.coordinator.errors import StoreUnavailable
from snapcoord.coordinator.storage.backends import MetadataOptions, open_metadata_store

pytestmark = pytest.mark.zookeeper


@dataclass(frozen=True)
class TlsZooKeeper:
    server: ZooKeeperServer
    ca: CertificateAuthority
    other_ca: CertificateAuthority
    client: Pair

    @property
    def secure_uri(self) -> str:
        return f"zk://127.0.0.1:{self.server.secure_port}/tls-test"


@pytest.fixture
def tls_zookeeper(tmp_path: Path) -> Iterator[TlsZooKeeper]:
    pki = tmp_path / "pki"
    ca = CertificateAuthority.create(pki, "zk")
    other = CertificateAuthority.create(pki, "other")
    server_pair = ca.issue(pki, "zookeeper", file_stem="zk-server")
    keystore = pki / "zk-keystore.pem"
    keystore.write_bytes(server_pair.key_pem + server_pair.cert_pem)
    client = ca.issue(pki, "snapcoord", client=True, dns_names=(), ips=(), file_stem="zk-client")
    server = ZooKeeperServer(tmp_path / "zk", tls=ZooKeeperTls(keystore, ca.pem_path))
    with server:
        yield TlsZooKeeper(server, ca, other, client)


def _options(zk: TlsZooKeeper, ca: CertificateAuthority, *, client: bool = True) -> MetadataOptions:
    return MetadataOptions(
        zk_connect_timeout_ms=5_000,
        zk_tls_ca=str(ca.pem_path),
        zk_tls_cert=str(zk.client.cert) if client else "",
        zk_tls_key=str(zk.client.key) if client else "",
    )


def test_the_store_works_over_zookeeper_tls(tls_zookeeper: TlsZooKeeper) -> None:
    store = open_metadata_store(tls_zookeeper.secure_uri, options=_options(tls_zookeeper, tls_zookeeper.ca))
    try:
        store.create("/records/a", b"payload", make_parents=True)
        node = store.get("/records/a")
        assert node is not None and node.data == b"payload"
    finally:
        store.close()


def test_plaintext_to_the_tls_port_fails(tls_zookeeper: TlsZooKeeper) -> None:
    with pytest.raises(StoreUnavailable):
        open_metadata_store(tls_zookeeper.secure_uri, options=MetadataOptions(zk_connect_timeout_ms=3_000))


def test_a_zookeeper_certificate_from_another_ca_fails(tls_zookeeper: TlsZooKeeper) -> None:
    with pytest.raises(StoreUnavailable):
        open_metadata_store(tls_zookeeper.secure_uri, options=_options(tls_zookeeper, tls_zookeeper.other_ca))


def test_without_a_client_certificate_the_ensemble_refuses(tls_zookeeper: TlsZooKeeper) -> None:
    with pytest.raises(StoreUnavailable):
        open_metadata_store(
            tls_zookeeper.secure_uri, options=_options(tls_zookeeper, tls_zookeeper.ca, client=False)
        )
