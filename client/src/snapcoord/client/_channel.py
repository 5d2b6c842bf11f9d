"""A gRPC channel created on first use in the current process, never shared across a fork.

A Spark driver builds its client early and may fork (multiprocessing, Python workers), and Spark
pickles whatever a task closure references. So the channel is made lazily, per process id: a child
that inherited a client makes its own channel on its first call. The inherited one is abandoned,
not closed: its sockets are shared with the parent, and shutting them down in the child would
break the parent's connection. Pickling is refused outright, with an error that says what to do.
"""

from __future__ import annotations

import ipaddress
import json
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    commit_pb2,
    commit_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

MiB = 1024 * 1024

#: Service name -> generated stub class.
_STUBS: Mapping[str, Any] = {
    "snapcoord.v1.ProducerOffsetService": producer_pb2_grpc.ProducerOffsetServiceStub,
    "snapcoord.v1.SnapshotService": snapshot_pb2_grpc.SnapshotServiceStub,
    "snapcoord.v1.LeaseService": lease_pb2_grpc.LeaseServiceStub,
    "snapcoord.v1.BacklogService": backlog_pb2_grpc.BacklogServiceStub,
    "snapcoord.v1.CommitClaimService": commit_pb2_grpc.CommitClaimServiceStub,
}

#: RPC name ("GetLease") -> full service name; RPC names are unique across the API.
SERVICE_OF: Mapping[str, str] = {
    method.name: service.full_name
    for module in (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
}


#: Spread calls over every address the target resolves to (several replicas behind a DNS name or
#: an ``ipv4:a,b`` list) instead of gRPC's default ``pick_first``, which sends everything to one.
#: A replica that goes away (or reports NOT_SERVING by closing) drops out of the rotation.
SERVICE_CONFIG: str = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})

#: Keepalive pings find a replica that vanished without a TCP reset (a partition, a frozen VM)
#: within about a minute and a half. Pings go only while calls are in flight: a gRPC server by
#: default refuses pings closer than 5 minutes on a connection carrying no data (GOAWAY
#: too_many_pings), and snapcoord's calls are short unary calls, so their connections carry data.
KEEPALIVE_OPTIONS: Mapping[str, int] = {
    "grpc.keepalive_time_ms": 60_000,
    "grpc.keepalive_timeout_ms": 20_000,
    "grpc.keepalive_permit_without_calls": 0,
}


def normalize_target(target: str | Sequence[str]) -> str:
    """One gRPC target for a coordinator address, a comma-separated list, or a sequence of them.

    A single address or any URI-style target (``dns:///name:port``, ``ipv4:a:1,b:2``, ``unix:``)
    is passed through. Several ``host:port`` addresses become gRPC's ``ipv4:`` or ``ipv6:`` list,
    which gRPC only allows for IP literals: several *names* belong behind one DNS name
    (``dns:///coordinators:50051``), so that case is refused with that advice.
    """
    if isinstance(target, str):
        text = target.strip()
        if _has_scheme(text):
            return text
        parts = [p.strip() for p in text.split(",")]
    else:
        parts = [str(p).strip() for p in target]
    parts = [p for p in parts if p]
    if not parts:
        raise ValueError("target must be a gRPC target such as 'localhost:50051'")
    if len(parts) == 1:
        return parts[0]
    families = {_ip_family(p) for p in parts}
    if None in families or len(families) != 1:
        raise ValueError(
            f"several addresses must all be IPv4 or all IPv6 literals with ports, got {parts}; "
            "put replicas known by name behind one DNS name and use 'dns:///name:port'"
        )
    family = families.pop()
    return f"{family}:{','.join(parts)}"


def _has_scheme(text: str) -> bool:
    """``dns:///x``, ``ipv4:1.2.3.4:5``, ``unix:/p``: a scheme, not a ``host:port``."""
    scheme, _, rest = text.partition(":")
    return scheme in ("dns", "ipv4", "ipv6", "unix", "unix-abstract", "vsock", "xds") and bool(rest)


