"""OpenTelemetry tracing (the ``otel`` extra): a SERVER span per RPC, child spans at the storage edge.

Imported only when tracing is on (``--otel-exporter`` other than ``none``; ``config`` refuses
that value when the extra is missing), so the coordinator runs without OpenTelemetry installed.

- Each RPC gets a SERVER span named ``snapcoord.v1.Service/Method``, a child of the W3C trace
  context the caller sent (``traceparent`` metadata, through the global propagator, so
  ``OTEL_PROPAGATORS`` applies), with the gRPC status code and the request ids as attributes.
- The stores are wrapped (``trace_metadata``, ``trace_blobs``) so that every ZooKeeper read,
  write or transaction and every S3 call is a CLIENT span under the RPC's span; calls made
  outside any trace (start-up checks, health probes) are not traced. The backends stay
  untouched; the wrapper forwards anything it does not trace, so backend-specific attributes
  still work.
- Each janitor pass is a root INTERNAL span ``janitor.pass`` with a child per step it ran
  (``janitor.lease-expiry``...), and the steps' store calls under those (``janitor_span``).
- The SDK reads the standard variables itself: ``OTEL_SERVICE_NAME`` and
  ``OTEL_RESOURCE_ATTRIBUTES`` (service name ``snapcoord`` unless they set one),
  ``OTEL_TRACES_SAMPLER``/``_ARG`` (default: parent-based, always on), ``OTEL_EXPORTER_OTLP_*``
  (endpoint, headers, TLS, timeout) and ``OTEL_BSP_*`` (batching).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.trace import SpanKind, Status, StatusCode

from snapcoord.coordinator import __version__, errors
from snapcoord.coordinator.config.settings import TracingConfig
from snapcoord.coordinator.observability import logging_setup
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore

INSTRUMENTATION = "snapcoord.coordinator"

#: Codes that mark a SERVER span failed (OpenTelemetry's gRPC conventions: a caller's mistake such
#: as NOT_FOUND or INVALID_ARGUMENT is not the server's error).
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)

#: Store outcomes that are answers, not failures (create-if-absent lost, version moved on...).
_EXPECTED_STORE_ERRORS = (errors.NotFound, errors.AlreadyExists, errors.Aborted, errors.FailedPrecondition)

#: Store methods that are not I/O worth a span: lifecycle, listeners, long-lived handles.
_UNTRACED = frozenset({"close", "is_usable", "add_state_listener", "watch", "election", "from_uri"})

#: Span-name prefix and ``db.system``-style label per URI scheme.
_METADATA_SYSTEMS = {"zk": "zookeeper", "file": "embedded"}
_BLOB_SYSTEMS = {"s3": "s3", "file": "localfs"}


class Tracing:
    """The tracer the server's spans come from, and the provider to flush at exit."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(INSTRUMENTATION, __version__)

    # -- RPCs -------------------------------------------------------------------------------------
    def start_call(self, method: str, metadata: Sequence[tuple[str, Any]] | None) -> RpcSpan:
        """Start the SERVER span of ``method`` (``pkg.Service/Method``) under the caller's context."""
        carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
        parent = propagate.extract(carrier)
        service, _, name = method.rpartition("/")
        span = self.tracer.start_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        return RpcSpan(span, trace.set_span_in_context(span, parent))

    # -- the storage edge -------------------------------------------------------------------------
    def trace_metadata(self, store: MetadataStore) -> MetadataStore:
        system = _METADATA_SYSTEMS.get(store.uri.partition(":")[0], "metadata")
        return cast(MetadataStore, _TracedStore(store, self.tracer, system, _metadata_attributes))

    def trace_blobs(self, store: BlobStore) -> BlobStore:
        system = _BLOB_SYSTEMS.get(store.uri.partition(":")[0], "blobs")
        return cast(BlobStore, _TracedStore(store, self.tracer, system, _blob_attributes))

    # -- the janitor ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def janitor_span(self, name: str, attributes: Mapping[str, str]) -> Iterator[_SpanNotes]:
        """An INTERNAL span, current while the block runs: the janitor's ``SpanFactory``. A pass
        starts in the janitor's own thread with no current span, so it is the root of its trace."""
        with self.tracer.start_as_current_span(
            name, kind=SpanKind.INTERNAL, attributes=dict(attributes)
        ) as span:
            yield _SpanNotes(span)

    def shutdown(self) -> None:
        """Export the spans still buffered; called once, at exit."""
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


