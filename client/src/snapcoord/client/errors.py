"""The client's one exception root, and the one table from gRPC status codes to it.

Every failed call raises a ``SnapcoordError`` subclass named after the outcome a caller can act
on, mirroring the coordinator's own exception classes. Each keeps the status code's name
(``.code``), the server's message (``.details``), the RPC (``.method``) and how many times the
client sent the call (``.attempts``, more than 1 after retries on UNAVAILABLE).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import grpc


class SnapcoordError(Exception):
    """Root of every error a ``CoordinatorClient`` call raises for a failed RPC."""

    #: The status code name used when none is given (the subclass's own code).
    default_code: ClassVar[str] = "UNKNOWN"

    def __init__(
        self, details: str = "", *, code: str | None = None, method: str | None = None, attempts: int = 1
    ) -> None:
        super().__init__(details)
        self.details = details
        self.code = code or self.default_code
        self.method = method
        self.attempts = attempts

    def __str__(self) -> str:
        where = f" ({self.method}" + (f", {self.attempts} attempts)" if self.attempts > 1 else ")")
        return f"{self.code}: {self.details}{where if self.method else ''}"

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


class AlreadyExists(SnapcoordError):
    default_code = "ALREADY_EXISTS"


class FailedPrecondition(SnapcoordError):
    """The coordinator's state does not allow the call (a leased snapshot, a CREATED snapshot that
    must be aborted first...)."""

    default_code = "FAILED_PRECONDITION"


_CURRENT_GENERATION_RE = re.compile(r"the current generation is (\d+)")


class SnapshotFenced(FailedPrecondition):
    """ReportTaskSnapshot was refused for good: the generation is not the current one, or the
    snapshot is no longer CREATED, or this task already reported something different for it.

    A task that gets this must not report again for that generation; ``current_generation`` is the
    one the coordinator named in its message (None when it named none).
    """

    @property
    def current_generation(self) -> int | None:
        # The coordinator puts it in the message only; parsed best-effort for logs and decisions.
        m = _CURRENT_GENERATION_RE.search(self.details)
        return int(m.group(1)) if m else None


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

#: Where one RPC gives a code a more precise meaning than the table above.
ERROR_BY_METHOD_AND_CODE: Mapping[tuple[str, grpc.StatusCode], type[SnapcoordError]] = {
    # API.md: a report for another generation, or for a snapshot no longer CREATED, is fenced;
    # so is a different report from a task that already reported (it can never be accepted).
    ("ReportTaskSnapshot", grpc.StatusCode.FAILED_PRECONDITION): SnapshotFenced,
}


def error_for_status(code: grpc.StatusCode, details: str, method: str | None = None) -> SnapcoordError:
    """The exception for a call to ``method`` (an RPC name such as "GetLease") that ended with ``code``."""
    cls = ERROR_BY_METHOD_AND_CODE.get((method or "", code)) or ERROR_BY_CODE.get(code, SnapcoordError)
    return cls(details, code=code.name, method=method)


def error_from_rpc(error: grpc.RpcError, method: str | None = None) -> SnapcoordError:
    """Translate what grpcio raised; ``raise error_from_rpc(e, name) from e`` keeps the cause."""
    if isinstance(error, grpc.Call):
        return error_for_status(error.code(), error.details() or "", method)
    return error_for_status(grpc.StatusCode.UNKNOWN, str(error), method)


__all__ = [
    "ERROR_BY_CODE",
    "ERROR_BY_METHOD_AND_CODE",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "SnapcoordError",
    "SnapshotFenced",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "error_for_status",
    "error_from_rpc",
]
