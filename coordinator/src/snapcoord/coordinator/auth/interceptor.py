"""The gRPC interceptor that authenticates, authorizes and audits every snapcoord.v1 call.

It runs inside the server's main interceptor (``interceptors.ServerInterceptor``), so a refusal is
a ``SnapcoordError`` that the main one maps to UNAUTHENTICATED / PERMISSION_DENIED with ErrorInfo,
and counts in the gRPC metrics like any other outcome. A refused call never reaches its servicer,
so it changes nothing. Health passes untouched (probes carry no credentials); reflection needs an
authenticated principal when access control is on.

Credentials, in order: an ``authorization: Bearer <token>`` header (a token that is present but
unknown is refused even on a connection with a good client certificate: a caller that sends a
credential means it), then the verified client certificate's subject CN and SANs. With an auth
file both are looked up there; with mutual TLS and no auth file the certificate's identity is the
principal, with role admin (the client CA is then the whole policy).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from snapcoord.coordinator.auth import audit
from snapcoord.coordinator.auth.authfile import AuthFile
from snapcoord.coordinator.auth.policy import ANONYMOUS, IdRef, Principal, Role, decide
from snapcoord.coordinator.auth.rules import (
    API_SERVICES,
    AUTHENTICATED_SERVICES,
    OPEN_SERVICES,
    RULES,
    Rule,
)
from snapcoord.coordinator.domain.ids import MAX_ID_LENGTH, is_valid_id
from snapcoord.coordinator.errors import PermissionDenied, Unauthenticated
from snapcoord.coordinator.transport.handler_memo import HandlerMemo
from snapcoord.coordinator.transport.request_decoding import MalformedRequest
from snapcoord.coordinator.transport.status import status_for, until_ended

_log = logging.getLogger(__name__)

#: Longest token considered; longer ones are refused without hashing.
MAX_TOKEN_CHARS = 4096
_BEARER = "bearer "


def cert_identities(context: grpc.ServicerContext) -> list[str]:
    """The verified client certificate's subject CN, then its SANs (empty without one)."""
    auth = context.auth_context() or {}
    values = [*auth.get("x509_common_name", ()), *auth.get("x509_subject_alternative_name", ())]
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]


