"""Credentials from the environment, so a program (or a Spark driver) that builds its client from an
address alone still authenticates: the deployment sets the variables, the code does not change.

- ``SNAPCOORD_TOKEN``: a bearer token; or ``SNAPCOORD_TOKEN_FILE``: a file holding one (first
  line; a mounted Kubernetes secret). Both set is an error: which one is meant?
- ``SNAPCOORD_CLIENT_CA``: PEM bundle that signs the coordinator's certificate; setting it (or a
  client certificate) switches the client to TLS.
- ``SNAPCOORD_CLIENT_CERT`` / ``SNAPCOORD_CLIENT_KEY``: PEM certificate and key for mutual TLS.
- ``SNAPCOORD_CLIENT_SERVER_NAME``: the name checked against the server certificate, when the
  address is not one it names.

The names differ from the coordinator's ``SNAPCOORD_TLS_*`` so one shell can run both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from snapcoord.client._channel import TlsConfig

TOKEN = "SNAPCOORD_TOKEN"
TOKEN_FILE = "SNAPCOORD_TOKEN_FILE"
CLIENT_CA = "SNAPCOORD_CLIENT_CA"
CLIENT_CERT = "SNAPCOORD_CLIENT_CERT"
CLIENT_KEY = "SNAPCOORD_CLIENT_KEY"
CLIENT_SERVER_NAME = "SNAPCOORD_CLIENT_SERVER_NAME"


def token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    token, path = env.get(TOKEN) or None, env.get(TOKEN_FILE) or None
    if token and path:
        raise ValueError(f"both {TOKEN} and {TOKEN_FILE} are set; set one")
    if path:
        return read_token_file(path, f"{TOKEN_FILE}={path}")
    return token.strip() if token else None


def read_token_file(path: str, source: str) -> str:
    """The token on the first line of ``path``; ``source`` names where the path came from (a
    variable, a flag) in the ValueError raised for an unreadable or empty file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise ValueError(f"{source}: cannot read it: {e.strerror or e}") from None
    token = lines[0].strip() if lines else ""
    if not token:
        raise ValueError(f"{source}: the file is empty")
    return token


def tls_from_env(environ: Mapping[str, str] | None = None) -> TlsConfig | None:
    env = os.environ if environ is None else environ
    ca, cert, key = (env.get(n) or None for n in (CLIENT_CA, CLIENT_CERT, CLIENT_KEY))
    if bool(cert) != bool(key):
        raise ValueError(f"{CLIENT_CERT} and {CLIENT_KEY} go together; set both or neither")
    if not (ca or cert):
        return None
    try:
        return TlsConfig.from_files(ca, key, cert, server_name=env.get(CLIENT_SERVER_NAME) or None)
    except OSError as e:
        raise ValueError(
            f"cannot read a TLS file named by {CLIENT_CA}/{CLIENT_CERT}/{CLIENT_KEY}: {e}"
        ) from None
