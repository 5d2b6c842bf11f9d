"""Malformed request bytes become INVALID_ARGUMENT naming the RPC and the request type.

grpcio deserializes a request before any handler or interceptor runs; when the deserializer
raises, grpcio logs it and answers INTERNAL "Exception deserializing request!", which blames the
server for the caller's bytes. So every handler's deserializer is wrapped at registration: a
failure returns a ``MalformedRequest`` marker instead of raising, and the wrapped behaviour turns
the marker into ``InvalidArgument``. It raises from inside the behaviour, so the interceptor maps
and counts it like any other error.

``GuardedRegistration`` stands in for the ``grpc.Server`` the generated ``add_*_to_server``
functions register on; they call ``add_generic_rpc_handlers`` and (grpcio >= 1.62)
``add_registered_method_handlers``, and both are wrapped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.errors import InvalidArgument
from snapcoord.coordinator.transport.handler_memo import HandlerMemo


@dataclass(frozen=True)
class MalformedRequest:
    """What a wrapped deserializer returns for bytes that are not a valid request."""

    size: int
    error: str


def _type_name(deserializer: Callable[[bytes], Any]) -> str:
    """The protobuf full name behind ``Message.FromString``; the callable's name otherwise."""
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    full_name = getattr(descriptor, "full_name", None)
    return str(full_name) if full_name else getattr(deserializer, "__qualname__", "request")


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as e:  # protobuf's DecodeError, or whatever a custom deserializer raises
            return MalformedRequest(len(data), f"{type(e).__name__}: {e}")

    return deserialize


def _refusal(method: str, type_name: str, bad: MalformedRequest) -> InvalidArgument:
    return InvalidArgument(
        f"{method}: the request body ({bad.size} bytes) is not a valid {type_name} "
        f"({quote_prefix(bad.error, 80)}); check that client and server use the same snapcoord.v1 protos"
    )


def _checked_one(method: str, type_name: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    def run(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, MalformedRequest):
            raise _refusal(method, type_name, request)
        return behavior(request, context)

    return run


def _checked_stream(method: str, type_name: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    def requests(items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            if isinstance(item, MalformedRequest):
                raise _refusal(method, type_name, item)
            yield item

    def run(request_iterator: Iterable[Any], context: grpc.ServicerContext) -> Any:
        return behavior(requests(request_iterator), context)

    return run


def guard_handler(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with a deserializer that never raises and a behaviour that refuses bad bytes."""
    deserializer = handler.request_deserializer
    if deserializer is None:
        return handler  # raw bytes in: nothing to decode, nothing to refuse
    type_name = _type_name(deserializer)
    safe = _safe(deserializer)
    serializer = handler.response_serializer
    if handler.unary_unary is not None:
        behavior = _checked_one(method, type_name, handler.unary_unary)
        return grpc.unary_unary_rpc_method_handler(behavior, safe, serializer)
    if handler.unary_stream is not None:
        behavior = _checked_one(method, type_name, handler.unary_stream)
        return grpc.unary_stream_rpc_method_handler(behavior, safe, serializer)
    if handler.stream_unary is not None:
        behavior = _checked_stream(method, type_name, handler.stream_unary)
        return grpc.stream_unary_rpc_method_handler(behavior, safe, serializer)
    behavior = _checked_stream(method, type_name, handler.stream_stream)
    return grpc.stream_stream_rpc_method_handler(behavior, safe, serializer)


class _GuardedGenericHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Serves, per method, the guarded handler built once (asked on every call of a method that
    the client did not call as registered)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._memo = HandlerMemo()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return self._memo.served(str(handler_call_details.method), handler, _guard_path)


def _guard_path(handler: grpc.RpcMethodHandler, path: str) -> grpc.RpcMethodHandler:
    return guard_handler(path.lstrip("/"), handler)


class GuardedRegistration:
    """Pass to ``add_*Servicer_to_server`` in place of the server: registers guarded handlers."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGenericHandler(h) for h in handlers))

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        guarded = {
            name: guard_handler(f"{service_name}/{name}", handler)
            for name, handler in method_handlers.items()
        }
        self._server.add_registered_method_handlers(service_name, guarded)
