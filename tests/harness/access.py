"""Access-control test helpers: principals and their tokens, auth files, TLS channels."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from harness.certs import CertificateAuthority, Pair
from snapcoord.coordinator.auth.authfile import token_sha256

#: Tokens of the principals of ``write_auth_file``; the file holds only their hashes.
ADMIN_TOKEN = "admin-token-0123456789"
TEAM_A_TOKEN = "team-a-token-0123456789"
TEAM_B_TOKEN = "team-b-token-0123456789"
READER_TOKEN = "reader-token-0123456789"


def team_scopes(prefix: str) -> dict[str, list[str]]:
    return {kind: [prefix] for kind in ("producer_id", "app_id", "lease_id", "job_id", "table_id")}


def principals() -> list[dict[str, Any]]:
    return [
        {"name": "ops", "role": "admin", "token_sha256": token_sha256(ADMIN_TOKEN)},
        {
            "name": "team-a-driver",
            "role": "writer",
            "token_sha256": token_sha256(TEAM_A_TOKEN),
            "cert": "team-a-driver",
            "scopes": team_scopes("team-a-"),
        },
        {
            "name": "team-b-driver",
            "role": "writer",
            "token_sha256": token_sha256(TEAM_B_TOKEN),
            "scopes": team_scopes("team-b-"),
        },
        {"name": "dashboard", "role": "reader", "token_sha256": token_sha256(READER_TOKEN)},
    ]


def write_auth_file(path: Path, entries: list[dict[str, Any]]) -> Path:
    """Replace ``path`` atomically (write a sibling, rename), as an operator should."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(json.dumps({"principals": entries}, indent=2))
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class Pki:
    ca: CertificateAuthority
    other_ca: CertificateAuthority
    server: Pair
    directory: Path


def tls_channel(
    target: str,
    *,
    ca: bytes | None,
    client: Pair | None = None,
    token: str | None = None,
) -> grpc.Channel:
    """A fresh TLS channel (its own connection: no subchannel sharing between tests' channels)."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )
    if token is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(target, creds, options=[("grpc.use_local_subchannel_pool", 1)])