class Authenticator:
    """Turns a call's credentials into a principal, or raises ``Unauthenticated``."""

    def __init__(self, auth_file: AuthFile | None, *, mutual_tls: bool) -> None:
        self._auth_file = auth_file
        self._mutual_tls = mutual_tls

    @property
    def enabled(self) -> bool:
        return self._auth_file is not None or self._mutual_tls

    def principal(self, context: grpc.ServicerContext, method: str) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        meta = {"method": method}
        headers = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
        if len(headers) > 1:
            raise Unauthenticated(
                f"{method}: {len(headers)} authorization headers; "
                "send exactly one 'authorization: Bearer <token>'",
                metadata=meta,
            )
        if headers:
            return self._by_token(headers[0], method)
        identities = cert_identities(context)
        if identities:
            if self._auth_file is None:
                return Principal(identities[0], Role.ADMIN)
            found = self._auth_file.table().for_cert(identities)
            if found is None:
                raise Unauthenticated(
                    f"{method}: the client certificate ({', '.join(repr(i) for i in identities[:4])}) is not "
                    "listed in the auth file, and no bearer token was sent",
                    metadata=meta,
                )
            return found
        raise Unauthenticated(
            f"{method}: no credentials; send 'authorization: Bearer <token>'"
            + (" or a client certificate" if self._mutual_tls else ""),
            metadata=meta,
        )

    def _by_token(self, header: Any, method: str) -> Principal:
        meta = {"method": method}
        value = header if isinstance(header, str) else bytes(header).decode("utf-8", "replace")
        if value[: len(_BEARER)].lower() != _BEARER or not value[len(_BEARER) :].strip():
            raise Unauthenticated(
                f"{method}: the authorization header is not 'Bearer <token>'", metadata=meta
            )
        token = value[len(_BEARER) :].strip()
        if len(token) > MAX_TOKEN_CHARS or self._auth_file is None:
            raise Unauthenticated(f"{method}: the bearer token is not accepted", metadata=meta)
        found = self._auth_file.table().for_token(token)
        if found is None:
            raise Unauthenticated(
                f"{method}: the bearer token is not in the auth file (unknown or revoked)", metadata=meta
            )
        return found


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Wraps every snapcoord.v1 method (and reflection when auth is on); health passes through.

    The wrapped handler is built once per method and served to every call of it (the decision is
    made per call, inside it): gRPC runs interceptors on its one thread that accepts calls.
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._auth = authenticator
        self._memo = HandlerMemo()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._memo.served(handler_call_details.method, handler, self.wrap)

    def wrap(self, handler: grpc.RpcMethodHandler, path: str) -> grpc.RpcMethodHandler:
        method = path.lstrip("/")  # as people write it: snapcoord.v1.SnapshotService/GetSnapshot
        service = method.partition("/")[0]
        if service in OPEN_SERVICES:
            return handler
        if service in AUTHENTICATED_SERVICES:
            return self._authenticated_only(handler, method) if self._auth.enabled else handler
        rule = RULES.get(path)
        if rule is None and service not in API_SERVICES:
            # Not the API, health or reflection (a test's probe service): unscoped admins only.
            return self._authenticated_only(handler, method, admin=True) if self._auth.enabled else handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._guard(handler.unary_unary, method, rule),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._guard(handler.unary_stream, method, rule),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.stream_unary is not None and rule is not None and rule.first_message:
            # A streamed request whose first message names the ids (UploadCheckpoint): decided on
            # that message, before the servicer reads any other.
            return grpc.stream_unary_rpc_method_handler(
                self._guard_first(handler.stream_unary, method, rule),
                handler.request_deserializer,
                handler.response_serializer,
            )
        # Another API RPC with a streamed request: its ids are not known up front, so only an
        # unscoped admin may call it (none exists today).
        return self._authenticated_only(handler, method, admin=True)

    def _guard_first(
        self, behavior: Callable[[Any, grpc.ServicerContext], Any], method: str, rule: Rule
    ) -> Any:
        """``_guard`` for a client-streaming RPC: the rule reads the ids of the first message, and
        the servicer gets that message back at the head of the stream."""
        guarded = self._guard(
            lambda head, context: behavior(head.stream, context), method, rule, ids_of=lambda head: head.first
        )

        def run(request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
            request_iterator = until_ended(request_iterator, context)
            first = next(request_iterator, None)
            stream = itertools.chain(() if first is None else (first,), request_iterator)
            return guarded(_Head(first, stream), context)

        return run

    def _guard(
        self,
        behavior: Callable[[Any, grpc.ServicerContext], Any],
        method: str,
        rule: Rule | None,
        *,
        ids_of: Callable[[Any], Any] = lambda request: request,
    ) -> Any:
        """``ids_of(request)`` is the message the rule reads ids from (a stream's first one)."""
        auth = self._auth

        def run(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            principal: Principal | None = None
            ids: list[IdRef] = []
            code = grpc.StatusCode.OK
            try:
                if rule is None:
                    principal = auth.principal(context, method)
                    raise PermissionDenied(
                        f"{method} has no access rule in this coordinator; refused",
                        metadata={"principal": principal.name, "method": method},
                    )
                # Bytes that did not decode (or an empty stream) name no ids; the servicer answers
                # INVALID_ARGUMENT.
                named = ids_of(request)
                ids = [] if named is None or isinstance(named, MalformedRequest) else list(rule.ids(named))
                principal = auth.principal(context, method)
                decision = decide(principal, method, rule.access, ids)
                if not decision.allowed:
                    meta = {"principal": principal.name, "method": method}
                    if decision.refused is not None:
                        meta.update(kind=decision.refused[0].value, id=decision.refused[1])
                    raise PermissionDenied(decision.message, metadata=meta)
                if rule.results is not None and rule.access.filters is not None:
                    response = _scoped_page(behavior, request, context, rule, principal)
                else:
                    response = behavior(request, context)
                code = context.code() or grpc.StatusCode.OK
                return response
            except BaseException as e:
                code = _code_of(e, context)
                raise
            finally:
                if (rule is None or rule.access.mutates) and audit.enabled():
                    audit.write(
                        audit.audit_record(
                            principal=principal.name if principal is not None else "-",
                            method=method,
                            ids=ids,
                            code=code.name,
                            latency_ms=(time.perf_counter() - started) * 1000,
                            peer=context.peer(),
                        )
                    )

        return run

    def _authenticated_only(self, handler: grpc.RpcMethodHandler, method: str, *, admin: bool = False) -> Any:
        auth = self._auth

        def check(context: grpc.ServicerContext) -> None:
            principal = auth.principal(context, method)
            if admin and (principal.role is not Role.ADMIN or principal.scopes is not None):
                raise PermissionDenied(
                    f"{method} streams its request and needs an unscoped admin; {principal.name!r} is not",
                    metadata={"principal": principal.name, "method": method},
                )

        def wrap(behavior: Callable[..., Any]) -> Callable[..., Any]:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                check(context)
                return behavior(request, context)

            return run

        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                wrap(handler.stream_stream), handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                wrap(handler.stream_unary), handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                wrap(handler.unary_stream), handler.request_deserializer, handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(
            wrap(handler.unary_unary), handler.request_deserializer, handler.response_serializer
        )


class _Head:
    """A client stream's first message (for the rule's ids) and the whole stream (for the servicer)."""

    def __init__(self, first: Any, stream: Iterator[Any]) -> None:
        self.first = first
        self.stream = stream


def _scoped_page(
    behavior: Callable[[Any, grpc.ServicerContext], Any],
    request: Any,
    context: grpc.ServicerContext,
    rule: Rule,
    principal: Principal,
) -> Any:
    """A List call as ``principal``: only the records its scopes cover, and a next_page_token that
    names none outside them.

    The registry pages over every id in order, and its token names the last id of its page. For a
    scoped principal the page keeps only the covered records, and the token names the last record
    kept (the caller has seen it); a registry page with no covered record is not returned but
    followed here, skipping to just before the next scope prefix (between two covered ranges no id
    is covered), so a scoped page may hold fewer than page_size records and never reveals another
    id. When no prefix lies after the page, the listing ends (empty token).
    """
    assert rule.results is not None and rule.access.filters is not None and rule.page_token is not None
    field, id_field = rule.results
    kind = rule.access.filters
    if principal.role is Role.ADMIN or principal.scopes is None:
        return behavior(request, context)
    prefixes = principal.scopes.get(kind, ())
    while True:
        response = behavior(request, context)
        items = getattr(response, field)
        ids = [str(getattr(item, id_field)) for item in items]
        keep = [item for item, id_ in zip(items, ids, strict=True) if principal.covers(kind, id_)]
        token = str(response.next_page_token)
        after = _resume_after(ids[-1], prefixes) if token and ids else None
        if token and ids and after is None:
            token = ""  # nothing covered comes after this page
        elif token and keep:
            token = rule.page_token(str(getattr(keep[-1], id_field)))
        elif token:
            # Nothing covered on this page: read on (the caller never sees this token).
            request = _with_token(request, rule.page_token(after) if after is not None else token)
            continue
        if len(keep) != len(items):
            kept = [type(item)() for item in keep]
            for copy, item in zip(kept, keep, strict=True):
                copy.CopyFrom(item)
            del items[:]
            items.extend(kept)
        response.next_page_token = token
        return response


def _with_token(request: Any, token: str) -> Any:
    again = type(request)()
    again.CopyFrom(request)
    again.page_token = token
    return again


#: The characters of an id, in order (domain.ids).
_ID_CHARS = "".join(sorted("-.0123456789:ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"))


def _resume_after(last: str, prefixes: tuple[str, ...]) -> str | None:
    """The id to list on after, having listed up to ``last``, so that no covered id is skipped;
    None when no id after ``last`` starts with one of ``prefixes``."""
    if any(last.startswith(p) for p in prefixes):
        return last
    later = [p for p in prefixes if p > last]
    if not later:
        return None
    # Every id from ``last`` up to the next prefix is outside the scopes: skip them.
    jump = _just_before(min(later))
    return jump if jump is not None and jump > last else last


def _just_before(prefix: str) -> str | None:
    """The greatest valid id below ``prefix`` (so listing after it starts at ``prefix``), or None."""
    if not prefix or any(c not in _ID_CHARS for c in prefix):
        return None
    below = _ID_CHARS.index(prefix[-1]) - 1
    if below >= 0:
        jump = prefix[:-1] + _ID_CHARS[below] + _ID_CHARS[-1] * (MAX_ID_LENGTH - len(prefix))
    else:
        jump = prefix[:-1]
    return jump if is_valid_id(jump) else None


def _code_of(exc: BaseException, context: grpc.ServicerContext) -> grpc.StatusCode:
    """The status the caller will see for ``exc`` (``context.abort`` sets the code first)."""
    code = context.code()
    if type(exc) is Exception and code not in (None, grpc.StatusCode.OK):
        return code
    if isinstance(exc, Exception):
        return status_for(exc).code
    return grpc.StatusCode.CANCELLED
