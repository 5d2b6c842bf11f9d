"""The Python client against a secured coordinator, with credentials passed or from the environment
(how a Spark driver that builds its client from an address alone authenticates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.access import ADMIN_TOKEN, TEAM_A_TOKEN, Pki, principals, write_auth_file
from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from snapcoord.client import CoordinatorClient, TlsConfig
from snapcoord.client import errors as client_errors
from snapcoord.client._env import tls_from_env, token_from_env
from snapcoord.client._types import Offset

ENV = (
    "SNAPCOORD_TOKEN",
    "SNAPCOORD_TOKEN_FILE",
    "SNAPCOORD_CLIENT_CA",
    "SNAPCOORD_CLIENT_CERT",
    "SNAPCOORD_CLIENT_KEY",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def test_token_and_ca_from_the_environment(
    secured: InProcessCoordinator, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPCOORD_CLIENT_CA", str(pki.ca.pem_path))
    with (
        CoordinatorClient(secured.target, timeout_s=30) as anonymous,
        pytest.raises(client_errors.Unauthenticated),
    ):
        anonymous.get_producer_offsets("team-a-p")
    monkeypatch.setenv("SNAPCOORD_TOKEN", TEAM_A_TOKEN)
    with CoordinatorClient(secured.target, timeout_s=30) as client:
        assert client.register_producer_offsets("team-a-p", [Offset("s", 0, 1)]).registered
        with pytest.raises(client_errors.PermissionDenied):
            client.register_producer_offsets("team-b-p", [Offset("s", 0, 1)])


def test_token_from_a_file(
    secured: InProcessCoordinator, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    monkeypatch.setenv("SNAPCOORD_TOKEN_FILE", str(token_file))
    with CoordinatorClient(secured.target, timeout_s=30, tls=TlsConfig.from_files(pki.ca.pem_path)) as client:
        assert client.register_producer_offsets("anyone-p", [Offset("s", 0, 1)]).registered


def test_explicit_arguments_win_over_the_environment(
    secured: InProcessCoordinator, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SNAPCOORD_TOKEN", "not-a-real-token")
    monkeypatch.setenv("SNAPCOORD_CLIENT_CA", str(pki.other_ca.pem_path))
    tls = TlsConfig.from_files(pki.ca.pem_path)
    with CoordinatorClient(secured.target, timeout_s=30, tls=tls, token=ADMIN_TOKEN) as client:
        assert client.register_producer_offsets("x-p", [Offset("s", 0, 1)]).registered


def test_mutual_tls_files_from_the_environment(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    auth = write_auth_file(tmp_path / "auth.json", principals())
    team_a = pki.ca.issue(pki.directory, "team-a-driver", client=True, dns_names=(), ips=())
    monkeypatch.setenv("SNAPCOORD_CLIENT_CA", str(pki.ca.pem_path))
    monkeypatch.setenv("SNAPCOORD_CLIENT_CERT", str(team_a.cert))
    monkeypatch.setenv("SNAPCOORD_CLIENT_KEY", str(team_a.key))
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(
            deps,
            tls_cert=str(pki.server.cert),
            tls_key=str(pki.server.key),
            tls_client_ca=str(pki.ca.pem_path),
            auth_file=str(auth),
        ) as server,
        CoordinatorClient(server.target, timeout_s=30) as client,
    ):
        assert client.register_producer_offsets("team-a-p", [Offset("s", 0, 1)]).registered
        with pytest.raises(client_errors.PermissionDenied):
            client.delete_producer_offsets("team-b-p")


def test_environment_mistakes_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set one"):
        token_from_env({"SNAPCOORD_TOKEN": "a", "SNAPCOORD_TOKEN_FILE": "/x"})
    with pytest.raises(ValueError, match="cannot read it"):
        token_from_env({"SNAPCOORD_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        token_from_env({"SNAPCOORD_TOKEN_FILE": str(tmp_path / "empty")})
    with pytest.raises(ValueError, match="go together"):
        tls_from_env({"SNAPCOORD_CLIENT_CERT": "/x"})
    assert tls_from_env({}) is None and token_from_env({}) is None


def test_the_health_probe_speaks_tls_with_the_client_variables(
    secured: InProcessCoordinator, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    from snapcoord.coordinator.server.probe import check

    code, report = check(secured.target, timeout_s=30)
    assert code == 1, report  # plaintext against TLS
    monkeypatch.setenv("SNAPCOORD_CLIENT_CA", str(pki.ca.pem_path))
    assert check(secured.target, timeout_s=30) == (0, f"{secured.target}: SERVING")
