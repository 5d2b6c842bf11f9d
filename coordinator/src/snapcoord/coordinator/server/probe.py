"""``snapcoord health``: a gRPC health probe for container healthchecks and operators.

Images based on python:slim have no grpc_health_probe; this one ships with the coordinator, so
the Dockerfile and docker-compose healthchecks call the real Health/Check RPC. Against a TLS port
it takes the client's variables (``SNAPCOORD_CLIENT_CA``, and ``SNAPCOORD_CLIENT_CERT`` /
``SNAPCOORD_CLIENT_KEY`` under mutual TLS); health itself needs no token.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from snapcoord.client import tls_from_env

#: Exit codes: 0 SERVING; 1 anything else (NOT_SERVING, unknown service, unreachable).
SERVING_EXIT, NOT_SERVING_EXIT = 0, 1


def check(target: str, *, service: str = "", timeout_s: float = 5.0) -> tuple[int, str]:
    """Ask ``target`` for the health of ``service``; returns (exit code, one-line report)."""
    with _channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            details = e.details() if isinstance(e, grpc.Call) else str(e)
            name = code.name if code is not None else "ERROR"
            if code == grpc.StatusCode.NOT_FOUND and service:
                details = f"the server knows no service {service!r}"
            return NOT_SERVING_EXIT, f"{target}: {name}: {details}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    what = f"{target} ({service})" if service else target
    return (SERVING_EXIT if status == "SERVING" else NOT_SERVING_EXIT), f"{what}: {status}"


def _channel(target: str) -> grpc.Channel:
    tls = tls_from_env()
    if tls is None:
        return grpc.insecure_channel(target)
    credentials = grpc.ssl_channel_credentials(tls.root_certificates, tls.private_key, tls.certificate_chain)
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.secure_channel(target, credentials, options=options)