class _SpanNotes:
    """The janitor's view of a span (``janitor.SpanNotes``)."""

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def set(self, key: str, value: str | int) -> None:
        self._span.set_attribute(key, value)

    def failed(self, error: BaseException) -> None:
        self._span.set_attribute("error.type", type(error).__name__)
        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


class RpcSpan:
    """One RPC's SERVER span: current while the handler runs, ended with the call's status."""

    def __init__(self, span: trace.Span, context: otel_context.Context) -> None:
        self._span = span
        self._context = context
        span_context = span.get_span_context()
        #: Hex trace id for the log line (also when not sampled: it still ties lines together).
        self.trace_id = trace.format_trace_id(span_context.trace_id) if span_context.is_valid else None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make the span current in this thread (the store wrappers' spans become its children)."""
        token = otel_context.attach(self._context)
        try:
            yield
        finally:
            otel_context.detach(token)

    def each_active(self, responses: Iterator[Any]) -> Iterator[Any]:
        """``responses``, with the span current while each one is produced (grpc pulls a streamed
        response from its own threads, outside ``active``)."""
        try:
            while True:
                with self.active():
                    try:
                        item = next(responses)
                    except StopIteration:
                        return
                yield item
        finally:
            # Closed early (the client left): close the handler's generator too, as ``yield from``
            # would have, so its own cleanup runs now.
            close = getattr(responses, "close", None)
            if close is not None:
                close()

    def record_exception(self, exc: BaseException) -> None:
        self._span.record_exception(exc)

    def finish(self, code: grpc.StatusCode, ids: dict[str, str | int]) -> None:
        span = self._span
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        for key, value in ids.items():
            span.set_attribute(f"snapcoord.{key}", value)
        if code in _SERVER_ERRORS:
            span.set_status(Status(StatusCode.ERROR, code.name))
        span.end()


# -- the store wrapper ----------------------------------------------------------------------------

#: Attributes of one store call, from its name and arguments; never data (payloads, node bytes).
AttributeFn = Callable[[str, tuple[Any, ...], dict[str, Any]], dict[str, Any]]


def _metadata_attributes(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    if op == "transaction" and args:
        ops = args[0]
        return {"snapcoord.zk.ops": len(ops), "snapcoord.zk.path": str(getattr(ops[0], "path", ""))}
    if op == "get_many" and args:
        return {"snapcoord.zk.paths": len(args[0])}
    if args and isinstance(args[0], str):
        return {"snapcoord.zk.path": args[0]}
    return {}


def _blob_attributes(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args and isinstance(args[0], str):
        out["snapcoord.blob.key" if op != "list" else "snapcoord.blob.prefix"] = args[0]
    if op == "put" and len(args) > 1 and isinstance(args[1], (bytes, bytearray, memoryview)):
        out["snapcoord.blob.bytes"] = len(args[1])
    return out


class _TracedStore:
    """Forwards every attribute to ``inner``; its public I/O methods run in a CLIENT span each.

    A proxy rather than a subclass of the store interface: a method the interface gains later
    (or a backend's own) is forwarded as the backend implements it, instead of falling back to
    an interface default. A method returning an iterator keeps its span open until the iterator
    is exhausted or closed, since that is when the listing's requests happen.
    """

    def __init__(self, inner: Any, tracer: trace.Tracer, system: str, attributes: AttributeFn) -> None:
        self._inner = inner
        self._tracer = tracer
        self._system = system
        self._attributes = attributes

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name.startswith("_") or name in _UNTRACED or not callable(value) or isinstance(value, type):
            return value
        traced = self._traced(name, value)
        self.__dict__[name] = traced  # bound to the inner store: stable, so cache it
        return traced

    def _traced(self, op: str, method: Callable[..., Any]) -> Callable[..., Any]:
        span_name = f"{self._system}.{op}"
        base = {"db.system": self._system, "db.operation.name": op}

        def call(*args: Any, **kwargs: Any) -> Any:
            if not trace.get_current_span().get_span_context().is_valid:
                # Outside any trace (the janitor's passes, start-up checks): a root span per
                # store call would only bury the RPC traces.
                return method(*args, **kwargs)
            attributes = {**base, **self._attributes(op, args, kwargs)}
            span = self._tracer.start_span(span_name, kind=SpanKind.CLIENT, attributes=attributes)
            try:
                with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                    result = method(*args, **kwargs)
            except BaseException as e:
                _end_failed(span, e)
                raise
            if isinstance(result, Iterator) and not isinstance(result, (bytes, str)):
                return _SpannedIterator(result, span)
            if op == "get" and isinstance(result, (bytes, bytearray)):
                span.set_attribute("snapcoord.blob.bytes", len(result))
            span.end()
            return result

        call.__name__ = op
        call.__doc__ = method.__doc__
        return call

    def __repr__(self) -> str:
        return f"Traced({self._inner!r})"


def _end_failed(span: trace.Span, exc: BaseException) -> None:
    span.set_attribute("error.type", type(exc).__name__)
    if not isinstance(exc, _EXPECTED_STORE_ERRORS):
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.end()


class _SpannedIterator(Iterator[Any]):
    """An iterator whose span ends with it: exhausted, failed, closed or collected."""

    def __init__(self, inner: Iterator[Any], span: trace.Span) -> None:
        self._inner = inner
        self._span: trace.Span | None = span
        self._count = 0

    def __next__(self) -> Any:
        if self._span is None:
            raise StopIteration
        try:
            with trace.use_span(self._span, record_exception=False, set_status_on_exception=False):
                item = next(self._inner)
        except StopIteration:
            self._end(None)
            raise
        except BaseException as e:
            self._end(e)
            raise
        self._count += 1
        return item

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()
        self._end(None)

    def _end(self, exc: BaseException | None) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        span.set_attribute("snapcoord.items", self._count)
        if exc is not None:
            _end_failed(span, exc)
        else:
            span.end()

    def __del__(self) -> None:
        self._end(None)


# -- process setup --------------------------------------------------------------------------------


def _resource() -> Resource:
    """``service.name`` ``snapcoord`` unless ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` set
    one; the version and ``host:pid`` as the instance id (replicas are told apart by it)."""
    detected = Resource.create({SERVICE_VERSION: __version__})
    ours: dict[str, str] = {SERVICE_INSTANCE_ID: f"{socket.gethostname()}:{os.getpid()}"}
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        ours[SERVICE_NAME] = "snapcoord"
    return detected.merge(Resource(ours))


def _processor(exporter: str) -> SpanProcessor:
    if exporter == "console":
        # One span per line on stdout, written at once: a debugging aid, not for production.
        console = ConsoleSpanExporter(out=sys.stdout, formatter=lambda span: span.to_json(indent=None) + "\n")
        return SimpleSpanProcessor(console)
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return BatchSpanProcessor(OTLPSpanExporter())
    raise ValueError(f"unknown OpenTelemetry exporter {exporter!r}")


def from_config(config: TracingConfig) -> Tracing:
    """The process's tracing: a provider with the configured exporter, made the global one (so
    log lines and any instrumented library find it); log lines gain the current trace id."""
    provider = TracerProvider(resource=_resource())
    provider.add_span_processor(_processor(config.exporter))
    trace.set_tracer_provider(provider)
    logging_setup.set_trace_ids(current_ids)
    return Tracing(provider)


def current_ids() -> tuple[str, str] | None:
    """Hex ``(trace_id, span_id)`` of the span current in this thread, if any."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return trace.format_trace_id(span_context.trace_id), trace.format_span_id(span_context.span_id)
