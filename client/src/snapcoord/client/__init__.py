"""Thin Python client for the snapcoord coordinator: grpcio + protobuf only.

This distribution ships the generated ``snapcoord.v1`` API modules (stubs and messages for the
four services, regenerated from ``proto/`` by ``scripts/gen-proto``). The typed
``CoordinatorClient`` with error mapping, retries and the lease helper follows (issue 7); until
then, use the generated stubs on a ``grpc.Channel``.
"""

from __future__ import annotations

__all__: list[str] = []
