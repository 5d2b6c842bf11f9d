"""The one table from the coordinator's exceptions to gRPC status codes.

Domain and storage code raise ``SnapcoordError`` subclasses and never import grpc; the interceptor
asks ``status_for`` which code a caller sees. Lookup walks the exception's MRO, so a subclass added
later (a new storage error) inherits the code of the outcome it subclasses without touching this
table. Anything that is not a ``SnapcoordError`` is a bug: INTERNAL with a generic message, and
the traceback goes to the log, not to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from snapcoord.coordinator import errors

#: Keyed by the outcome classes of ``errors``; storage errors reach a code through their MRO.
STATUS_BY_ERROR: dict[type[errors.SnapcoordError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
    errors.Internal: grpc.StatusCode.INTERNAL,
    # A SnapcoordError raised directly names no outcome: treat it as a bug.
    errors.SnapcoordError: grpc.StatusCode.INTERNAL,
}

#: What a caller sees for an unexpected exception; details stay in the server log.
GENERIC_INTERNAL_MESSAGE = "internal error in the coordinator; the server log has the details"


@dataclass(frozen=True)
class Status:
    code: grpc.StatusCode
    message: str
    #: True when the exception was not one the coordinator raises on purpose (log its traceback).
    unexpected: bool


def status_for(exc: BaseException) -> Status:
    """The status a caller gets for ``exc``."""
    for cls in type(exc).__mro__:
        code = STATUS_BY_ERROR.get(cls)
        if code is not None:
            unexpected = cls is errors.SnapcoordError or cls is errors.Internal
            return Status(code, str(exc) or code.name, unexpected)
    return Status(grpc.StatusCode.INTERNAL, GENERIC_INTERNAL_MESSAGE, True)
