"""Fixtures for the access-control tests: a real CA and certificates, a TLS coordinator with an
auth file. Helpers (tokens, principals, channels) are in ``harness.access``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.access import Pki, principals, write_auth_file
from harness.certs import CertificateAuthority
from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    directory = tmp_path / "pki"
    ca = CertificateAuthority.create(directory, "snapcoord-test")
    other = CertificateAuthority.create(directory, "someone-else")
    server = ca.issue(directory, "coordinator", file_stem="server")
    return Pki(ca, other, server, directory)


@pytest.fixture
def secured(tmp_path: Path, pki: Pki) -> Iterator[InProcessCoordinator]:
    """An in-process coordinator with TLS and the auth file of ``principals()``."""
    auth = write_auth_file(tmp_path / "auth.json", principals())
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(
            deps, tls_cert=str(pki.server.cert), tls_key=str(pki.server.key), auth_file=str(auth)
        ) as server,
    ):
        yield server
