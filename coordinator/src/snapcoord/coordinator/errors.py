"""The coordinator's one exception root.

Every error the coordinator raises on purpose is a ``SnapcoordError``. Each direct subclass names
one outcome a caller can act on; the gRPC layer maps them to status codes in one table
(``snapcoord.coordinator.status``), so domain and storage code never import grpc. Storage errors
subclass the outcome they mean (a version conflict is an ``Aborted``: retry after re-reading), so
one that escapes a domain operation still reaches the caller with a sensible status.
"""

from __future__ import annotations


class SnapcoordError(Exception):
    """Root of every error the coordinator raises deliberately."""


class InvalidArgument(SnapcoordError):
    """The request is malformed; retrying it unchanged will fail again."""


class NotFound(SnapcoordError):
    """The named record does not exist (or has expired)."""


class AlreadyExists(SnapcoordError):
    """A record the caller asked to create exists already."""


class FailedPrecondition(SnapcoordError):
    """The system is not in a state that allows the operation (fenced, pinned, not aborted...)."""


class Aborted(SnapcoordError):
    """A concurrent change won; re-read and retry."""


class Unavailable(SnapcoordError):
    """A backend (ZooKeeper, S3) cannot be reached right now; retry later."""


class Unimplemented(SnapcoordError):
    """The operation exists in the API but this coordinator does not provide it yet."""


class Internal(SnapcoordError):
    """An invariant is broken; this is a bug or corrupted stored data."""


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
        super().__init__(message)
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
