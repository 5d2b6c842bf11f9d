"""The public surface: a pinned ``__all__``, no protobuf type in it, one method per RPC, and a retry
decision for every RPC."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import re
import typing
from collections.abc import Iterator

from google.protobuf.message import Message

import snapcoord.client
from snapcoord.client import (
    CoordinatorClient,
    Offset,
    Snapshot,
    SnapshotRef,
    SnapshotState,
    TaskSnapshot,
)
from snapcoord.client._retry import IDEMPOTENT, NOT_RETRIED
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2

PINNED_ALL = [
    "Aborted",
    "AcquireResult",
    "AdvanceResult",
    "AlreadyExists",
    "BacklogStatus",
    "Cancelled",
    "CheckpointUpload",
    "CommitClaim",
    "CommitClaimResult",
    "CommitClaims",
    "CoordinatorClient",
    "CorruptRecord",
    "DeadlineExceeded",
    "Expired",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "Lease",
    "LeaseHeld",
    "LeaseKeeper",
    "NewerFormat",
    "NotFound",
    "Offset",
    "Page",
    "PartitionBacklog",
    "PermissionDenied",
    "ProducerSnapshot",
    "ProgressResult",
    "Registration",
    "ResourceExhausted",
    "RetentionPolicy",
    "RetryPolicy",
    "SnapcoordError",
    "Snapshot",
    "SnapshotFenced",
    "SnapshotInProgress",
    "SnapshotRef",
    "SnapshotState",
    "TableFence",
    "TableFenced",
    "TaskSnapshot",
    "TlsConfig",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unsupported",
    "load_or_create_lease_id",
    "save_lease_id",
    "tls_from_env",
    "token_from_env",
]


def all_rpcs() -> list[str]:
    return [
        method.name
        for module in (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_all_is_pinned() -> None:
    assert snapcoord.client.__all__ == PINNED_ALL
    for name in PINNED_ALL:
        assert getattr(snapcoord.client, name) is not None


def _types_in(hint: object) -> Iterator[object]:
    yield hint
    for arg in typing.get_args(hint):
        yield from _types_in(arg)


def _hints_of(obj: object) -> Iterator[tuple[str, object]]:
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            yield from typing.get_type_hints(obj).items()
        for name, member in inspect.getmembers(obj):
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
                target = member.fget if isinstance(member, property) else member
                for key, hint in typing.get_type_hints(target).items():
                    yield f"{obj.__name__}.{name}.{key}", hint
    elif inspect.isfunction(obj):
        for key, hint in typing.get_type_hints(obj).items():
            yield f"{obj.__name__}.{key}", hint


def test_no_protobuf_type_in_the_public_api() -> None:
    checked = 0
    for name in snapcoord.client.__all__:
        for where, hint in _hints_of(getattr(snapcoord.client, name)):
            for t in _types_in(hint):
                checked += 1
                assert not (inspect.isclass(t) and issubclass(t, Message)), (where, t)
                assert "_pb2" not in getattr(t, "__module__", ""), (where, t)
    assert checked > 200  # the walk really saw the signatures


def test_one_client_method_per_rpc_and_a_retry_decision_for_each() -> None:
    rpcs = all_rpcs()
    assert len(rpcs) == len(set(rpcs)) == 28  # names are unique across the five services
    for rpc in rpcs:
        assert callable(getattr(CoordinatorClient, snake(rpc), None)), rpc
        assert (rpc in IDEMPOTENT) != (rpc in NOT_RETRIED), rpc
    assert set(IDEMPOTENT) | set(NOT_RETRIED) == set(rpcs)


def test_every_method_takes_a_per_call_timeout() -> None:
    for rpc in all_rpcs():
        params = inspect.signature(getattr(CoordinatorClient, snake(rpc))).parameters
        assert params["timeout_s"].kind is inspect.Parameter.KEYWORD_ONLY, rpc
        assert params["timeout_s"].default is None, rpc


def test_values_pickle_for_spark_tasks() -> None:
    snapshot = Snapshot(
        "app",
        3,
        SnapshotState.COMPLETED,
        ("t",),
        (TaskSnapshot("t", [Offset("s", 0, 1)], {"store": b"x"}),),  # type: ignore[arg-type]
        labels={"k": "v"},
    )
    assert pickle.loads(pickle.dumps(snapshot)) == snapshot
    assert snapshot.tasks[0].committed_offsets == (Offset("s", 0, 1),)  # lists become tuples
    assert pickle.loads(pickle.dumps(SnapshotRef("app", 3))) == snapshot.ref
