"""Tracing: a call through the real client becomes a client span, the coordinator's server span under
it, and the ZooKeeper and S3 spans under that (in-memory exporter, real stores); the CLI's console
exporter end to end; and a coordinator and a client without OpenTelemetry installed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from harness.coordinator import (
    CoordinatorProcess,
    ProbeService,
    embedded_deps,
    serve_in_process,
    snapcoord_command,
)
from harness.stores import Stores
from snapcoord.client import CoordinatorClient, NotFound, Offset, TaskSnapshot
from snapcoord.client import tracing as client_tracing
from snapcoord.coordinator.errors import NodeExistsError
from snapcoord.coordinator.observability.tracing import Tracing
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store

# One provider for the whole process: OpenTelemetry lets the global one be set once. The client
# reaches it through the global API, the in-process servers are handed it.
_EXPORTER = InMemorySpanExporter()
#: Offsets whose stored form is over the default inline limit (1 KiB), so that a registration
#: writes its payload to the blob store (the spans under test) instead of into its record.
S3_SIZED_OFFSETS = [Offset("orders", p, 1_000_000 + p) for p in range(64)]

_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    if trace.get_tracer_provider() is not _PROVIDER:
        trace.set_tracer_provider(_PROVIDER)
        assert trace.get_tracer_provider() is _PROVIDER, "another test set the global tracer provider"
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _one(spans: Any, name: str, kind: SpanKind) -> ReadableSpan:
    found: list[ReadableSpan] = [s for s in spans if s.name == name and s.kind == kind]
    assert len(found) == 1, [(s.name, s.kind) for s in spans]
    return found[0]


def _children(spans: Any, parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


REGISTER = "snapcoord.v1.ProducerOffsetService/RegisterProducerOffsets"


def test_one_rpc_is_a_server_span_under_the_client_span_with_zookeeper_and_s3_children(
    spans: InMemorySpanExporter, zk_uri: str, s3_uri: str
) -> None:
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(s3_uri)
    try:
        deps = Deps(metadata=metadata, blobs=blobs)
        with (
            serve_in_process(deps, tracing=Tracing(_PROVIDER)) as server,
            CoordinatorClient(server.target) as client,
            _PROVIDER.get_tracer("test").start_as_current_span("driver micro-batch") as batch,
        ):
            # More offsets than fit inline in the record (1 KiB): the payload goes to S3.
            assert client.register_producer_offsets("prod-7", S3_SIZED_OFFSETS).registered
    finally:
        blobs.close()
        metadata.close()
    finished = spans.get_finished_spans()
    trace_id = batch.get_span_context().trace_id
    assert {s.context.trace_id for s in finished if s.name != "driver micro-batch"} == {trace_id}

    client_span = _one(finished, REGISTER, SpanKind.CLIENT)
    assert client_span.parent is not None
    assert client_span.parent.span_id == batch.get_span_context().span_id

    server_span = _one(finished, REGISTER, SpanKind.SERVER)
    assert server_span.parent is not None and server_span.parent.is_remote  # came over the wire
    assert server_span.parent.span_id == client_span.context.span_id
    attributes = dict(server_span.attributes or {})
    assert attributes["rpc.grpc.status_code"] == 0
    assert attributes["rpc.service"] == "snapcoord.v1.ProducerOffsetService"
    assert attributes["snapcoord.producer_id"] == "prod-7"
    assert server_span.status.status_code is StatusCode.UNSET

    children = _children(finished, server_span)
    names = {s.name for s in children}
    assert "s3.put" in names, names  # the payload, written before the commit
    zk = [s for s in children if s.name.startswith("zookeeper.")]
    assert zk, names
    assert all(s.kind == SpanKind.CLIENT for s in children)
    assert all((s.attributes or {}).get("db.system") == "zookeeper" for s in zk)
    put = next(s for s in children if s.name == "s3.put")
    put_bytes = (put.attributes or {})["snapcoord.blob.bytes"]
    assert isinstance(put_bytes, int) and put_bytes > 0
    # The payload was written before ZooKeeper committed the record that points at it.
    commit = max(zk, key=lambda s: s.end_time or 0)
    assert put.end_time is not None and commit.start_time is not None and put.end_time <= commit.start_time


def test_a_callers_error_is_not_a_server_error_and_the_log_line_carries_the_trace_id(
    spans: InMemorySpanExporter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="snapcoord.rpc")
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, tracing=Tracing(_PROVIDER)) as server,
        CoordinatorClient(server.target) as client,
        pytest.raises(NotFound),
    ):
        client.get_producer_offsets("nobody")
    finished = spans.get_finished_spans()
    method = "snapcoord.v1.ProducerOffsetService/GetProducerOffsets"
    server_span = _one(finished, method, SpanKind.SERVER)
    assert dict(server_span.attributes or {})["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert server_span.status.status_code is StatusCode.UNSET  # NOT_FOUND is the caller's answer
    assert _one(finished, method, SpanKind.CLIENT).status.status_code is StatusCode.ERROR
    assert any(s.name == "embedded.get" for s in _children(finished, server_span))

    (record,) = [r for r in caplog.records if r.name == "snapcoord.rpc"]
    assert record.__dict__["trace_id"] == trace.format_trace_id(server_span.context.trace_id)
    assert record.__dict__["code"] == "NOT_FOUND" and record.__dict__["producer_id"] == "nobody"


def test_a_reports_span_names_its_ids_and_health_checks_are_not_traced(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, tracing=Tracing(_PROVIDER)) as server,
        CoordinatorClient(server.target) as client,
    ):
        snapshot = client.create_snapshot("app-1", ["t1"])
        client.report_task_snapshot("app-1", snapshot.generation, TaskSnapshot("t1", (), {"s": b"x" * 8192}))
        with server.channel() as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finished = spans.get_finished_spans()
    report = _one(finished, "snapcoord.v1.SnapshotService/ReportTaskSnapshot", SpanKind.SERVER)
    attributes = dict(report.attributes or {})
    assert (attributes["snapcoord.app_id"], attributes["snapcoord.generation"]) == (
        "app-1",
        snapshot.generation,
    )
    assert attributes["snapcoord.task_id"] == "t1"
    assert "localfs.put" in {s.name for s in _children(finished, report)}
    assert not [s for s in finished if "Health" in s.name]


def test_a_streamed_response_ends_its_span_when_the_stream_ends(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    probe = ProbeService()
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, handlers=[probe.handler()], tracing=Tracing(_PROVIDER)) as server,
        server.channel() as channel,
    ):
        count = channel.unary_stream(f"/{ProbeService.SERVICE}/Count")
        assert [bytes(m) for m in count(b"3", timeout=30)] == [b"0", b"1", b"2"]
        with pytest.raises(grpc.RpcError) as failed:
            list(count(b"2!", timeout=30))
        assert failed.value.code() == grpc.StatusCode.ABORTED
    method = f"{ProbeService.SERVICE}/Count"
    ended = [s for s in spans.get_finished_spans() if s.name == method]
    codes = sorted(dict(s.attributes or {})["rpc.grpc.status_code"] for s in ended)  # type: ignore[type-var]
    assert codes == [0, grpc.StatusCode.ABORTED.value[0]]


# -- the store wrapper --------------------------------------------------------------------------


def test_the_store_wrapper_traces_io_forwards_the_rest_and_keeps_listing_spans_open(
    spans: InMemorySpanExporter, stores: Stores
) -> None:
    tracing = Tracing(_PROVIDER)
    metadata = tracing.trace_metadata(stores.metadata)
    blobs = tracing.trace_blobs(stores.blobs)
    assert metadata.uri == stores.metadata.uri and metadata.is_usable()

    metadata.create("/outside", b"")  # no current span: not traced (the janitor's case)
    assert spans.get_finished_spans() == ()

    tracer = _PROVIDER.get_tracer("test")
    with tracer.start_as_current_span("parent") as parent:
        with pytest.raises(NodeExistsError):
            metadata.create("/outside", b"")
        blobs.put("a/1", b"one")
        blobs.put("a/2", b"two")
        listing = blobs.list("a/")
        assert not [s for s in spans.get_finished_spans() if s.name.endswith(".list")]  # still open
        assert [info.key for info in listing] == ["a/1", "a/2"]
    finished = spans.get_finished_spans()
    assert all(
        s.parent is not None and s.parent.span_id == parent.get_span_context().span_id
        for s in finished
        if s.name != "parent"
    )
    create = next(s for s in finished if s.name.endswith(".create"))
    assert (create.attributes or {})["error.type"] == "NodeExistsError"
    assert create.status.status_code is StatusCode.UNSET  # a lost create-if-absent is an answer
    (listed,) = [s for s in finished if s.name.endswith(".list")]
    assert (listed.attributes or {})["snapcoord.items"] == 2
    assert stores.metadata.get("/outside") is not None


# -- the command line ---------------------------------------------------------------------------

_BLOCKER = '''
"""Makes OpenTelemetry look uninstalled in this interpreter, and notes every attempt to import it."""
import os, sys

class _BlockOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            with open(os.environ["TEST_OTEL_BLOCK_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _BlockOpenTelemetry())
'''


@pytest.fixture
def without_otel(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Environment for a subprocess in which ``import opentelemetry`` fails; and its attempt log."""
    site = tmp_path / "no-otel"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCKER)
    attempts = tmp_path / "otel-import-attempts.txt"
    return {"PYTHONPATH": str(site), "TEST_OTEL_BLOCK_LOG": str(attempts)}, attempts


