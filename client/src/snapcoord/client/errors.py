"""The client's one exception root, and the tables from gRPC statuses to it.

Every failed call raises a ``SnapcoordError`` subclass named after the outcome a caller can act
on, mirroring the coordinator's own exception classes. Each keeps the status code's name
(``.code``), the server's message (``.details``), the RPC (``.method``), how many times the
client sent the call (``.attempts``, more than 1 after retries on UNAVAILABLE), and the
coordinator's ``google.rpc.ErrorInfo``: ``.reason`` (e.g. "SNAPSHOT_FENCED") and ``.metadata``
(e.g. ``{"current_generation": "5"}``). docs/api.md lists every reason and its metadata keys.

The class comes from the reason where ``ERROR_BY_REASON`` names one (``SnapshotFenced``,
``LeaseHeld``...; always a subclass of the code's class), otherwise from the code
(``ERROR_BY_CODE``), which is all there is for a status without details (raised by grpc itself,
e.g. DEADLINE_EXCEEDED, or by a proxy). Nothing is parsed out of message text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import grpc
from google.protobuf.message import DecodeError

from snapcoord.v1 import error_details_pb2

#: ``ErrorInfo.domain`` of the coordinator's errors; an ErrorInfo from another domain (a proxy's)
#: is ignored.
DOMAIN = "snapcoord.dev"
#: The trailer that carries a serialized ``google.rpc.Status``.
DETAILS_KEY = "grpc-status-details-bin"
#: The full name an ``Any`` gives the ErrorInfo detail (read from its type_url; the client decodes
#: it with its own wire-compatible copy, ``snapcoord.v1.ErrorInfo``).
ERROR_INFO_TYPE = "google.rpc.ErrorInfo"


class SnapcoordError(Exception):
    """Root of every error a ``CoordinatorClient`` call raises for a failed RPC."""

    #: The status code name used when none is given (the subclass's own code).
    default_code: ClassVar[str] = "UNKNOWN"

    def __init__(
        self,
        details: str = "",
        *,
        code: str | None = None,
        method: str | None = None,
        attempts: int = 1,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(details)
        self.details = details
        self.code = code or self.default_code
        self.method = method
        self.attempts = attempts
        #: The coordinator's ErrorInfo reason; None when the status carried none (see module doc).
        self.reason = reason
        #: The ErrorInfo metadata (strings); empty when there was none.
        self.metadata: dict[str, str] = dict(metadata or {})

    def __str__(self) -> str:
        where = f" ({self.method}" + (f", {self.attempts} attempts)" if self.attempts > 1 else ")")
        why = f" [{self.reason}]" if self.reason and self.reason != self.code else ""
        return f"{self.code}{why}: {self.details}{where if self.method else ''}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only attributes survive pickling (errors travel from Spark tasks to the driver).
        return (type(self), (self.details,), self.__dict__)


class InvalidArgument(SnapcoordError):
    """The request is malformed (bad identifier, task not in the task set...); retrying it unchanged
    fails again. Also raised for OUT_OF_RANGE."""

    default_code = "INVALID_ARGUMENT"


class NotFound(SnapcoordError):
    """The named record does not exist or has expired."""

    default_code = "NOT_FOUND"


class Expired(NotFound):
    """The named record existed but its time is up (reason EXPIRED): a lease that was not renewed,
    producer offsets past their TTL. ``metadata`` names it and has ``expires_at_ms``."""


class AlreadyExists(SnapcoordError):
    default_code = "ALREADY_EXISTS"


class FailedPrecondition(SnapcoordError):
    """The coordinator's state does not allow the call (a leased snapshot, a CREATED snapshot that
    must be aborted first...)."""

    default_code = "FAILED_PRECONDITION"


class SnapshotFenced(FailedPrecondition):
    """The snapshot is not, or no longer, the CREATED current generation, so the call can never
    succeed for it: reasons SNAPSHOT_FENCED (a newer generation exists, or the generation does not
    exist yet), SNAPSHOT_NOT_CREATED (completed or aborted) and REPORT_CONFLICT (this task already
    reported something different for it).

    A task that gets this from ReportTaskSnapshot must not report again for that generation.
    ``current_generation`` is the application's current generation as the coordinator saw it (None
    when it sent none).
    """

    @property
    def current_generation(self) -> int | None:
        value = self.metadata.get("current_generation", "")
        return int(value) if value.lstrip("-").isdigit() else None


class LeaseHeld(FailedPrecondition):
    """DeleteSnapshot refused: an unexpired lease pins the snapshot (reason LEASE_HELD). It can be
    deleted once every lease on it is released or expired."""


class SnapshotInProgress(FailedPrecondition):
    """DeleteSnapshot refused: the snapshot is still CREATED (reason SNAPSHOT_IN_PROGRESS); abort
    it first (or let it complete)."""


class TableFenced(FailedPrecondition):
    """FenceTable or ClaimCommit refused (reason TABLE_FENCED): the table is fenced by a newer run
    (a higher epoch), so this writer must stop writing to it; nothing was claimed or changed.
    ``fence_epoch`` is the table's fence as the coordinator saw it (None when it sent none)."""

    @property
    def fence_epoch(self) -> int | None:
        value = self.metadata.get("fence_epoch", "")
        return int(value) if value.isdigit() else None


