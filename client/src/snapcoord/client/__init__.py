"""Thin, typed Python client for the snapcoord coordinator: grpcio + protobuf only.

``CoordinatorClient`` has one method per RPC of the five ``snapcoord.v1`` services and returns
frozen dataclasses; failed calls raise ``SnapcoordError`` subclasses (``snapcoord.client.errors``).
``client.lease(...)`` keeps a snapshot lease alive for a ``with`` block. The generated protobuf
modules stay in ``snapcoord.v1``; nothing exported here is a protobuf type.

    from snapcoord.client import CoordinatorClient, TaskSnapshot, Offset

    with CoordinatorClient("localhost:50051") as client:
        snapshot = client.create_snapshot("orders-app", ["t0", "t1"])
        client.report_task_snapshot("orders-app", snapshot.generation,
                                    TaskSnapshot("t0", (Offset("orders", 0, 42),)))
"""

from __future__ import annotations

from snapcoord.client._channel import TlsConfig
from snapcoord.client._env import tls_from_env, token_from_env
from snapcoord.client._retry import RetryPolicy
from snapcoord.client._types import (
    AcquireResult,
    AdvanceResult,
    BacklogStatus,
    CheckpointUpload,
    CommitClaim,
    CommitClaimResult,
    CommitClaims,
    Lease,
    Offset,
    Page,
    PartitionBacklog,
    ProducerSnapshot,
    ProgressResult,
    Registration,
    RetentionPolicy,
    Snapshot,
    SnapshotRef,
    SnapshotState,
    TableFence,
    TaskSnapshot,
)
from snapcoord.client.client import CoordinatorClient
from snapcoord.client.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    CorruptRecord,
    DeadlineExceeded,
    Expired,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LeaseHeld,
    NewerFormat,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SnapcoordError,
    SnapshotFenced,
    SnapshotInProgress,
    TableFenced,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unsupported,
)
from snapcoord.client.lease import LeaseKeeper, load_or_create_lease_id, save_lease_id

# Pinned: tests/client/test_public_api.py fails when this list changes without the test.
__all__ = [
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
