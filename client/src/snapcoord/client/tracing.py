"""Trace context for calls to the coordinator, when the caller's process has OpenTelemetry.

The client depends on grpcio and protobuf only. If ``opentelemetry`` (the API) is importable in
the caller's process, every call runs in a CLIENT span of its own and sends the W3C
``traceparent`` (and ``tracestate``/``baggage``, per the global propagator) as gRPC metadata, so
the coordinator's server span, and its ZooKeeper and S3 spans, join the caller's trace. Without
OpenTelemetry, or with no tracer provider configured, nothing is sent and nothing is recorded.

For work that hops threads or processes (a Spark micro-batch run on a callback thread, tasks on
executors), carry the context explicitly::

    carrier = tracing.inject()            # on the driver, inside the batch's span: a small dict
    ...ship carrier with the task...
    with tracing.attached(carrier):       # in the task, before it calls the coordinator
        client.report_task_snapshot(...)

and open a span around a unit of work with ``tracing.span("name", key=value)``. All three are
no-ops without OpenTelemetry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import context as _otel_context
    from opentelemetry import propagate as _otel_propagate
    from opentelemetry import trace as _otel_trace

    AVAILABLE = True
except ImportError:  # the caller's process has no OpenTelemetry: tracing is off, silently
    AVAILABLE = False

_INSTRUMENTATION = "snapcoord.client"

#: On the client side every code but OK marks the span failed (OpenTelemetry's gRPC conventions).
_OK = "OK"


def inject() -> dict[str, str]:
    """The current trace context as string headers (``traceparent``...); empty without a trace."""
    carrier: dict[str, str] = {}
    if AVAILABLE:
        _otel_propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def attached(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the context in ``carrier`` (from ``inject``) current for the block."""
    if not AVAILABLE or not carrier:
        yield
        return
    token = _otel_context.attach(_otel_propagate.extract(dict(carrier)))
    try:
        yield
    finally:
        _otel_context.detach(token)


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    """A span named ``name`` around the block, current inside it (a child of the current span)."""
    if not AVAILABLE:
        yield
        return
    tracer = _otel_trace.get_tracer(_INSTRUMENTATION)
    clean = {k: v for k, v in attributes.items() if isinstance(v, (str, bool, int, float))}
    with tracer.start_as_current_span(name, attributes=clean):
        yield


class CallSpan:
    """One call's CLIENT span: its headers for every attempt, and its outcome.

    Without a span of its own (no tracer provider configured) it still forwards the current
    context when ``forward``: a task that ``attached`` its driver's carrier passes it on.
    """

    def __init__(self, span: Any, *, forward: bool = False) -> None:
        self._span = span
        self._forward = forward

    def metadata(self, base: tuple[tuple[str, str], ...] | None) -> tuple[tuple[str, str], ...] | None:
        """``base`` plus the trace headers of this span (``base`` as it is without a trace)."""
        if self._span is None and not self._forward:
            return base
        carrier: dict[str, str] = {}
        if self._span is not None:
            _otel_propagate.inject(carrier, context=_otel_trace.set_span_in_context(self._span))
        else:
            _otel_propagate.inject(carrier)
        if not carrier:
            return base
        return (*(base or ()), *carrier.items())

    def finish(self, code: str, attempts: int) -> None:
        if self._span is None:
            return
        self._span.set_attribute("rpc.grpc.status_code_name", code)
        if attempts > 1:
            self._span.set_attribute("snapcoord.attempts", attempts)
        if code != _OK:
            self._span.set_status(_otel_trace.Status(_otel_trace.StatusCode.ERROR, code))


_tracer_of: tuple[Any, Any] | None = None  # (provider, its tracer): get_tracer is not free


def _tracer() -> Any:
    """The client's tracer from the configured provider; None when none is configured (the API
    alone, or OTEL_SDK_DISABLED), where a span would record nothing and cost a few microseconds."""
    global _tracer_of
    provider = _otel_trace.get_tracer_provider()
    if isinstance(provider, (_otel_trace.ProxyTracerProvider, _otel_trace.NoOpTracerProvider)):
        return None
    cached = _tracer_of
    if cached is None or cached[0] is not provider:
        cached = _tracer_of = (provider, provider.get_tracer(_INSTRUMENTATION))
    return cached[1]


@contextlib.contextmanager
def call_span(service: str, method: str) -> Iterator[CallSpan]:
    """The CLIENT span of one call (retries included), current inside the block."""
    tracer = _tracer() if AVAILABLE else None
    if tracer is None:
        yield CallSpan(None, forward=AVAILABLE)
        return
    with tracer.start_as_current_span(
        f"{service}/{method}",
        kind=_otel_trace.SpanKind.CLIENT,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
        # The outcome is set from the status code; an exception here is that status, not news.
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        yield CallSpan(current if current.get_span_context().is_valid else None)