class Aborted(SnapcoordError):
    """A concurrent change won (a heavily contended record); re-read and retry."""

    default_code = "ABORTED"


class Unavailable(SnapcoordError):
    """The coordinator (or its ZooKeeper/S3) cannot be reached. Idempotent calls were retried with
    backoff until their deadline before this was raised; others raise it at once."""

    default_code = "UNAVAILABLE"


class DeadlineExceeded(SnapcoordError):
    """The call did not finish within its ``timeout_s``; it may or may not have taken effect."""

    default_code = "DEADLINE_EXCEEDED"


class Unimplemented(SnapcoordError):
    """The coordinator does not provide this RPC (an older version)."""

    default_code = "UNIMPLEMENTED"


class Unsupported(Unimplemented):
    """The coordinator that answered is older than the RPC (UNIMPLEMENTED for an RPC listed in
    ``INTRODUCED_IN``): ``required_version`` is the release that brought it. Upgrade the
    coordinator; no weaker call stands in for it."""

    @property
    def required_version(self) -> str:
        return INTRODUCED_IN.get(self.method or "", "")


class PermissionDenied(SnapcoordError):
    default_code = "PERMISSION_DENIED"


class Unauthenticated(SnapcoordError):
    """The coordinator (or a proxy in front of it) did not accept the credentials (token, TLS)."""

    default_code = "UNAUTHENTICATED"


class ResourceExhausted(SnapcoordError):
    """A limit was hit; for large checkpoints usually a message size (see
    ``max_receive_message_bytes``/``max_send_message_bytes`` and the server's report limit)."""

    default_code = "RESOURCE_EXHAUSTED"


class Cancelled(SnapcoordError):
    """The call was cancelled, e.g. the client was closed while it was in flight."""

    default_code = "CANCELLED"


class Internal(SnapcoordError):
    """A bug or corrupted data on the server side (also UNKNOWN and DATA_LOSS)."""

    default_code = "INTERNAL"


class CorruptRecord(Internal):
    """A record the coordinator stored cannot be read back (DATA_LOSS, reason CORRUPT_RECORD):
    truncated, garbled, or a payload whose size or digest does not match its record. ``metadata``
    has its ``kind`` and ``path``; retrying does not help, repairing it does."""


class NewerFormat(FailedPrecondition):
    """The coordinator that answered is older than a record the call needs (FAILED_PRECONDITION,
    reason NEWER_FORMAT): a newer release wrote it, in a format version this one does not read.
    The record is sound; a replica of a newer release reads it, so upgrade the replica (during a
    rolling upgrade, another replica may already answer). ``metadata`` has ``kind``, ``path``,
    ``format_version`` (the record's) and ``supported_format_version`` (the newest the replica
    reads)."""


