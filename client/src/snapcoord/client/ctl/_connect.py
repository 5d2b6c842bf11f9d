"""The ``CoordinatorClient`` a command talks through, from the connection options.

Each TLS setting comes from its flag, else from the client's own variable (``SNAPCOORD_CLIENT_CA``,
``_CERT``, ``_KEY``, ``_SERVER_NAME``), so a shell set up for the client needs no flags and a flag
changes one setting only. The token comes from ``--token-file``, else from ``SNAPCOORD_TOKEN`` or
``SNAPCOORD_TOKEN_FILE`` as the client reads them. A file that cannot be read, or a certificate
without its key, is a usage error naming the flag or variable it came from.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from snapcoord.client import _env
from snapcoord.client._channel import TlsConfig
from snapcoord.client.client import CoordinatorClient


class UsageError(ValueError):
    """The options cannot make a client; the message says which one and why."""


def _setting(args: argparse.Namespace, flag: str, variable: str, env: Mapping[str, str]) -> tuple[str, str]:
    """(value, where it came from) of one setting; ("", "") when neither the flag nor the variable is set."""
    value = getattr(args, flag.removeprefix("--").replace("-", "_"))
    if value:
        return value, flag
    value = env.get(variable) or ""
    return (value, variable) if value else ("", "")


def tls_config(args: argparse.Namespace, env: Mapping[str, str]) -> TlsConfig | None:
    """TLS from the flags and the client's variables; None (plaintext) when none is set."""
    ca, cert, key, name = (
        _setting(args, flag, variable, env)
        for flag, variable in (
            ("--ca", _env.CLIENT_CA),
            ("--cert", _env.CLIENT_CERT),
            ("--key", _env.CLIENT_KEY),
            ("--server-name", _env.CLIENT_SERVER_NAME),
        )
    )
    if bool(cert[0]) != bool(key[0]):
        given = cert[1] or key[1]
        raise UsageError(f"{given} needs its pair: a client certificate and key go together (--cert, --key)")
    if not (ca[0] or cert[0] or name[0]):
        return None
    files = {}
    for what, (path, source) in (("ca", ca), ("cert", cert), ("key", key)):
        try:
            files[what] = Path(path).read_bytes() if path else None
        except OSError as e:
            raise UsageError(f"{source} {path}: cannot read it: {e.strerror or e}") from None
    return TlsConfig(files["ca"], files["key"], files["cert"], name[0] or None)


def token(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """The bearer token: ``--token-file``'s, else the client's variables'; None for no token."""
    try:
        if args.token_file:
            return _env.read_token_file(args.token_file, f"--token-file {args.token_file}")
        return _env.token_from_env(env)
    except ValueError as e:
        raise UsageError(str(e)) from None


def connect(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> CoordinatorClient:
    """A client on ``args.target`` with the resolved TLS and token; ``UsageError`` when it cannot be made."""
    environ = os.environ if env is None else env
    tls, bearer = tls_config(args, environ), token(args, environ)
    try:
        return CoordinatorClient(args.target, timeout_s=args.timeout, tls=tls, token=bearer)
    except ValueError as e:
        raise UsageError(f"--target {args.target!r}: {e}") from None
