"""The server interceptor: exceptions become statuses, every call is counted and timed.

One place turns what a handler raises into what a caller sees (``status.status_for``): the code,
the message and the ``google.rpc.Status`` details trailer with the error's reason and metadata, so
servicers just raise ``SnapcoordError`` subclasses. The same wrapper records the standard gRPC
server metrics, because only it sees the final code of every call, including codes a handler sets
with ``context.abort`` or ``context.set_code``.

The wrapper keeps the shape of each handler: unary responses are recorded when the handler
returns, streamed responses when the stream ends (closed early = CANCELLED), and grpc_health's
non-blocking ``Watch`` (which returns at once and sends from other threads) when the RPC ends.

When a call finishes it is also logged (``call_log``: method, code, latency, request ids) and,
with tracing on, its SERVER span ends; the span is current while the handler runs, so the
stores' spans become its children. The tracer is a ``CallTracer`` (``tracing.Tracing`` when
the ``otel`` extra is in use), so this module never imports OpenTelemetry.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, NoReturn, Protocol

import grpc

from snapcoord.coordinator.observability.metrics import GrpcServerMetrics
from snapcoord.coordinator.transport import call_log
from snapcoord.coordinator.transport.handler_memo import HandlerMemo
from snapcoord.coordinator.transport.status import Status, status_for, unimplemented

_log = logging.getLogger(__name__)

#: grpc_code label values as go-grpc-prometheus writes them (Go's codes.Code names), so the
#: usual alert rules (grpc_code=~"Unknown|Internal|Unavailable|...") work unchanged.
_CODE_LABELS: dict[grpc.StatusCode, str] = {
    code: "Canceled" if code is grpc.StatusCode.CANCELLED else code.name.title().replace("_", "")
    for code in grpc.StatusCode
}
_CODE_LABELS[grpc.StatusCode.OK] = "OK"


class CallSpan(Protocol):
    """The trace span of one call (``tracing.RpcSpan``)."""

    trace_id: str | None

    def active(self) -> AbstractContextManager[None]: ...

    def each_active(self, responses: Iterator[Any]) -> Iterator[Any]: ...

    def record_exception(self, exc: BaseException) -> None: ...

    def finish(self, code: grpc.StatusCode, ids: dict[str, str | int]) -> None: ...


class CallTracer(Protocol):
    """Starts a call's span under the trace context its metadata carries (``tracing.Tracing``)."""

    def start_call(self, method: str, metadata: Sequence[tuple[str, Any]] | None) -> CallSpan: ...


#: Services whose calls get no span: health probes arrive every few seconds from every checker.
_UNTRACED_SERVICE_PREFIX = "grpc."


def code_label(code: grpc.StatusCode) -> str:
    """The ``grpc_code`` label value for ``code``."""
    return _CODE_LABELS[code]


def rpc_type_label(request_streaming: bool, response_streaming: bool) -> str:
    """The ``grpc_type`` label value of a method that streams requests and/or responses."""
    if request_streaming:
        return "bidi_stream" if response_streaming else "client_stream"
    return "server_stream" if response_streaming else "unary"


#: The call whose behaviour runs in this context: gRPC runs each call's behaviour in a
#: ``contextvars`` context of its own, so an inner layer finds its call's record here.
_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("snapcoord_call", default=None)


def note_request(context: grpc.ServicerContext, request: Any) -> None:
    """Tell the call's record which request message ``context``'s call carries (what its log line
    and span name): for a behaviour that reads its request itself (``UNARY_ON_THE_WIRE``), the
    interceptor saw only the raw stream. Called from the behaviour, in the call's context."""
    call = _CURRENT.get()
    if call is not None:
        call.parsed = request


#: Set on a request-streaming behaviour that serves a method with a unary request
#: (``server.admission`` reads its one request itself): its series keep the method's own type.
UNARY_ON_THE_WIRE = "snapcoord_unary_on_the_wire"


