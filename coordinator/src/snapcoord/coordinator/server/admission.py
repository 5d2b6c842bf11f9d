"""Request messages held in a memory budget from before gRPC receives them.

grpcio reads a unary call's request when a handler thread starts the call, as one message of up
to the receive limit, and parses it before the handler runs: as many whole messages at once as
there are handler threads, all outside any budget. So every unary method registered through
``AdmittedRegistration`` becomes, on the server side, a client-streaming method over raw bytes
(the wire is the same: one message, then the half-close). Its handler first holds
``message_hold`` (the receive limit, ``MESSAGE_COPIES`` times) from a budget, waiting for room like
any holder and refused with RESOURCE_EXHAUSTED when none comes; only then asks gRPC for the
message, shrinks the hold to that message's copies, parses it and runs the servicer's method
under the hold. Until a call is admitted gRPC holds no more of its message than the stream's
receive window (``memory_bounds``).

``Admission`` says which budget a method's messages come out of: ReportTaskSnapshot, whose
checkpoints are payload, from the payload budget; every other method from a small pool of its
own, so that a lease renewal or a health check waits for a few receipts at most, never for
payloads to drain.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from snapcoord.coordinator.errors import InvalidArgument
from snapcoord.coordinator.kernel.payload_admission import MESSAGE_COPIES, PayloadBudget

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

    def budget_for(self, method: str) -> PayloadBudget:
        return self.payloads if method in PAYLOAD_METHODS else self.control


def admit_handler(method: str, handler: grpc.RpcMethodHandler, admission: Admission) -> grpc.RpcMethodHandler:
    """``handler`` (unary-unary with a deserializer) as a client-streaming handler that holds its
    message's memory before receiving it; any other handler as it is."""
    deserialize = handler.request_deserializer
    unary = handler.unary_unary
    if unary is None or deserialize is None:
        return handler
    budget = admission.budget_for(method)
    what = f"{method.rsplit('/', 1)[-1]} (a request message of up to {admission.receive_limit_bytes} bytes)"

    def behavior(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
        with budget.hold(admission.hold_bytes, what) as held:
            raw = next(requests, None)
            if raw is None:
                raise InvalidArgument(f"{method}: the call ended without a request message")
            held.shrink(MESSAGE_COPIES * len(raw))
            request = deserialize(raw)
            del raw
            return unary(request, context)

    return grpc.stream_unary_rpc_method_handler(behavior, None, handler.response_serializer)


class _AdmittedGenericHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, inner: grpc.GenericRpcHandler, admission: Admission) -> None:
        self._inner = inner
        self._admission = admission

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        return admit_handler(str(handler_call_details.method).lstrip("/"), handler, self._admission)


class AdmittedRegistration:
    """Pass to ``add_*Servicer_to_server`` (or to another such stand-in) in place of the server:
    registers every unary method with ``admit_handler``."""

    def __init__(self, server: grpc.Server, admission: Admission) -> None:
        self._server = server
        self._admission = admission

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_AdmittedGenericHandler(h, self._admission) for h in handlers)
        )

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        admitted = {
            name: admit_handler(f"{service_name}/{name}", handler, self._admission)
            for name, handler in method_handlers.items()
        }
        self._server.add_registered_method_handlers(service_name, admitted)
