"""The coordinator's one exception root.

Every error the coordinator raises on purpose is a ``SnapcoordError``. Each direct subclass names
one outcome a caller can act on; the gRPC layer maps them to status codes in one table
(``snapcoord.coordinator.transport.status``), so domain and storage code never import grpc. Storage errors
subclass the outcome they mean (a version conflict is an ``Aborted``: retry after re-reading), so
one that escapes a domain operation still reaches the caller with a sensible status.

Besides the status code, every error carries a stable machine-readable ``reason`` (an UPPER_SNAKE
string from ``Reason``; each outcome class has a default) and string ``metadata`` (resource ids, the
current generation...). The transport sends both as a ``google.rpc.ErrorInfo`` detail, so clients
act on them without parsing the message text. docs/api.md lists every reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import ClassVar


class Reason(StrEnum):
    """Every ``ErrorInfo.reason`` the coordinator sends; the values are part of the public API."""

    # One default per outcome class.
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    CONTENDED = "CONTENDED"
    UNAVAILABLE = "UNAVAILABLE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    # Specific outcomes a caller branches on.
    #: ReportTaskSnapshot for a generation that is not current; metadata: app_id, generation,
    #: current_generation.
    SNAPSHOT_FENCED = "SNAPSHOT_FENCED"
    #: The snapshot is no longer CREATED (completed or aborted); metadata: app_id, generation, state.
    SNAPSHOT_NOT_CREATED = "SNAPSHOT_NOT_CREATED"
    #: A task reported something different for a generation it already reported; metadata: app_id,
    #: generation, task_id.
    REPORT_CONFLICT = "REPORT_CONFLICT"
    #: A snapshot cannot be deleted while a live lease pins it; metadata: app_id, generation.
    LEASE_HELD = "LEASE_HELD"
    #: A CREATED snapshot must be aborted (or complete) before it is deleted; metadata: app_id,
    #: generation.
    SNAPSHOT_IN_PROGRESS = "SNAPSHOT_IN_PROGRESS"
    #: A record expired (TTL or lease expiry); metadata names it.
    EXPIRED = "EXPIRED"
    #: A payload exceeds a configured size or count limit; metadata: field, limit.
    TOO_LARGE = "TOO_LARGE"
    #: The server's budget of payload bytes in flight is spent; retry after a pause. Metadata:
    #: limit, requested.
    OVERLOADED = "OVERLOADED"
    #: The call carries no credentials the coordinator accepts (no or an unknown token, no or an
    #: unlisted client certificate); metadata: method.
    UNAUTHENTICATED = "UNAUTHENTICATED"
    #: The caller is known but its role or id scopes do not cover the call; metadata: principal,
    #: method, and the id kind and id that were refused (when an id was).
    PERMISSION_DENIED = "PERMISSION_DENIED"
    #: A stored record (a ZooKeeper node or an S3 payload object) cannot be decoded: truncated,
    #: garbled, or of the wrong shape. Metadata: kind (what the record is), path (its node path or
    #: object key, when known).
    CORRUPT_RECORD = "CORRUPT_RECORD"
    #: A stored record is intact but of a format version newer than this coordinator reads: a
    #: newer release wrote it (version skew, not damage; upgrade this replica, restore nothing).
    #: Metadata: kind, path (when known), format_version (the record's), supported_format_version
    #: (the newest this coordinator reads).
    NEWER_FORMAT = "NEWER_FORMAT"
    #: FenceTable or ClaimCommit of an epoch below the table's fence (a newer run owns the table);
    #: metadata: table_id, epoch, fence_epoch.
    TABLE_FENCED = "TABLE_FENCED"
    #: ClaimCommit of a log number whose claims the janitor removed after the retention (a write
    #: that late is a zombie's); metadata: table_id, seq, floor_seq.
    CLAIM_RETIRED = "CLAIM_RETIRED"


class SnapcoordError(Exception):
    """Root of every error the coordinator raises deliberately.

    ``reason`` defaults to the outcome class's own; ``metadata`` values are strings (ErrorInfo's
    map is string to string) and never carry payloads or secrets.
    """

    default_reason: ClassVar[Reason] = Reason.INTERNAL

    def __init__(
        self, message: str = "", *, reason: Reason | None = None, metadata: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(message)
        self.reason: Reason = reason or self.default_reason
        self.metadata: dict[str, str] = {k: str(v) for k, v in (metadata or {}).items()}


class InvalidArgument(SnapcoordError):
    """The request is malformed; retrying it unchanged will fail again."""

    default_reason = Reason.INVALID_ARGUMENT


class NotFound(SnapcoordError):
    """The named record does not exist (or has expired)."""

    default_reason = Reason.NOT_FOUND


class AlreadyExists(SnapcoordError):
    """A record the caller asked to create exists already."""

    default_reason = Reason.ALREADY_EXISTS


class FailedPrecondition(SnapcoordError):
    """The system is not in a state that allows the operation (fenced, pinned, not aborted...)."""

    default_reason = Reason.FAILED_PRECONDITION


class Aborted(SnapcoordError):
    """A concurrent change won; re-read and retry."""

    default_reason = Reason.CONTENDED


class Unavailable(SnapcoordError):
    """A backend (ZooKeeper, S3) cannot be reached right now; retry later."""

    default_reason = Reason.UNAVAILABLE


class ResourceExhausted(SnapcoordError):
    """A server-wide budget is spent for now (payload bytes in flight); retry after a pause."""

    default_reason = Reason.OVERLOADED


class Unimplemented(SnapcoordError):
    """The operation exists in the API but this coordinator does not provide it yet."""

    default_reason = Reason.UNIMPLEMENTED


class Unauthenticated(SnapcoordError):
    """The call carries no credentials the coordinator accepts."""

    default_reason = Reason.UNAUTHENTICATED


class PermissionDenied(SnapcoordError):
    """The caller is authenticated but its role or scopes do not allow the call."""

    default_reason = Reason.PERMISSION_DENIED


class DataLoss(SnapcoordError):
    """Stored data the operation needs is unreadable; retrying will not help until it is repaired."""

    default_reason = Reason.CORRUPT_RECORD


class CorruptRecord(DataLoss):
    """One stored record cannot be decoded (docs/operations/corruption.md says how to repair it).

    Decoders raise it naming the ``kind`` of record and keeping the undecodable bytes (``data``,
    never sent or logged: it lets the code that read several nodes tell which one it was); the
    code that read the record adds its ``path`` (``at``), so the caller and the log name exactly
    what to inspect. Only that record's operations fail: its neighbours read, and the janitor
    goes on past it.
    """

    def __init__(self, message: str, *, kind: str, path: str = "", data: bytes = b"") -> None:
        metadata = {"kind": kind, "path": path} if path else {"kind": kind}
        super().__init__(f"{message} (at {path})" if path else message, metadata=metadata)
        self.kind = kind
        self.path = path
        self.detail = message
        self.data = data

    def at(self, path: str) -> CorruptRecord:
        """This error located at ``path`` (a node path or object key); itself when it has one."""
        if self.path:
            return self
        located = CorruptRecord(self.detail, kind=self.kind, path=path, data=self.data)
        located.__cause__ = self.__cause__
        return located


class NewerFormat(CorruptRecord):
    """One stored record of a format version newer than this coordinator reads: a newer release
    wrote it. It is undecodable here like a corrupt record (so it stops only itself, and janitor
    steps go past it deleting nothing it may reference), but the record is sound: the caller sees
    FAILED_PRECONDITION with reason NEWER_FORMAT naming the version, so nobody repairs or restores
    it; a replica of a release that reads ``version`` does."""

    default_reason = Reason.NEWER_FORMAT

    def __init__(
        self, message: str, *, kind: str, version: int, supported: int, path: str = "", data: bytes = b""
    ) -> None:
        super().__init__(message, kind=kind, path=path, data=data)
        self.metadata.update(format_version=str(version), supported_format_version=str(supported))
        self.version = version
        self.supported = supported

    def at(self, path: str) -> NewerFormat:
        if self.path:
            return self
        located = NewerFormat(
            self.detail,
            kind=self.kind,
            version=self.version,
            supported=self.supported,
            path=path,
            data=self.data,
        )
        located.__cause__ = self.__cause__
        return located


class Internal(SnapcoordError):
    """An invariant is broken; this is a bug or corrupted stored data."""

    default_reason = Reason.INTERNAL


# --- storage errors: raised at the backend edge, translated from kazoo/botocore/sqlite ---------


class NodeExistsError(AlreadyExists):
    """A metadata node exists where a create expected none."""


class NoNodeError(NotFound):
    """A metadata node (or the parent of one being created) does not exist."""


class BadVersionError(Aborted):
    """A compare-and-set lost: the node's version is not the expected one."""


class NotEmptyError(FailedPrecondition):
    """A metadata node still has children and cannot be deleted."""


class TransactionFailed(Aborted):
    """A multi-op transaction was rejected as a whole; nothing in it was applied.

    ``index`` is the position of the first failing operation and ``cause`` the error it met
    (a ``NodeExistsError``, ``NoNodeError``, ``BadVersionError`` or ``NotEmptyError``).
    """

    def __init__(self, message: str, *, index: int, cause: SnapcoordError) -> None:
        super().__init__(message, reason=cause.reason)
        self.index = index
        self.cause = cause


class BlobNotFound(NotFound):
    """No object is stored under the key."""


class StoreUnavailable(Unavailable):
    """The metadata or blob backend cannot be reached (connection lost, session suspended...)."""


class CommitOutcomeUnknown(StoreUnavailable):
    """The connection broke while a write was in flight and its outcome cannot be told.

    The write may or may not have been applied; callers re-read before deciding anything.
    """
