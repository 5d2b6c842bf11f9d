"""TLS for the gRPC port, re-read from disk when the files change (rotation without a restart).

grpc's dynamic server credentials ask a fetcher for the certificate configuration at each new
handshake; the fetcher returns a new configuration when the certificate, key or client CA file
changed since the last one, None to keep the current one. Connections already open keep the
certificate they were made with; new ones get the new one.

Rotation writes two files, so a handshake can fall between the new certificate and its new key.
A pair that does not load (mismatched, half-written) is not handed to grpc: the previous pair stays
in force and the files are tried again on the next handshake.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

_log = logging.getLogger(__name__)


class TlsFilesError(ValueError):
    """The TLS files cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str
    #: When set, client certificates are required and verified against this CA bundle (mTLS).
    client_ca: str = ""


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TlsFilesError(f"cannot read the {what} {path}: {e.strerror or e}") from None


def _check_pair(cert: str, key: str) -> None:
    """Raise TlsFilesError unless ``key`` is the private key of ``cert`` (both PEM files)."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        raise TlsFilesError(f"the TLS certificate {cert} and key {key} do not load as a pair: {e}") from None


class RotatingServerCredentials:
    """The files of ``TlsFiles`` as grpc dynamic server credentials."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._signature = self._stat()
        self._initial = self._load()

    def _paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.files.cert, self.files.key, self.files.client_ca) if p)

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in self._paths():
            try:
                st = os.stat(path)
            except OSError as e:
                raise TlsFilesError(f"cannot read {path}: {e.strerror or e}") from None
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        _check_pair(self.files.cert, self.files.key)
        pair = (_read(self.files.key, "TLS key"), _read(self.files.cert, "TLS certificate"))
        roots = _read(self.files.client_ca, "client CA bundle") if self.files.client_ca else None
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=roots)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpc's fetcher: a new configuration when a file changed and loads, else None."""
        try:
            signature = self._stat()
        except TlsFilesError:
            return None  # mid-rename: keep serving the current certificate
        with self._lock:
            if signature == self._signature:
                return None
            try:
                config = self._load()
            except TlsFilesError as e:
                _log.warning("TLS files changed but do not load yet (keeping the current ones): %s", e)
                return None
            self._signature = signature
        _log.info("TLS certificate reloaded from %s", self.files.cert)
        return config

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self.fetch, require_client_authentication=bool(self.files.client_ca)
        )
