"""The auth file (``--auth-file``, YAML or JSON): principals, their credentials, roles and scopes.

    principals:
      - name: team-a-driver
        role: writer                  # reader | writer | admin
        token_sha256: 9f86d0818...    # hex SHA-256 of the bearer token, never the token
        cert: team-a-driver           # a client certificate's subject CN or a SAN (or a list)
        scopes:                       # optional; without it the principal covers every id
          app_id: [team-a-]
          producer_id: [team-a-]

``parse`` is pure (text in, table out, ``AuthFileError`` naming the entry). ``AuthFile`` re-reads
the file when its size, mtime or inode change, checked on use; a change that does not parse is
logged and the previous table stays in force (a typo must not open or close the service), and
a revoked token stops working on the next call after the new file is in place. Write it with a
rename (``mv new auth.yaml``) so a reader never sees it half-written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from snapcoord.coordinator.auth.policy import Kind, Principal, Role

_log = logging.getLogger(__name__)

_HEX64 = re.compile(r"[0-9a-f]{64}")
_KEYS = frozenset({"name", "role", "token_sha256", "cert", "scopes"})


class AuthFileError(ValueError):
    """The auth file cannot be used; the message names the entry and the field."""


@dataclass(frozen=True)
class AuthTable:
    """The principals of one version of the auth file, indexed by credential."""

    by_token_sha256: Mapping[str, Principal]
    by_cert_identity: Mapping[str, Principal]

    def for_token(self, token: str) -> Principal | None:
        return self.by_token_sha256.get(token_sha256(token))

    def for_cert(self, identities: list[str]) -> Principal | None:
        for identity in identities:
            found = self.by_cert_identity.get(identity)
            if found is not None:
                return found
        return None


def token_sha256(token: str) -> str:
    """The hex digest the auth file stores for ``token`` (``printf %s TOKEN | sha256sum``)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def parse(text: str, *, source: str = "auth file") -> AuthTable:
    """The table in ``text`` (YAML, of which JSON is a subset)."""
    try:
        doc = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise AuthFileError(f"{source}: not valid YAML or JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("principals"), list):
        raise AuthFileError(f"{source}: expected a mapping with a 'principals' list")
    tokens: dict[str, Principal] = {}
    certs: dict[str, Principal] = {}
    names: set[str] = set()
    for i, entry in enumerate(doc["principals"]):
        where = f"{source}: principals[{i}]"
        principal, token_hash, identities = _principal(entry, where)
        if principal.name in names:
            raise AuthFileError(f"{where}: name {principal.name!r} is listed twice")
        names.add(principal.name)
        if token_hash is not None:
            if token_hash in tokens:
                raise AuthFileError(
                    f"{where}: its token_sha256 is also {tokens[token_hash].name!r}'s; "
                    "each token names one principal"
                )
            tokens[token_hash] = principal
        for identity in identities:
            if identity in certs:
                raise AuthFileError(f"{where}: cert {identity!r} is also {certs[identity].name!r}'s")
            certs[identity] = principal
    return AuthTable(tokens, certs)


def _principal(entry: Any, where: str) -> tuple[Principal, str | None, list[str]]:
    if not isinstance(entry, dict):
        raise AuthFileError(f"{where}: expected a mapping with name, role and credentials")
    if "token" in entry:
        raise AuthFileError(
            f"{where}: has a 'token' key; store token_sha256 (the hex SHA-256 of the token), never the token"
        )
    unknown = sorted(set(map(str, entry)) - _KEYS)
    if unknown:
        raise AuthFileError(
            f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(_KEYS))}"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise AuthFileError(f"{where}: 'name' must be a non-empty string")
    where = f"{where} ({name})"
    try:
        role = Role(str(entry.get("role")))
    except ValueError:
        raise AuthFileError(f"{where}: 'role' must be one of reader, writer, admin") from None
    token_hash = entry.get("token_sha256")
    if token_hash is not None and (
        not isinstance(token_hash, str) or not _HEX64.fullmatch(token_hash.lower())
    ):
        raise AuthFileError(f"{where}: 'token_sha256' must be 64 hex digits (printf %s TOKEN | sha256sum)")
    cert = entry.get("cert")
    identities = [cert] if isinstance(cert, str) else cert if cert is not None else []
    if not isinstance(identities, list) or not all(isinstance(c, str) and c for c in identities):
        raise AuthFileError(f"{where}: 'cert' must be a certificate identity (CN or SAN) or a list of them")
    if token_hash is None and not identities:
        raise AuthFileError(f"{where}: needs a credential: token_sha256, cert, or both")
    if "scopes" in entry and entry["scopes"] is None:
        # An empty key (every line under it commented out) must not widen to every id.
        raise AuthFileError(
            f"{where}: 'scopes' is empty; list the id prefixes it covers, or remove the key to cover every id"
        )
    return (
        Principal(name, role, _scopes(entry.get("scopes"), where)),
        token_hash.lower() if token_hash is not None else None,
        identities,
    )


def _scopes(raw: Any, where: str) -> Mapping[Kind, tuple[str, ...]] | None:
    if raw is None:
        return None
    kinds = ", ".join(k.value for k in Kind)
    if not isinstance(raw, dict):
        raise AuthFileError(f"{where}: 'scopes' must map id kinds ({kinds}) to lists of id prefixes")
    scopes: dict[Kind, tuple[str, ...]] = {}
    for key, prefixes in raw.items():
        try:
            kind = Kind(key)
        except ValueError:
            raise AuthFileError(f"{where}: unknown scope kind {key!r}; expected {kinds}") from None
        if isinstance(prefixes, str):
            prefixes = [prefixes]
        if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
            raise AuthFileError(f"{where}: scopes.{key} must be a list of id prefixes")
        scopes[kind] = tuple(prefixes)
    return scopes


def _signature(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


class AuthFile:
    """The auth file at ``path``, re-read when it changes (checked on each ``table()``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._signature = _signature(self.path)
            self._table = parse(self.path.read_text(), source=str(self.path))
        except OSError as e:
            raise AuthFileError(f"cannot read the auth file {self.path}: {e.strerror or e}") from None

    def table(self) -> AuthTable:
        try:
            signature = _signature(self.path)
        except OSError:
            return self._table  # replaced by a rename right now, or removed: keep what we have
        if signature == self._signature:
            return self._table
        with self._lock:
            if signature != self._signature:
                self._signature = signature  # set first: a bad file is reported once, not per call
                try:
                    self._table = parse(self.path.read_text(), source=str(self.path))
                    _log.info(
                        "auth file %s reloaded: %d token(s), %d certificate identities",
                        self.path,
                        len(self._table.by_token_sha256),
                        len(self._table.by_cert_identity),
                    )
                except (OSError, AuthFileError) as e:
                    _log.error(
                        "auth file %s changed but cannot be used; keeping the previous one: %s", self.path, e
                    )
        return self._table