def _rpc_type(handler: grpc.RpcMethodHandler) -> str:
    behavior = handler.stream_unary or handler.stream_stream
    unary_request = getattr(behavior, UNARY_ON_THE_WIRE, False)
    return rpc_type_label(handler.request_streaming and not unary_request, handler.response_streaming)


def _split_method(full_method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` -> (``pkg.Service``, ``Method``)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or "unknown"


def _raised_by_generated_base(exc: BaseException) -> bool:
    """True when the innermost frame is a generated ``*_pb2_grpc`` servicer stub: the RPC exists in
    the proto but no subclass overrides it. A NotImplementedError from our own code is a bug."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).endswith("_pb2_grpc")


def _is_abort(exc: BaseException, context: grpc.ServicerContext) -> bool:
    """True when ``exc`` is what ``context.abort`` raises: a bare Exception with a code set."""
    return type(exc) is Exception and not exc.args and context.code() not in (None, grpc.StatusCode.OK)


def _abort(context: grpc.ServicerContext, call: _Call, status: Status) -> NoReturn:
    """End the RPC with ``status``: code, message and the details trailer (``context.abort`` raises)."""
    call.finish(status.code)
    context.set_trailing_metadata(status.trailing_metadata())
    context.abort(status.code, status.message)
    raise AssertionError("context.abort returned")  # pragma: no cover


class _MethodMetrics:
    """The metric series of one method, looked up once: prometheus_client's ``labels()`` takes a
    lock and builds a key on every call, three times per RPC otherwise."""

    def __init__(self, metrics: GrpcServerMetrics, labels: tuple[str, str, str]) -> None:
        self._metrics = metrics
        self._labels = labels
        self.started = metrics.started.labels(*labels)
        self.handling_seconds = metrics.handling_seconds.labels(*labels)
        self._handled: dict[grpc.StatusCode, Any] = {}

    def handled(self, code: grpc.StatusCode) -> Any:
        child = self._handled.get(code)
        if child is None:  # a race only looks up the same child twice
            child = self._handled[code] = self._metrics.handled.labels(*self._labels, code_label(code))
        return child


class _Call:
    """One RPC's metrics, log line and span; ``finish`` records it exactly once, from whichever
    thread ends it."""

    def __init__(
        self,
        metrics: _MethodMetrics,
        method: str,
        request: Any,
        span: CallSpan | None,
    ) -> None:
        self._metrics = metrics
        self._method = method
        self._request = request
        #: The request message an inner layer read from a raw stream (``note_request``).
        self.parsed: Any = None
        self.span = span
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._done = False
        metrics.started.inc()

    def active(self) -> AbstractContextManager[None]:
        """The call's span current in this thread, for the block (nothing without tracing)."""
        return self.span.active() if self.span is not None else contextlib.nullcontext()

    def finish(self, code: grpc.StatusCode) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        latency_s = time.perf_counter() - self._start
        self._metrics.handling_seconds.observe(latency_s)
        self._metrics.handled(code).inc()
        logged = call_log.wants_line(code)
        if self.span is None and not logged:
            return  # the common case at INFO: an OK call, no tracing; spare reading the ids
        request = self._request
        if isinstance(request, Iterator):  # raw bytes on the wire: the message an inner layer read
            request = self.parsed
        ids = call_log.request_ids(request)
        if self.span is not None:
            self.span.finish(code, ids)
        if logged:
            trace_id = self.span.trace_id if self.span is not None else None
            call_log.log_finished(self._method, code, latency_s, ids, trace_id)


class HandlerLayer(Protocol):
    """An inner interceptor run as part of ``ServerInterceptor`` (admission, auth): what it serves
    for a method, given the handler below it."""

    def wrap(self, handler: grpc.RpcMethodHandler, path: str) -> grpc.RpcMethodHandler: ...


class ServerInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Maps exceptions to statuses and records ``grpc_server_*`` metrics for every known method.

    ``layers`` are the server's other interceptors, outermost first, applied inside this one when a
    method's handler is built: one interceptor for gRPC to run per call instead of one per layer
    (gRPC runs them on its one thread that accepts calls, where each level of its interceptor
    pipeline costs every call).
    """

    def __init__(
        self,
        metrics: GrpcServerMetrics,
        *,
        version: str,
        tracer: CallTracer | None = None,
        layers: Sequence[HandlerLayer] = (),
    ) -> None:
        self._layers = tuple(reversed(layers))  # innermost first, as they are applied
        self._metrics = metrics
        self._version = version
        self._tracer = tracer
        self._open_streams = _OpenStreams()
        #: Per known method (a fixed set: unknown ones return early), the handler every call gets.
        self._memo = HandlerMemo()
        self._limit_reached: Callable[[], bool] = lambda: False

    def count_refusals(self, limit_reached: Callable[[], bool]) -> None:
        """Count the calls grpc refuses at its concurrency limit (``snapcoord_calls_refused_total``).

        ``limit_reached()`` is asked for each call of a known method; grpc runs the interceptors
        for a new call under its server lock, just before it decides whether to refuse it, so the
        answer at that moment is grpc's decision (``server.concurrency_limit_probe``).
        """
        self._limit_reached = limit_reached

    def end_open_streams(self) -> int:
        """End the server-pushed streams in flight (health Watch) with OK; returns how many.

        A Watch lasts until the client leaves, so during a drain it would hold the server for the
        whole grace period; ended after NOT_SERVING went out, its client reconnects elsewhere.
        """
        return self._open_streams.end_all()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            # Unknown method: grpc answers UNIMPLEMENTED itself. Not recorded, since the labels
            # would be whatever names a client sends (unbounded series).
            return None
        method: str = handler_call_details.method
        if self._limit_reached():
            service, name = _split_method(method)
            self._metrics.refused.labels(service, name).inc()
        return self._memo.served(method, handler, self._wrap)

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        for layer in self._layers:
            handler = layer.wrap(handler, method)
        service, name = _split_method(method)
        labels = (_rpc_type(handler), service, name)
        tracer = None if service.startswith(_UNTRACED_SERVICE_PREFIX) else self._tracer
        wrap = _Wrapper(self._metrics, self._version, method.lstrip("/"), labels, self._open_streams, tracer)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                wrap.unary_response(handler.unary_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                wrap.unary_response(handler.stream_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if handler.unary_stream is not None:
            behavior = handler.unary_stream
            wrapped = (
                wrap.non_blocking_stream(behavior)
                if getattr(behavior, "experimental_non_blocking", False)
                else wrap.streamed_response(behavior)
            )
            return grpc.unary_stream_rpc_method_handler(
                wrapped, handler.request_deserializer, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            wrap.streamed_response(handler.stream_stream),
            handler.request_deserializer,
            handler.response_serializer,
        )


class _Wrapper:
    """Wraps the behaviors of one method; holds what every call of it shares."""

    def __init__(
        self,
        metrics: GrpcServerMetrics,
        version: str,
        method: str,
        labels: tuple[str, str, str],
        open_streams: _OpenStreams,
        tracer: CallTracer | None,
    ) -> None:
        self._open_streams = open_streams
        self._tracer = tracer
        self._metrics = _MethodMetrics(metrics, labels)
        self._version = version
        self._method = method

    def _start(self, request: Any, context: grpc.ServicerContext) -> _Call:
        if _log.isEnabledFor(logging.DEBUG):  # peer() builds a string per call: only when logged
            _log.debug("rpc %s from %s", self._method, context.peer())
        span = None
        if self._tracer is not None:
            span = self._tracer.start_call(self._method, context.invocation_metadata())
        call = _Call(self._metrics, self._method, request, span)
        _CURRENT.set(call)  # in this call's own context: no reset needed
        return call

    def _fail(self, exc: Exception, context: grpc.ServicerContext, call: _Call) -> NoReturn:
        """Record and raise the status for ``exc`` (``context.abort`` raises)."""
        if _is_abort(exc, context):
            call.finish(context.code())
            raise exc
        if isinstance(exc, NotImplementedError) and _raised_by_generated_base(exc):
            _abort(
                context,
                call,
                unimplemented(
                    f"{self._method} is not implemented by this coordinator (snapcoord {self._version})"
                ),
            )
        status = status_for(exc)
        if status.unexpected:
            if call.span is not None:
                call.span.record_exception(exc)
            _log.error("%s failed with %s", self._method, type(exc).__name__, exc_info=exc)
        else:
            _log.debug("%s -> %s (%s): %s", self._method, status.code.name, status.reason, status.message)
        _abort(context, call, status)

    def unary_response(self, behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            call = self._start(request, context)
            with call.active():
                try:
                    response = behavior(request, context)
                except Exception as e:
                    self._fail(e, context, call)
            call.finish(context.code() or grpc.StatusCode.OK)
            return response

        return run

    def streamed_response(self, behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[..., Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            call = self._start(request, context)
            with call.active():
                try:
                    responses = iter(behavior(request, context))
                except Exception as e:
                    self._fail(e, context, call)
            if call.span is not None:
                responses = call.span.each_active(responses)
            return self._relay(responses, context, call)

        return run

    def _relay(self, responses: Iterator[Any], context: grpc.ServicerContext, call: _Call) -> Iterator[Any]:
        try:
            yield from responses
        except GeneratorExit:
            # grpc dropped the iterator before its end: the client went away or the server stopped.
            call.finish(context.code() or grpc.StatusCode.CANCELLED)
            raise
        except Exception as e:
            self._fail(e, context, call)
        call.finish(context.code() or grpc.StatusCode.OK)

    def non_blocking_stream(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        """For handlers marked ``experimental_non_blocking`` (grpc_health's Watch): they return at
        once and send through ``send_response_callback`` (None ends the stream) from any thread."""

        def run(
            request: Any, context: grpc.ServicerContext, send_response_callback: Callable[[Any], None]
        ) -> Any:
            stream = _PushedStream(self._start(request, context), context, send_response_callback)
            self._open_streams.add(stream)
            # Registered before the behavior's own callbacks, so it runs first when the RPC ends:
            # a stream that ends without anyone sending its end was cancelled.
            context.add_callback(lambda: self._open_streams.discard(stream, grpc.StatusCode.CANCELLED))
            try:
                return behavior(request, context, stream.send)
            except Exception as e:
                self._open_streams.discard(stream, None)
                self._fail(e, context, stream.call)

        run.experimental_non_blocking = True  # type: ignore[attr-defined]
        run.experimental_thread_pool = getattr(behavior, "experimental_thread_pool", None)  # type: ignore[attr-defined]
        return run


class _PushedStream:
    """One non-blocking server stream: forwards responses until its end is sent, exactly once."""

    def __init__(
        self, call: _Call, context: grpc.ServicerContext, send_response_callback: Callable[[Any], None]
    ) -> None:
        self.call = call
        self._context = context
        self._send = send_response_callback
        # Lock order: the behavior's own lock (grpc_health holds its lock while it sends), then
        # this one, then grpc's call state. end() takes only this one and grpc's.
        self._lock = threading.Lock()
        self._ended = False

    def send(self, response: Any) -> None:
        with self._lock:
            if self._ended:
                return  # grpc_health sends None again from its close callback
            if response is None:
                self._ended = True
                self.call.finish(self._context.code() or grpc.StatusCode.OK)
            self._send(response)

    def end(self) -> None:
        self.send(None)


class _OpenStreams:
    """The non-blocking streams in flight, so a drain can end them instead of waiting them out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: set[_PushedStream] = set()

    def add(self, stream: _PushedStream) -> None:
        with self._lock:
            self._streams.add(stream)

    def discard(self, stream: _PushedStream, code: grpc.StatusCode | None) -> None:
        with self._lock:
            self._streams.discard(stream)
        if code is not None:
            stream.call.finish(code)

    def end_all(self) -> int:
        with self._lock:
            streams = list(self._streams)
        for stream in streams:  # outside our lock: ending one runs its RPC's callbacks
            stream.end()
        return len(streams)