#: The one table from status codes to exception classes; every grpc.StatusCode but OK has a row.
ERROR_BY_CODE: Mapping[grpc.StatusCode, type[SnapcoordError]] = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Internal,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: Internal,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}

#: Reasons that name a more precise class than their code's. A class is used only when it
#: subclasses the code's own (``ERROR_BY_CODE``), so a reason can never make an error change kind.
ERROR_BY_REASON: Mapping[str, type[SnapcoordError]] = {
    "SNAPSHOT_FENCED": SnapshotFenced,
    "SNAPSHOT_NOT_CREATED": SnapshotFenced,
    "REPORT_CONFLICT": SnapshotFenced,
    "LEASE_HELD": LeaseHeld,
    "SNAPSHOT_IN_PROGRESS": SnapshotInProgress,
    "EXPIRED": Expired,
    "CORRUPT_RECORD": CorruptRecord,
    "NEWER_FORMAT": NewerFormat,
    "TABLE_FENCED": TableFenced,
}

#: RPCs newer than the first release -> the release that brought them. UNIMPLEMENTED for one of
#: them means the coordinator is older than that release: ``Unsupported`` names it.
INTRODUCED_IN: Mapping[str, str] = {
    "FenceTable": "0.4.0",
    "ClaimCommit": "0.4.0",
    "GetCommitClaims": "0.4.0",
}


def error_for_status(
    code: grpc.StatusCode,
    details: str,
    method: str | None = None,
    *,
    reason: str | None = None,
    metadata: Mapping[str, str] | None = None,
) -> SnapcoordError:
    """The exception for a call to ``method`` (an RPC name such as "GetLease") that ended with
    ``code`` and, when the coordinator sent an ErrorInfo, ``reason`` and ``metadata``."""
    cls = ERROR_BY_CODE.get(code, SnapcoordError)
    specific = ERROR_BY_REASON.get(reason or "")
    if specific is not None and issubclass(specific, cls):
        cls = specific
    needs = INTRODUCED_IN.get(method or "")
    if code is grpc.StatusCode.UNIMPLEMENTED and needs is not None:
        cls = Unsupported
        details = (
            f"the coordinator does not provide {method}: it needs snapcoord {needs} or newer ({details})"
        )
    return cls(details, code=code.name, method=method, reason=reason, metadata=metadata)


def error_info(trailing_metadata: Any) -> error_details_pb2.ErrorInfo | None:
    """The coordinator's ErrorInfo in a call's trailers, or None (no details, undecodable, another
    domain's). ``trailing_metadata`` is what ``grpc.Call.trailing_metadata()`` returns."""
    for key, value in trailing_metadata or ():
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = error_details_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.type_url.rpartition("/")[2] != ERROR_INFO_TYPE:
                    continue
                info = error_details_pb2.ErrorInfo.FromString(detail.value)
                if info.domain == DOMAIN:
                    return info
        except DecodeError:
            return None  # garbage from something in between: fall back to the code alone
    return None


def error_from_rpc(error: grpc.RpcError, method: str | None = None) -> SnapcoordError:
    """Translate what grpcio raised; ``raise error_from_rpc(e, name) from e`` keeps the cause."""
    if not isinstance(error, grpc.Call):
        return error_for_status(grpc.StatusCode.UNKNOWN, str(error), method)
    info = error_info(error.trailing_metadata())
    if info is None:
        return error_for_status(error.code(), error.details() or "", method)
    return error_for_status(
        error.code(), error.details() or "", method, reason=info.reason, metadata=dict(info.metadata)
    )


__all__ = [
    "ERROR_BY_CODE",
    "ERROR_BY_REASON",
    "INTRODUCED_IN",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DeadlineExceeded",
    "Expired",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "LeaseHeld",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "SnapcoordError",
    "SnapshotFenced",
    "SnapshotInProgress",
    "TableFenced",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unsupported",
    "error_for_status",
    "error_from_rpc",
    "error_info",
]
