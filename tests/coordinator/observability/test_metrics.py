"""Prometheus metrics: the standard gRPC server series with the right codes, scraped over HTTP."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from harness.coordinator import InProcessCoordinator, ProbeService, embedded_deps, serve_in_process
from harness.process import wait_until
from snapcoord.coordinator.observability.metrics import MetricsExporter, start_exporter
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.transport.interceptors import code_label

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
PROBE = ProbeService.SERVICE
GRPC_LABELS = {"grpc_type", "grpc_service", "grpc_method", "grpc_code", "le"}


@pytest.fixture
def deps(tmp_path: Path) -> Iterator[Deps]:
    with embedded_deps(tmp_path) as d:
        yield d


@pytest.fixture
def coordinator(deps: Deps) -> Iterator[tuple[InProcessCoordinator, MetricsExporter]]:
    probe = ProbeService()
    with serve_in_process(deps, handlers=[probe.handler()]) as coord:
        exporter = start_exporter(coord.server.registry, "127.0.0.1", 0)
        try:
            yield coord, exporter
        finally:
            exporter.stop()


def scrape(exporter: MetricsExporter) -> tuple[str, Samples]:
    with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def handled(samples: Samples, rpc_type: str, service: str, method: str, code: str) -> float:
    return value(
        samples,
        "grpc_server_handled_total",
        grpc_type=rpc_type,
        grpc_service=service,
        grpc_method=method,
        grpc_code=code,
    )


def test_handled_total_has_the_right_codes(coordinator: tuple[InProcessCoordinator, MetricsExporter]) -> None:
    coord, exporter = coordinator
    with coord.channel() as ch:
        for _ in range(2):
            ProbeService.call(ch, "Echo", b"hi")
        for method, request in [
            ("Abort", b""),
            ("SetCode", b""),
            ("Raise", b"errors.InvalidArgument"),
            ("Raise", b"errors.BadVersionError"),
            ("Raise", b"ValueError"),
        ]:
            with pytest.raises(grpc.RpcError):
                ProbeService.call(ch, method, request)
        with pytest.raises(grpc.RpcError):
            ch.unary_unary("/snapcoord.v1.LeaseService/GetLease")(b"", timeout=10)
        with pytest.raises(grpc.RpcError):
            ch.unary_unary("/snapcoord.v1.LeaseService/NoSuchRpc")(b"", timeout=10)
        count = ch.unary_stream(f"/{PROBE}/Count")
        assert len(list(count(b"3", timeout=10))) == 3
        with pytest.raises(grpc.RpcError):
            list(count(b"1!", timeout=10))

    _, samples = scrape(exporter)
    expected = {
        ("unary", PROBE, "Echo", "OK"): 2,
        ("unary", PROBE, "Abort", "NotFound"): 1,
        ("unary", PROBE, "SetCode", "FailedPrecondition"): 1,
        ("unary", PROBE, "Raise", "InvalidArgument"): 1,
        ("unary", PROBE, "Raise", "Aborted"): 1,
        ("unary", PROBE, "Raise", "Internal"): 1,
        ("unary", "snapcoord.v1.LeaseService", "GetLease", "InvalidArgument"): 1,  # no lease_id
        ("server_stream", PROBE, "Count", "OK"): 1,
        ("server_stream", PROBE, "Count", "Aborted"): 1,
    }
    for (rpc_type, service, method, code), n in expected.items():
        assert handled(samples, rpc_type, service, method, code) == n, (rpc_type, service, method, code)
    # started and the latency histogram agree with handled, per method
    for rpc_type, service, method in {k[:3] for k in expected}:
        total = sum(n for k, n in expected.items() if k[:3] == (rpc_type, service, method))
        labels = {"grpc_type": rpc_type, "grpc_service": service, "grpc_method": method}
        assert value(samples, "grpc_server_started_total", **labels) == total
        assert value(samples, "grpc_server_handling_seconds_count", **labels) == total
        assert value(samples, "grpc_server_handling_seconds_bucket", **labels, le="+Inf") == total
    # an unknown method is not recorded: its name would come from the client
    assert not [k for k in samples if ("grpc_method", "NoSuchRpc") in k[1]]


def test_health_and_reflection_streams_are_recorded(
    coordinator: tuple[InProcessCoordinator, MetricsExporter],
) -> None:
    coord, exporter = coordinator
    with coord.channel() as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        assert (
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status
            == health_pb2.HealthCheckResponse.SERVING
        )
        watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=60)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        reflection = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = list(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
        )
        assert len(replies) == 1

        health = "grpc.health.v1.Health"
        wait_until(
            lambda: handled(scrape(exporter)[1], "server_stream", health, "Watch", "Canceled") == 1,
            timeout=30,
            what="the cancelled Watch to be recorded",
        )
        _, samples = scrape(exporter)
        assert handled(samples, "unary", health, "Check", "OK") == 1
        assert (
            handled(
                samples,
                "bidi_stream",
                "grpc.reflection.v1alpha.ServerReflection",
                "ServerReflectionInfo",
                "OK",
            )
            == 1
        )


def test_a_drained_watch_is_recorded_ok(deps: Deps) -> None:
    with serve_in_process(deps) as coord:
        exporter = start_exporter(coord.server.registry, "127.0.0.1", 0)
        try:
            with coord.channel() as ch:
                watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=60)
                next(watch)
                coord.server.shutdown(3600.0)
                assert [r.status for r in watch] == [health_pb2.HealthCheckResponse.NOT_SERVING]
            _, samples = scrape(exporter)
            assert handled(samples, "server_stream", "grpc.health.v1.Health", "Watch", "OK") == 1
        finally:
            exporter.stop()


def test_labels_carry_no_ids(coordinator: tuple[InProcessCoordinator, MetricsExporter]) -> None:
    coord, exporter = coordinator
    with coord.channel() as ch:
        ProbeService.call(ch, "Echo", b"producer-42")
        with pytest.raises(grpc.RpcError):
            ch.unary_unary("/snapcoord.v1.ProducerOffsetService/GetProducerOffsets")(
                b"\n\x0bproducer-42", timeout=10
            )
    text, samples = scrape(exporter)
    assert "producer-42" not in text
    for name, labels in samples:
        if name.startswith("grpc_server_"):
            assert {k for k, _ in labels} <= GRPC_LABELS, name


def test_code_labels_use_the_go_grpc_prometheus_spelling() -> None:
    assert code_label(grpc.StatusCode.OK) == "OK"
    assert code_label(grpc.StatusCode.CANCELLED) == "Canceled"
    assert code_label(grpc.StatusCode.NOT_FOUND) == "NotFound"
    assert code_label(grpc.StatusCode.DEADLINE_EXCEEDED) == "DeadlineExceeded"
    assert code_label(grpc.StatusCode.UNAUTHENTICATED) == "Unauthenticated"


def test_each_server_has_its_own_registry(deps: Deps, tmp_path: Path) -> None:
    with (
        embedded_deps(tmp_path / "second") as other_deps,
        serve_in_process(deps) as a,
        serve_in_process(other_deps) as b,
    ):
        assert a.server.registry is not b.server.registry
        with a.channel() as ch:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        ex_a = start_exporter(a.server.registry, "127.0.0.1", 0)
        ex_b = start_exporter(b.server.registry, "127.0.0.1", 0)
        try:
            labels = {"grpc_type": "unary", "grpc_service": "grpc.health.v1.Health", "grpc_method": "Check"}
            assert value(scrape(ex_a)[1], "grpc_server_started_total", **labels) == 1
            assert value(scrape(ex_b)[1], "grpc_server_started_total", **labels) == 0
        finally:
            ex_a.stop()
            ex_b.stop()


def test_exporter_reports_its_port_serves_process_metrics_and_stops_cleanly(
    coordinator: tuple[InProcessCoordinator, MetricsExporter],
) -> None:
    coord, _ = coordinator
    exporter = start_exporter(coord.server.registry, "127.0.0.1", 0)
    assert exporter.port > 0
    text, _ = scrape(exporter)
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "python_info",
        "python_gc_objects_collected_total",
    ):
        assert name in text
    exporter.stop()
    exporter.stop()  # idempotent
    with pytest.raises(OSError):
        scrape(exporter)
    with socket.socket() as s:  # nothing listens there any more (TIME_WAIT from the scrape is fine)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", exporter.port))
        s.listen()
