"""Prometheus metrics: the standard gRPC server series with the right codes, scraped over HTTP."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from harness.coordinator import InProcessCoordinator, ProbeService, embedded_deps, serve_in_process
from harness.faults import TcpProxy
from harness.process import wait_until
from snapcoord.coordinator.errors import ResourceExhausted
from snapcoord.coordinator.kernel.payload_admission import PayloadBudget
from snapcoord.coordinator.observability.metrics import MetricsExporter, start_exporter, track_usable
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
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


# --- signals beside the call counts: refusals, the metadata session, the payload budget, the janitor ----


def test_calls_refused_at_the_concurrency_limit_are_counted(deps: Deps) -> None:
    probe = ProbeService()
    with serve_in_process(deps, handlers=[probe.handler()], max_concurrent_rpcs="1") as coord:
        exporter = start_exporter(coord.server.registry, "127.0.0.1", 0)
        try:
            with coord.channel() as ch, ThreadPoolExecutor(1) as pool:
                slow = pool.submit(ProbeService.call, ch, "Slow")
                assert probe.entered.wait(60), "the slow call never reached its handler"
                with pytest.raises(grpc.RpcError) as refused:
                    ProbeService.call(ch, "Echo", b"hi")
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                probe.release.set()
                assert slow.result(timeout=60) == b"finished"
                # grpc counts the slow call out only after its reply went: an Echo right after it
                # may still be refused. Every refusal the client sees must be counted, no more.
                seen = 1

                def echo() -> bool:
                    nonlocal seen
                    try:
                        return ProbeService.call(ch, "Echo", b"hi") == b"hi"
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                        seen += 1
                        return False

                wait_until(echo, timeout=60, interval=0.05, what="an Echo once the slow call is done")
            _, samples = scrape(exporter)
            refusals = value(samples, "snapcoord_calls_refused_total", grpc_service=PROBE, grpc_method="Echo")
            assert refusals == seen
            assert (
                value(samples, "snapcoord_calls_refused_total", grpc_service=PROBE, grpc_method="Slow") == 0
            )
            # A refused call reached no handler: it is in no grpc_server_* series.
            assert handled(samples, "unary", PROBE, "Echo", "OK") == 1
            assert handled(samples, "unary", PROBE, "Echo", "ResourceExhausted") == 0
        finally:
            exporter.stop()


def test_store_and_payload_budget_gauges(coordinator: tuple[InProcessCoordinator, MetricsExporter]) -> None:
    coord, exporter = coordinator
    _, samples = scrape(exporter)
    assert value(samples, "snapcoord_metadata_store_usable") == 1
    budget = coord.config.grpc.payload_budget_bytes
    assert budget > 0 and value(samples, "snapcoord_payload_budget_limit_bytes") == budget
    assert value(samples, "snapcoord_payload_budget_in_use_bytes") == 0
    # Every API method's series are there, at 0, before any call (rate() needs a first sample).
    lease = {"grpc_service": "snapcoord.v1.LeaseService", "grpc_method": "GetLease"}
    for code in ("OK", "Unavailable", "Internal", "ResourceExhausted"):
        key = (
            "grpc_server_handled_total",
            frozenset({**lease, "grpc_type": "unary", "grpc_code": code}.items()),
        )
        assert samples[key] == 0, code
    types = {
        dict(labels)["grpc_method"]: dict(labels)["grpc_type"]
        for name, labels in samples
        if name == "grpc_server_started_total" and dict(labels)["grpc_service"].startswith("snapcoord.v1.")
    }
    assert types["UploadCheckpoint"] == "client_stream" and types["ReadCheckpoint"] == "server_stream"
    assert types["GetLease"] == "unary" and len(types) >= 24
    refused = {
        dict(labels)["grpc_method"] for name, labels in samples if name == "snapcoord_calls_refused_total"
    }
    assert {"GetLease", "RegisterProducerOffsets", "ReportTaskSnapshot", "UploadCheckpoint"} <= refused
    assert all(v == 0 for (name, _), v in samples.items() if name == "snapcoord_calls_refused_total")


def test_payload_budget_reports_every_change() -> None:
    seen: list[int] = []
    budget = PayloadBudget(100, 0.0, on_change=seen.append)
    with budget.hold(40, "a report"), budget.hold(60, "another"):
        assert seen == [40, 100]
        with pytest.raises(ResourceExhausted), budget.hold(1, "one too many"):
            pass
    assert seen == [40, 100, 40, 0]


class _EventfulStore:
    """A store whose state changes while the gauge registers its listener."""

    def __init__(self, reading: bool, event: bool | None) -> None:
        self.reading = reading
        self.event = event
        self.listeners: list[Callable[[bool], None]] = []

    def is_usable(self) -> bool:
        return self.reading

    def add_state_listener(self, listener: Callable[[bool], None]) -> None:
        self.listeners.append(listener)
        if self.event is not None:
            listener(self.event)


@pytest.mark.parametrize(("reading", "event", "shown"), [(True, None, 1), (False, None, 0), (True, False, 0)])
def test_store_usable_gauge_keeps_the_newest_state(reading: bool, event: bool | None, shown: int) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("usable", "test", registry=registry)
    store = _EventfulStore(reading, event)
    track_usable(gauge, store)
    # An event during registration is newer than the reading taken after it: the event wins.
    assert registry.get_sample_value("usable") == shown
    for listener in store.listeners:
        listener(True)
    assert registry.get_sample_value("usable") == 1
    for listener in store.listeners:
        listener(False)
    assert registry.get_sample_value("usable") == 0


def test_janitor_records_when_each_step_last_succeeded(deps: Deps) -> None:
    started = time.time()
    with serve_in_process(deps, cleanup_interval="1s") as coord:
        registry = coord.server.registry
        # The steps of every pass (the orphan listings are off by default).
        steps = (
            "lease-expiry",
            "lease-gauges",
            "snapshot-timeouts",
            "snapshot-retention",
            "producer-expiry",
            "orphan-intents",
            "backlog-gauges",
        )

        def all_stamped() -> dict[str, float] | None:
            stamps = {
                step: registry.get_sample_value(
                    "snapcoord_janitor_last_success_timestamp_seconds", {"step": step}
                )
                for step in steps
            }
            return {k: v for k, v in stamps.items() if v is not None} if None not in stamps.values() else None

        stamps = wait_until(all_stamped, timeout=60, interval=0.1, what="every janitor step to succeed")
    assert all(started <= stamp <= time.time() for stamp in stamps.values()), stamps


def test_metadata_store_usable_follows_the_zookeeper_connection(
    zk_hosts: str, zk_uri: str, tmp_path: Path
) -> None:
    """A real ZooKeeper behind a proxy the test cuts: 0 while the connection is gone, 1 once it is back."""
    zk_host, zk_port = zk_hosts.rsplit(":", 1)
    chroot = "/" + zk_uri.split("/", 3)[3]
    with TcpProxy(zk_host, int(zk_port)) as proxy:
        metadata = open_metadata_store(f"zk://{proxy.address}{chroot}")
        blobs = open_blob_store((tmp_path / "blobs").as_uri())
        try:
            with serve_in_process(Deps(metadata=metadata, blobs=blobs)) as coord:

                def usable() -> float | None:
                    return coord.server.registry.get_sample_value("snapcoord_metadata_store_usable")

                assert usable() == 1
                proxy.cut()
                wait_until(
                    lambda: usable() == 0, timeout=60, interval=0.05, what="the gauge at 0 after the cut"
                )
                proxy.restore()
                wait_until(lambda: usable() == 1, timeout=60, interval=0.05, what="the gauge back at 1")
        finally:
            blobs.close()
            metadata.close()
