"""Request messages held in a memory budget from before gRPC receives them.

grpcio reads a unary request when a handler thread starts the call, as one message of up to the
receive limit, and parses it before the handler runs: as many whole messages at once as there
are handler threads, all outside any budget. So ``AdmissionInterceptor`` serves every method of
the API and health with a unary request as, on the server side, one with a request stream of raw
bytes (the wire is the same: one message, then the half-close). Its handler first holds
``message_hold`` (the receive limit, ``MESSAGE_COPIES`` times) from a budget, waiting for room like
any holder and refused with RESOURCE_EXHAUSTED when none comes; only then asks gRPC for the
message, shrinks the hold to that message's copies, parses it and runs the servicer's method
under the hold. Until a call is admitted gRPC holds no more of its message than the stream's
receive window (``memory_bounds``).

``Admission`` says which budget a method's messages come out of: ReportTaskSnapshot, whose
checkpoints are payload, from the payload budget; every other method from a small pool of its
own, so that a lease renewal or a health check waits for a few receipts at most, never for
payloads to drain. The pool holds two receipts, and more small calls at once than that would
queue for it (docs/performance.md, the admission tax), so when the pool is taken a call borrows
its receipt from the payload budget, if that has room at once and no call waits for it there;
otherwise it waits for the pool. Every byte is still held from one of the two budgets, so the
worst case (``memory_bounds``) is the same.

The wrapped handler is built once per method (``AdmissionInterceptor``): gRPC runs interceptors on
its one thread that accepts calls, so anything built there per call limits every call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from snapcoord.coordinator.errors import InvalidArgument
from snapcoord.coordinator.kernel.payload_admission import MESSAGE_COPIES, Held, PayloadBudget
from snapcoord.coordinator.transport.handler_memo import HandlerMemo
from snapcoord.coordinator.transport.interceptors import UNARY_ON_THE_WIRE, note_request
from snapcoord.coordinator.transport.status import until_ended

#: The services whose unary methods are admitted: the API and health (a probe's check is a few
#: bytes, but a request of any size up to the receive limit would be read).
ADMITTED_SERVICES = ("snapcoord.v1.", "grpc.health.v1.")
#: Methods whose request carries checkpoint payloads inline: their messages count against the
#: payload budget.
PAYLOAD_METHODS = frozenset({"snapcoord.v1.SnapshotService/ReportTaskSnapshot"})


@dataclass(frozen=True)
class Admission:
    """The budgets request messages are held from, and how much a receipt holds."""

    payloads: PayloadBudget
    control: PayloadBudget
    #: What a call holds while its message is received (``payload_admission.message_hold``).
    hold_bytes: int
    #: gRPC's receive limit, for the refusal's message.
    receive_limit_bytes: int

    def receipt(self, method: str, what: str) -> Held:
        """Hold a message at the receive limit for a call of ``method`` (waiting for room, or
        ResourceExhausted); the caller releases it. A control method takes the control pool, else
        borrows from the payload budget when that has room now and no waiter, else waits for the
        pool."""
        if method in PAYLOAD_METHODS:
            return self.payloads.take(self.hold_bytes, what)
        held = self.control.try_take(self.hold_bytes) or self.payloads.try_take(self.hold_bytes)
        return held if held is not None else self.control.take(self.hold_bytes, what)


def admit_handler(method: str, handler: grpc.RpcMethodHandler, admission: Admission) -> grpc.RpcMethodHandler:
    """``handler``, with a unary request and a deserializer, as the same handler over a raw
    request stream that holds its message's memory before receiving it; any other handler (a
    streamed request, a non-blocking behaviour) as it is."""
    deserialize = handler.request_deserializer
    if deserialize is None or handler.request_streaming:
        return handler
    what = f"{method.rsplit('/', 1)[-1]} (a request message of up to {admission.receive_limit_bytes} bytes)"

    def receive(requests: Iterator[bytes], context: grpc.ServicerContext, held: Held) -> Any:
        raw = next(until_ended(requests, context), None)
        if raw is None:
            raise InvalidArgument(f"{method}: the call ended without a request message")
        held.shrink(MESSAGE_COPIES * len(raw))
        request = deserialize(raw)
        note_request(context, request)
        return request

    unary = handler.unary_unary
    if unary is not None:

        def behavior(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            held = admission.receipt(method, what)
            try:
                return unary(receive(requests, context, held), context)
            finally:
                held.release()

        setattr(behavior, UNARY_ON_THE_WIRE, True)  # its metrics say unary, as the method is
        return grpc.stream_unary_rpc_method_handler(behavior, None, handler.response_serializer)
    streamed = handler.unary_stream
    if getattr(streamed, "experimental_non_blocking", False):
        return handler

    def streaming(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
        # A generator: gRPC reads the request when it asks for the first response, under the hold.
        held = admission.receipt(method, what)
        try:
            yield from streamed(receive(requests, context, held), context)
        finally:
            held.release()

    setattr(streaming, UNARY_ON_THE_WIRE, True)  # its metrics say server_stream
    return grpc.stream_stream_rpc_method_handler(streaming, None, handler.response_serializer)


class AdmissionInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Serves every unary method of ``ADMITTED_SERVICES`` through ``admit_handler``.

    It sits inside the main interceptor, which then records and maps its refusals like any
    other error (and labels the method ``unary``, ``UNARY_ON_THE_WIRE``), and outside the auth
    interceptor, which gets the parsed request it decides on. ``admit`` gives it the budgets once
    they exist (they are built with the services, after the server); until then calls pass.
    """

    def __init__(self) -> None:
        self._admission: Admission | None = None
        self._memo = HandlerMemo()

    def admit(self, admission: Admission) -> None:
        """Admit every call from now on; before the server starts, since a method's handler,
        once built for its first call, is kept (here and in the main interceptor)."""
        self._admission = admission
        self._memo.clear()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or self._admission is None:
            return handler
        return self._memo.served(handler_call_details.method, handler, self.wrap)

    def wrap(self, handler: grpc.RpcMethodHandler, path: str) -> grpc.RpcMethodHandler:
        method = path.lstrip("/")
        if self._admission is None or not method.startswith(ADMITTED_SERVICES):
            return handler
        return admit_handler(method, handler, self._admission)
