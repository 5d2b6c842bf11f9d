"""The one table from the coordinator's exceptions to gRPC status codes, and their rich details.

Domain and storage code raise ``SnapcoordError`` subclasses and never import grpc; the interceptor
asks ``status_for`` which code a caller sees. Lookup walks the exception's MRO, so a subclass added
later (a new storage error) inherits the code of the outcome it subclasses without touching this
table. Anything that is not a ``SnapcoordError`` is a bug: INTERNAL with a generic message and
reason INTERNAL, and the traceback goes to the log, not to the caller.

Every status also travels as a ``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer,
holding one ``google.rpc.ErrorInfo`` (the error's reason, ``DOMAIN``, its metadata), so callers
branch on the reason instead of parsing the message (docs/api.md lists the reasons). The messages
are snapcoord's wire-compatible copies (``snapcoord.v1.error_details_pb2``), and the ``Any`` names
the standard type, so grpcurl and googleapis-based clients decode it as the real thing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

import grpc

from snapcoord.coordinator import errors
from snapcoord.v1 import error_details_pb2

#: ``ErrorInfo.domain`` of every error the coordinator sends (a stable name, not a host to call).
DOMAIN = "snapcoord.dev"
#: The trailer gRPC reserves for a serialized ``google.rpc.Status``.
DETAILS_KEY = "grpc-status-details-bin"
#: Seconds left of a deadline at which a stream that ended early ended by the deadline (the
#: server's timer and ``time_remaining`` read different clocks).
_DEADLINE_SLACK_S = 0.05

_T = TypeVar("_T")
#: ``Any.type_url`` of the ErrorInfo detail: the standard message's name.
ERROR_INFO_TYPE_URL = "type.googleapis.com/google.rpc.ErrorInfo"

#: Keyed by the outcome classes of ``errors``; storage errors reach a code through their MRO.
STATUS_BY_ERROR: dict[type[errors.SnapcoordError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    # Undecodable here like a corrupt record, but sound: a version skew, not data loss.
    errors.NewerFormat: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,
    errors.Internal: grpc.StatusCode.INTERNAL,
    # A SnapcoordError raised directly names no outcome: treat it as a bug.
    errors.SnapcoordError: grpc.StatusCode.INTERNAL,
}

#: What a caller sees for an unexpected exception; details stay in the server log.
GENERIC_INTERNAL_MESSAGE = "internal error in the coordinator; the server log has the details"

#: Longest message and metadata value sent. Both travel in trailers (the message twice: as
#: grpc-message and inside the details), and a client drops trailers over its metadata limit
#: (8 KiB by default) and turns the status into RESOURCE_EXHAUSTED, losing code and reason alike.
#: A message that echoes a huge input (a page token) is cut to this.
MAX_MESSAGE_CHARS = 1024
MAX_METADATA_VALUE_CHARS = 256


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    suffix = f"... ({len(text)} characters in all)"
    return text[: limit - len(suffix)] + suffix


@dataclass(frozen=True)
class Status:
    code: grpc.StatusCode
    message: str
    #: True when the exception was not one the coordinator raises on purpose (log its traceback).
    unexpected: bool
    #: ``ErrorInfo.reason``: a ``Reason`` value.
    reason: str = errors.Reason.INTERNAL.value
    #: ``ErrorInfo.metadata``: strings only, never payloads or secrets.
    metadata: Mapping[str, str] = field(default_factory=dict)

    def details_bin(self) -> bytes:
        """The serialized ``google.rpc.Status`` for the ``grpc-status-details-bin`` trailer.

        Its code and message equal the call's own (clients such as grpcio-status check that).
        """
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN, metadata=dict(self.metadata))
        status = error_details_pb2.Status(code=self.code.value[0], message=self.message)
        detail = status.details.add()
        detail.type_url = ERROR_INFO_TYPE_URL
        detail.value = info.SerializeToString(deterministic=True)
        return status.SerializeToString(deterministic=True)

    def trailing_metadata(self) -> tuple[tuple[str, bytes]]:
        return ((DETAILS_KEY, self.details_bin()),)


def status_for(exc: BaseException) -> Status:
    """The status a caller gets for ``exc``."""
    for cls in type(exc).__mro__:
        code = STATUS_BY_ERROR.get(cls)
        if code is not None:
            unexpected = cls is errors.SnapcoordError or cls is errors.Internal
            # getattr: an instance made without __init__ (copy, a subclass that skips it) still maps.
            reason = getattr(exc, "reason", None) or getattr(exc, "default_reason", errors.Reason.INTERNAL)
            metadata = getattr(exc, "metadata", None) or {}
            message = _clip(str(exc) or code.name, MAX_MESSAGE_CHARS)
            clipped = {str(k): _clip(str(v), MAX_METADATA_VALUE_CHARS) for k, v in metadata.items()}
            return Status(code, message, unexpected, str(reason), clipped)
    return Status(grpc.StatusCode.INTERNAL, GENERIC_INTERNAL_MESSAGE, True)


def unimplemented(message: str) -> Status:
    """The status of an RPC the proto has but this coordinator does not implement."""
    return Status(grpc.StatusCode.UNIMPLEMENTED, message, False, errors.Reason.UNIMPLEMENTED.value)


def until_ended(requests: Iterator[_T], context: grpc.ServicerContext) -> Iterator[_T]:
    """A client stream's ``requests``, ending the call as the client did when it ends early.

    When the client cancels or its deadline passes mid-stream, grpc's request iterator raises a
    bare ``grpc.RpcError`` (no code), which would be INTERNAL: a traceback and an Internal count for
    what is the caller's doing. The call ends instead with CANCELLED or DEADLINE_EXCEEDED, what
    the caller saw, through ``context.abort`` (the interceptor records an aborted call's code), and
    the exception unwinds the servicer, which cleans up as after any failure. The pending read
    may also fail before grpc marks the call cancelled, and the stream just end: it is ended the
    same way when the call is inactive or past its deadline by then. (A cancel grpc marks only
    later is not seen here: that upload completes, its id reaches no one, and the janitor's
    intent sweep removes it.)
    """
    try:
        yield from requests
    except grpc.RpcError:
        if context.is_active():
            raise
        _abort_ended(context)
    if not context.is_active() or context.time_remaining() <= _DEADLINE_SLACK_S:
        _abort_ended(context)


def _abort_ended(context: grpc.ServicerContext) -> NoReturn:
    late = context.time_remaining() <= _DEADLINE_SLACK_S
    code = grpc.StatusCode.DEADLINE_EXCEEDED if late else grpc.StatusCode.CANCELLED
    context.abort(code, f"the request stream ended early: {code.name}")
    raise AssertionError("context.abort returned")  # pragma: no cover
