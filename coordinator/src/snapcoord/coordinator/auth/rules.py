"""The per-RPC access table: whether each snapcoord.v1 RPC changes state, and the ids it touches.

Keyed by the full method path (``/snapcoord.v1.SnapshotService/CreateSnapshot``). A test derives
the RPC list from the proto descriptors and fails when one has no entry here, and the interceptor
refuses (PERMISSION_DENIED) an API method it finds no entry for, so a new RPC is never open by
accident. Health is open (probes carry no credentials); reflection needs any authenticated
principal. Pinning another team's snapshot keeps it from being deleted, so the lease RPCs need the
app ids of their snapshot refs in scope as well as the lease id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from grpc_health.v1 import health

from snapcoord.coordinator.auth.policy import Access, IdRef, Kind
from snapcoord.coordinator.domain.paging import encode_id_token, encode_name_token
from snapcoord.coordinator.transport.reflection import SERVICE_NAMES as REFLECTION_SERVICE_NAMES
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2


@dataclass(frozen=True)
class Rule:
    access: Access
    #: The ids a (deserialized) request names.
    ids: Callable[[Any], Iterator[IdRef]]
    #: For a List RPC filtered per principal: the repeated response field and the id field of its
    #: items (``Access.filters`` names the kind).
    results: tuple[str, str] | None = None
    #: For such a List RPC: the page token that continues after a given id (its registry's shape).
    page_token: Callable[[str], str] | None = None
    #: A client-streaming RPC whose first message names the ids (``ids`` gets that message).
    first_message: bool = False


def _one(kind: Kind) -> Callable[[Any], Iterator[IdRef]]:
    field = kind.value

    def ids(request: Any) -> Iterator[IdRef]:
        yield kind, str(getattr(request, field))

    return ids


def _none(request: Any) -> Iterator[IdRef]:
    return iter(())


def _producer_and_previous(request: Any) -> Iterator[IdRef]:
    yield Kind.PRODUCER_ID, str(request.producer_id)
    yield Kind.PRODUCER_ID, str(request.previous_producer_id)


def _lease_and_apps(request: Any) -> Iterator[IdRef]:
    yield Kind.LEASE_ID, str(request.lease_id)
    for ref in request.snapshots:
        yield Kind.APP_ID, str(ref.app_id)


_READ = Access(mutates=False)
_WRITE = Access(mutates=True)
_ADMIN = Access(mutates=True, admin_only=True)

_P = "/snapcoord.v1.ProducerOffsetService/"
_S = "/snapcoord.v1.SnapshotService/"
_L = "/snapcoord.v1.LeaseService/"
_B = "/snapcoord.v1.BacklogService/"
_C = "/snapcoord.v1.CommitClaimService/"

RULES: Mapping[str, Rule] = {
    _P + "RegisterProducerOffsets": Rule(_WRITE, _one(Kind.PRODUCER_ID)),
    _P + "GetProducerOffsets": Rule(_READ, _one(Kind.PRODUCER_ID)),
    _P + "DeleteProducerOffsets": Rule(_WRITE, _one(Kind.PRODUCER_ID)),
    _P + "AdvanceProducerOffsets": Rule(_WRITE, _producer_and_previous),
    _P + "ListProducerOffsets": Rule(
        Access(mutates=False, filters=Kind.PRODUCER_ID),
        _none,
        results=("snapshots", "producer_id"),
        page_token=encode_name_token,
    ),
    _S + "CreateSnapshot": Rule(_WRITE, _one(Kind.APP_ID)),
    _S + "GetCurrentSnapshot": Rule(_READ, _one(Kind.APP_ID)),
    _S + "GetSnapshot": Rule(_READ, _one(Kind.APP_ID)),
    _S + "ListSnapshots": Rule(_READ, _one(Kind.APP_ID)),
    _S + "ReadCheckpoint": Rule(_READ, _one(Kind.APP_ID)),
    _S + "ReportTaskSnapshot": Rule(_WRITE, _one(Kind.APP_ID)),
    # Streamed: the first message names the app; later ones carry only data.
    _S + "UploadCheckpoint": Rule(_WRITE, _one(Kind.APP_ID), first_message=True),
    _S + "AbortSnapshot": Rule(_WRITE, _one(Kind.APP_ID)),
    _S + "DeleteSnapshot": Rule(_WRITE, _one(Kind.APP_ID)),
    _S + "SetRetentionPolicy": Rule(_ADMIN, _one(Kind.APP_ID)),
    _L + "AcquireSnapshots": Rule(_WRITE, _lease_and_apps),
    _L + "ReleaseSnapshots": Rule(_WRITE, _lease_and_apps),
    _L + "RenewLease": Rule(_WRITE, _one(Kind.LEASE_ID)),
    _L + "DropLease": Rule(_WRITE, _one(Kind.LEASE_ID)),
    _L + "GetLease": Rule(_READ, _one(Kind.LEASE_ID)),
    _L + "ListLeases": Rule(
        Access(mutates=False, filters=Kind.LEASE_ID),
        _none,
        results=("leases", "lease_id"),
        page_token=encode_id_token,
    ),
    _B + "MarkBacklog": Rule(_WRITE, _one(Kind.JOB_ID)),
    _B + "ReportProgress": Rule(_WRITE, _one(Kind.JOB_ID)),
    _B + "GetBacklogStatus": Rule(_READ, _one(Kind.JOB_ID)),
    _B + "ClearBacklog": Rule(_ADMIN, _one(Kind.JOB_ID)),
    _C + "FenceTable": Rule(_WRITE, _one(Kind.TABLE_ID)),
    _C + "ClaimCommit": Rule(_WRITE, _one(Kind.TABLE_ID)),
    _C + "GetCommitClaims": Rule(_READ, _one(Kind.TABLE_ID)),
}

#: The snapcoord.v1 services, from the descriptors: a method of theirs without a rule is refused.
API_SERVICES: frozenset[str] = frozenset(
    service.full_name
    for module in (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
)
#: Services every caller may use, credentials or not (load balancer and kubelet probes).
OPEN_SERVICES: frozenset[str] = frozenset({health.SERVICE_NAME})
#: Services any authenticated principal may use, whatever its role.
AUTHENTICATED_SERVICES: frozenset[str] = frozenset(REFLECTION_SERVICE_NAMES)
