"""Build the access-control pieces from the config, and say once what the server accepts."""

from __future__ import annotations

import logging

import grpc

from snapcoord.coordinator.auth.authfile import AuthFile
from snapcoord.coordinator.auth.interceptor import Authenticator, AuthInterceptor
from snapcoord.coordinator.auth.tls import RotatingServerCredentials, TlsFiles
from snapcoord.coordinator.config.settings import SecurityConfig

_log = logging.getLogger("snapcoord.auth")


def new_auth_interceptor(security: SecurityConfig) -> AuthInterceptor:
    """The interceptor for ``security``; loads the auth file (raises ``AuthFileError``, a
    ValueError, when it cannot be used) and logs what the server accepts."""
    auth_file = AuthFile(security.auth_file) if security.auth_file else None
    authenticator = Authenticator(auth_file, mutual_tls=bool(security.tls_client_ca))
    if not security.authenticates:
        _log.warning(
            "access control is off: every caller that reaches the gRPC port may read and change every "
            "record (set --auth-file and/or --tls-client-ca; see README 'Securing it')"
        )
    elif not security.tls:
        _log.warning("--auth-file without --tls-cert: bearer tokens cross the network in cleartext")
    return AuthInterceptor(authenticator)


def grpc_credentials(security: SecurityConfig) -> grpc.ServerCredentials | None:
    """Rotating TLS credentials for the gRPC port, or None for plaintext."""
    if not security.tls:
        return None
    files = TlsFiles(security.tls_cert, security.tls_key, security.tls_client_ca)
    return RotatingServerCredentials(files).server_credentials()