FORWARDED_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
FORWARDED_PARENT = "00f067aa0ba902b7"


def _span_lines(proc: CoordinatorProcess) -> list[dict[str, Any]]:
    """The console exporter's spans: the JSON objects with a span context among the coordinator's
    stdout lines (in a JSON log the serving line is a JSON object too)."""
    objects = [json.loads(line) for line in proc.stdout_lines() if line.startswith("{")]
    return [obj for obj in objects if "context" in obj]


@pytest.mark.process
def test_the_console_exporter_joins_the_callers_trace_and_the_logs_name_it(
    spans: InMemorySpanExporter, tmp_path: Path, without_otel: tuple[dict[str, str], Path]
) -> None:
    args = ["--otel-exporter", "console", "--log-format", "json"]
    with CoordinatorProcess(tmp_path / "server", args=args) as proc:
        with (
            CoordinatorClient(proc.target) as client,
            _PROVIDER.get_tracer("test").start_as_current_span("driver") as driver,
            pytest.raises(NotFound),
        ):
            client.get_lease("traced-lease")
        # A client process without OpenTelemetry sends no trace context: its call is a root span.
        env, attempts = without_otel
        plain = textwrap.dedent(
            f"""
            from snapcoord.client import CoordinatorClient, NotFound, tracing
            assert not tracing.AVAILABLE and tracing.inject() == {{}}
            with CoordinatorClient({proc.target!r}) as client:
                try:
                    client.get_lease("plain-lease")
                except NotFound:
                    print("not found, as expected")
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", plain],
            env={**_base_env(), **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "not found, as expected" in done.stdout, done.stderr
        assert "opentelemetry" in attempts.read_text()  # it did try, and went on without
        # A task process with the API but no tracer provider forwards the carrier it attached.
        forwarded = textwrap.dedent(
            f"""
            from snapcoord.client import CoordinatorClient, NotFound, tracing
            carrier = {{"traceparent": "00-{FORWARDED_TRACE}-{FORWARDED_PARENT}-01"}}
            with CoordinatorClient({proc.target!r}) as client, tracing.attached(carrier):
                try:
                    client.get_lease("forwarded-lease")
                except NotFound:
                    print("not found, as expected")
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", forwarded], env=_base_env(), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0 and "not found, as expected" in done.stdout, done.stderr
        assert proc.terminate() == 0  # flushes the exporter
    server_spans = [s for s in _span_lines(proc) if s["kind"] == "SpanKind.SERVER"]
    by_lease = {s["attributes"].get("snapcoord.lease_id"): s for s in server_spans}
    traced = by_lease["traced-lease"]
    client_span = _one(spans.get_finished_spans(), "snapcoord.v1.LeaseService/GetLease", SpanKind.CLIENT)
    assert traced["context"]["trace_id"] == f"0x{driver.get_span_context().trace_id:032x}"
    assert traced["parent_id"] == f"0x{client_span.context.span_id:016x}"
    assert traced["resource"]["attributes"]["service.name"] == "snapcoord"
    assert by_lease["plain-lease"]["parent_id"] is None
    assert by_lease["forwarded-lease"]["context"]["trace_id"] == f"0x{FORWARDED_TRACE}"
    assert by_lease["forwarded-lease"]["parent_id"] == f"0x{FORWARDED_PARENT}"

    rpc_lines = [json.loads(line) for line in proc.stderr_text().splitlines() if '"snapcoord.rpc"' in line]
    (logged,) = [line for line in rpc_lines if line.get("lease_id") == "traced-lease"]
    assert logged["trace_id"] == f"{driver.get_span_context().trace_id:032x}"


class _OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """A minimal OTLP/gRPC trace receiver: keeps what exporters send, as a collector would get it."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            self.requests.append(request)
            self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, str], Any]]:
        """(resource attributes, span) of every span received."""
        out: list[tuple[dict[str, str], Any]] = []
        with self._lock:
            for request in self.requests:
                for resource_spans in request.resource_spans:
                    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        out.extend((resource, span) for span in scope_spans.spans)
        return out


@pytest.mark.process
def test_the_otlp_exporter_sends_to_the_endpoint_the_standard_variables_name(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    receiver = _OtlpReceiver()
    collector = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, collector)  # type: ignore[no-untyped-call]
    port = collector.add_insecure_port("127.0.0.1:0")
    collector.start()
    try:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team-a",
            "OTEL_SERVICE_NAME": "snapcoord-eu1",
        }
        with CoordinatorProcess(tmp_path, args=["--otel-exporter", "otlp"], env=env) as proc:
            with (
                CoordinatorClient(proc.target) as client,
                _PROVIDER.get_tracer("test").start_as_current_span("driver") as driver,
            ):
                client.register_producer_offsets("otlp-producer", S3_SIZED_OFFSETS)
            assert proc.terminate() == 0  # the batch processor flushes at exit
    finally:
        collector.stop(None)
    received = receiver.spans()
    server = [span for _, span in received if span.name == REGISTER and span.kind == span.SPAN_KIND_SERVER]
    assert len(server) == 1, [span.name for _, span in received]
    assert server[0].trace_id == driver.get_span_context().trace_id.to_bytes(16, "big")
    assert {resource["service.name"] for resource, _ in received} == {"snapcoord-eu1"}
    children = [span for _, span in received if span.parent_span_id == server[0].span_id]
    assert {"localfs.put"} <= {span.name for span in children}
    assert all(m.get("x-tenant") == "team-a" for m in receiver.metadata)


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("SNAPCOORD_", "OTEL_"))}


@pytest.mark.process
def test_without_the_extra_the_coordinator_serves_and_refuses_tracing_naming_the_extra(
    tmp_path: Path, without_otel: tuple[dict[str, str], Path]
) -> None:
    env, attempts = without_otel
    refused = subprocess.run(
        [*snapcoord_command(), "serve", "--port", "0", "--metrics-port", "-1", "--otel-exporter", "otlp"],
        env={**_base_env(), **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stderr
    assert "--otel-exporter='otlp'" in refused.stderr
    assert "pip install 'snapcoord[otel]'" in refused.stderr

    attempts.unlink(missing_ok=True)
    with CoordinatorProcess(tmp_path / "server", args=["--log-format", "json"], env=env) as proc:
        with CoordinatorClient(proc.target) as client, pytest.raises(NotFound):
            client.get_lease("no-otel")
        assert proc.terminate() == 0
    assert not attempts.exists(), attempts.read_text()  # tracing off: never even tried to import it
    assert '"lease_id": "no-otel"' in proc.stderr_text()


def test_the_client_helpers_carry_a_context_across_a_hop(spans: InMemorySpanExporter) -> None:
    tracer = _PROVIDER.get_tracer("test")
    with tracer.start_as_current_span("driver") as driver:
        carrier = client_tracing.inject()
    assert carrier["traceparent"].split("-")[1] == f"{driver.get_span_context().trace_id:032x}"
    with client_tracing.attached(carrier), client_tracing.span("task", partition=3):
        pass
    (task,) = [s for s in spans.get_finished_spans() if s.name == "task"]
    assert task.parent is not None and task.parent.span_id == driver.get_span_context().span_id
    assert (task.attributes or {})["partition"] == 3