def _ip_family(address: str) -> str | None:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return "ipv4" if ip.version == 4 else "ipv6"


@dataclass(frozen=True)
class TlsConfig:
    """TLS to the coordinator (PEM bytes, as ``grpc.ssl_channel_credentials`` takes them).

    ``root_certificates`` None uses gRPC's default roots; ``private_key`` and ``certificate_chain``
    are for mutual TLS. ``server_name`` overrides the name checked against the server certificate
    (for a coordinator reached through an address its certificate does not name).
    """

    root_certificates: bytes | None = None
    private_key: bytes | None = field(default=None, repr=False)
    certificate_chain: bytes | None = None
    server_name: str | None = None

    @classmethod
    def from_files(
        cls,
        root_certificates: str | os.PathLike[str] | None = None,
        private_key: str | os.PathLike[str] | None = None,
        certificate_chain: str | os.PathLike[str] | None = None,
        server_name: str | None = None,
    ) -> TlsConfig:
        """Read PEM files; unset paths stay None."""

        def read(p: str | os.PathLike[str] | None) -> bytes | None:
            return None if p is None else Path(p).read_bytes()

        return cls(read(root_certificates), read(private_key), read(certificate_chain), server_name)


@dataclass(frozen=True)
class _Open:
    """The channel of one process and its stubs."""

    pid: int
    channel: grpc.Channel
    stubs: Mapping[str, Any]


class LazyChannel:
    """Creates the channel (and the generated stubs on it) on first use in each process."""

    def __init__(
        self,
        target: str,
        *,
        tls: TlsConfig | None,
        token: str | None,
        options: Sequence[tuple[str, Any]],
    ) -> None:
        self.target = target
        self._tls = tls
        self._token = token
        self._options = tuple(options)
        self._lock = threading.Lock()
        self._open: _Open | None = None
        self._closed = False
        _instances.add(self)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """Per-call metadata: the bearer token on a plaintext channel (with TLS it travels as call
        credentials, which gRPC only allows on secure channels)."""
        if self._token is not None and self._tls is None:
            return (("authorization", f"Bearer {self._token}"),)
        return None

    def method(self, name: str) -> Any:
        """The multi-callable for RPC ``name`` on this process's channel."""
        return getattr(self._get().stubs[SERVICE_OF[name]], name)

    def _get(self) -> _Open:
        pid = os.getpid()
        current = self._open
        if current is not None and current.pid == pid:
            return current
        with self._lock:
            if self._closed:
                raise ValueError(f"the client for {self.target} is closed")
            current = self._open
            if current is None or current.pid != pid:
                # A channel inherited from the parent (pid differs) is dropped without close().
                channel = self._create()
                current = _Open(pid, channel, {name: stub(channel) for name, stub in _STUBS.items()})
                self._open = current
            return current

    def _create(self) -> grpc.Channel:
        options = list(self._options)
        if self._tls is None:
            return grpc.insecure_channel(self.target, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self._tls.root_certificates,
            private_key=self._tls.private_key,
            certificate_chain=self._tls.certificate_chain,
        )
        if self._token is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(self._token)
            )
        if self._tls.server_name:
            options.append(("grpc.ssl_target_name_override", self._tls.server_name))
        return grpc.secure_channel(self.target, credentials, options=options)

    def close(self) -> None:
        """Close this process's channel (if any); later calls raise ValueError. Idempotent."""
        with self._lock:
            self._closed = True
            current, self._open = self._open, None
        if current is not None and current.pid == os.getpid():
            current.channel.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _after_fork_in_child(self) -> None:
        # Another parent thread may have held the lock at fork time; it will never release it here.
        self._lock = threading.Lock()

    def __reduce__(self) -> Any:
        raise TypeError(
            "a snapcoord channel cannot be pickled: create a CoordinatorClient inside the task "
            "(from the target string) instead of shipping one"
        )


_instances: weakref.WeakSet[LazyChannel] = weakref.WeakSet()


def _reset_locks_in_child() -> None:
    for instance in list(_instances):
        instance._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_in_child)
