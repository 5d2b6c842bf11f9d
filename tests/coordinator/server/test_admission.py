"""A unary request message is held from a budget before gRPC is asked for it: the hold covers a
message at the receive limit, shrinks to the message's copies once it is in, and lasts until the
method returns; a call with no room is refused before its message is read. Payload-carrying
methods hold from the payload budget, the others from the control pool, or from the payload budget
when the pool is taken and that has room with no call waiting for it. The interceptor builds a
method's admitted handler once. (The server process under load: test_memory_bound.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from snapcoord.coordinator.errors import InvalidArgument, ResourceExhausted
from snapcoord.coordinator.kernel.payload_admission import MESSAGE_COPIES, PayloadBudget
from snapcoord.coordinator.server.admission import Admission, AdmissionInterceptor, admit_handler

REPORT = "snapcoord.v1.SnapshotService/ReportTaskSnapshot"
RENEW = "snapcoord.v1.LeaseService/RenewLease"
HOLD = 1000


def admission(payload_bytes: int = 10_000, control_bytes: int = 10_000) -> Admission:
    return Admission(PayloadBudget(payload_bytes, 0), PayloadBudget(control_bytes, 0), HOLD, HOLD // 3)


class Messages:
    """A request iterator that records what the budgets held when the message was asked for."""

    def __init__(self, admitted: Admission, raw: bytes | None) -> None:
        self._admission = admitted
        self._raw = raw
        self.asked_with: list[tuple[int, int]] = []

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        self.asked_with.append((self._admission.payloads.in_flight, self._admission.control.in_flight))
        if self._raw is None:
            raise StopIteration
        raw, self._raw = self._raw, None
        return raw


class Context:
    """What ``until_ended`` asks of a live call."""

    def is_active(self) -> bool:
        return True

    def time_remaining(self) -> float:
        return 60.0


def handler_of(method: str, admitted: Admission, seen: list[tuple[Any, int, int]]) -> grpc.RpcMethodHandler:
    def behavior(request: Any, context: Any) -> str:
        seen.append((request, admitted.payloads.in_flight, admitted.control.in_flight))
        return "reply"

    plain = grpc.unary_unary_rpc_method_handler(behavior, lambda b: b.decode(), lambda s: s.encode())
    return admit_handler(method, plain, admitted)


def test_a_payload_call_holds_a_whole_message_before_reading_and_its_copies_after() -> None:
    admitted = admission()
    seen: list[tuple[Any, int, int]] = []
    handler = handler_of(REPORT, admitted, seen)
    assert handler.unary_unary is None and handler.request_deserializer is None  # raw bytes in
    messages = Messages(admitted, b"0123456789")
    assert handler.stream_unary(messages, Context()) == "reply"
    assert messages.asked_with == [(HOLD, 0)]
    assert seen == [("0123456789", MESSAGE_COPIES * 10, 0)]
    assert admitted.payloads.in_flight == 0


def test_other_methods_hold_from_the_control_pool() -> None:
    admitted = admission()
    seen: list[tuple[Any, int, int]] = []
    messages = Messages(admitted, b"abc")
    assert handler_of(RENEW, admitted, seen).stream_unary(messages, Context()) == "reply"
    assert messages.asked_with == [(0, HOLD)]
    assert seen == [("abc", 0, MESSAGE_COPIES * 3)]
    assert admitted.control.in_flight == 0


def test_a_call_without_room_is_refused_before_its_message_is_read() -> None:
    admitted = admission(payload_bytes=HOLD)
    seen: list[tuple[Any, int, int]] = []
    messages = Messages(admitted, b"x")
    with admitted.payloads.hold(1, "another call"), pytest.raises(ResourceExhausted) as refused:
        handler_of(REPORT, admitted, seen).stream_unary(messages, Context())
    assert "ReportTaskSnapshot (a request message of up to 333 bytes) needs 1000" in str(refused.value)
    assert messages.asked_with == [] and seen == []
    # The control pool is apart: a lease renewal still gets in.
    assert handler_of(RENEW, admitted, seen).stream_unary(Messages(admitted, b"r"), Context()) == "reply"


def test_a_call_without_a_message_is_refused() -> None:
    admitted = admission()
    with pytest.raises(InvalidArgument, match="without a request message"):
        handler_of(REPORT, admitted, []).stream_unary(Messages(admitted, None), Context())
    assert admitted.payloads.in_flight == 0


def test_streaming_handlers_are_left_as_they_are() -> None:
    upload = grpc.stream_unary_rpc_method_handler(lambda it, ctx: None, bytes, bytes)
    assert admit_handler("snapcoord.v1.SnapshotService/UploadCheckpoint", upload, admission()) is upload


def test_a_streamed_answer_holds_its_request_until_the_last_response() -> None:
    admitted = admission()

    def pieces(request: str, context: Any) -> Iterator[tuple[str, int]]:
        for piece in request:
            yield piece, admitted.control.in_flight

    plain = grpc.unary_stream_rpc_method_handler(pieces, lambda b: b.decode(), None)
    handler = admit_handler("snapcoord.v1.SnapshotService/ReadCheckpoint", plain, admitted)
    assert handler.unary_stream is None and handler.request_deserializer is None
    messages = Messages(admitted, b"ab")
    answers = handler.stream_stream(messages, Context())
    assert messages.asked_with == []  # nothing is read before the first answer is asked for
    assert list(answers) == [("a", MESSAGE_COPIES * 2), ("b", MESSAGE_COPIES * 2)]
    assert messages.asked_with == [(0, HOLD)]
    assert admitted.control.in_flight == 0


def test_with_the_control_pool_taken_a_call_borrows_from_the_payload_budget() -> None:
    admitted = admission(payload_bytes=2 * HOLD, control_bytes=HOLD)
    seen: list[tuple[Any, int, int]] = []
    with admitted.control.hold(1, "another call"):
        messages = Messages(admitted, b"abc")
        assert handler_of(RENEW, admitted, seen).stream_unary(messages, Context()) == "reply"
    assert messages.asked_with == [(HOLD, 1)]  # a whole message held, from the payload budget
    assert seen == [("abc", MESSAGE_COPIES * 3, 1)]  # then its copies, still from there
    assert admitted.payloads.in_flight == 0 and admitted.control.in_flight == 0


def test_a_control_call_does_not_borrow_past_a_payload_call_that_waits() -> None:
    admitted = Admission(PayloadBudget(2 * HOLD, 120), PayloadBudget(HOLD, 0), HOLD, HOLD // 3)
    seen: list[tuple[Any, int, int]] = []
    replies: list[str] = []
    first = admitted.payloads.take(HOLD + 1, "a large GetSnapshot")  # a report (HOLD) must wait

    def send_report() -> None:
        replies.append(handler_of(REPORT, admitted, seen).stream_unary(Messages(admitted, b"r"), Context()))

    report = threading.Thread(target=send_report)
    report.start()
    deadline = time.monotonic() + 120
    while admitted.payloads._waiting == 0:
        assert time.monotonic() < deadline, "the report never waited"
        time.sleep(0.01)
    # HOLD would fit in the payload budget beside the first call, but the report waits for it:
    # a renewal with the control pool taken waits for the pool (refused at once here, wait 0).
    with admitted.control.hold(1, "another call"), pytest.raises(ResourceExhausted):
        handler_of(RENEW, admitted, seen).stream_unary(Messages(admitted, b"x"), Context())
    assert admitted.payloads.in_flight == HOLD + 1
    first.release()
    report.join(120)
    assert replies == ["reply"] and [s[0] for s in seen] == ["r"]
    assert admitted.payloads.in_flight == 0 and admitted.control.in_flight == 0


class Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def test_the_interceptor_builds_a_methods_handler_once_and_admits_every_call() -> None:
    admitted = admission()
    seen: list[tuple[Any, int, int]] = []

    def behavior(request: Any, context: Any) -> str:
        seen.append((request, admitted.payloads.in_flight, admitted.control.in_flight))
        return "reply"

    plain = grpc.unary_unary_rpc_method_handler(behavior, lambda b: b.decode(), lambda s: s.encode())
    interceptor = AdmissionInterceptor()
    assert interceptor.intercept_service(lambda d: plain, Details("/" + RENEW)) is plain  # not admitted yet
    interceptor.admit(admitted)
    served = [interceptor.intercept_service(lambda d: plain, Details("/" + RENEW)) for _ in range(3)]
    assert served[0] is not plain and all(s is served[0] for s in served)
    for i, handler in enumerate(served):
        assert handler is not None
        messages = Messages(admitted, f"m{i}".encode())
        assert handler.stream_unary(messages, Context()) == "reply"
        assert messages.asked_with == [(0, HOLD)]
    assert seen == [(f"m{i}", 0, MESSAGE_COPIES * 2) for i in range(3)]
    # Another handler object for the method (say, registered anew) is wrapped anew.
    other = grpc.unary_unary_rpc_method_handler(behavior, lambda b: b.decode(), lambda s: s.encode())
    assert interceptor.intercept_service(lambda d: other, Details("/" + RENEW)) is not served[0]
