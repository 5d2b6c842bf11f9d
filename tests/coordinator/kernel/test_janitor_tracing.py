"""Tracing of the janitor: one root span per pass, a child span per step it ran, and the steps'
ZooKeeper and S3 calls under those (in-memory exporter; real ZooKeeper and S3 for the passes of a
real server, the janitor alone for the failure outcomes)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from harness.coordinator import serve_in_process
from harness.process import wait_until
from snapcoord.client import CoordinatorClient, NotFound, Offset
from snapcoord.coordinator.errors import StoreUnavailable
from snapcoord.coordinator.kernel.janitor_loop import Janitor, Step
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.observability.tracing import Tracing
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.election import Election


def _new_tracing() -> tuple[Tracing, InMemorySpanExporter]:
    """A provider of its own (not the global one): the janitor gets its tracer from ``Tracing``."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter


def _passes(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.name == "janitor.pass"]


def _children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def _no_election() -> Election:
    pytest.fail("run_once needs no election")


@pytest.mark.timeout(180)
def test_a_pass_is_one_root_span_with_a_child_per_step_and_the_store_calls_under_them(
    zk_uri: str, s3_uri: str
) -> None:
    tracing, exporter = _new_tracing()
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(s3_uri)
    try:
        deps = Deps(metadata=metadata, blobs=blobs)
        # The janitor is not started (cleanup interval 0): the test runs its passes.
        with serve_in_process(deps, tracing=tracing, max_clock_skew="0s") as server:
            with CoordinatorClient(server.target) as client:
                client.register_producer_offsets("short-lived", [Offset("orders", 0, 1)], ttl_ms=1)
            exporter.clear()  # the RPC's spans; what follows is the janitor's
            janitor = server.server.services.janitor
            runs = []

            def expired() -> bool:
                runs.append(janitor.run_once())
                return runs[-1].get("producer-expiry", 0) == 1

            wait_until(expired, timeout=120, interval=0.2, what="the janitor expiring the record")
            spans = exporter.get_finished_spans()  # the passes' (the check below is an RPC)
            with CoordinatorClient(server.target) as client, pytest.raises(NotFound):
                client.get_producer_offsets("short-lived")  # really gone: the pass did the work
    finally:
        blobs.close()
        metadata.close()
    passes = _passes(spans)
    assert len(passes) == len(runs), "one span per pass"
    last = passes[-1]
    assert last.parent is None and last.kind is SpanKind.INTERNAL  # the root of its own trace
    assert dict(last.attributes or {}) == {
        "snapcoord.janitor.outcome": "ok",
        "snapcoord.janitor.removed": sum(runs[-1].values()),
    }
    steps = _children(spans, last)
    # One child per step the pass ran (the orphan sweeps run on their own schedule).
    assert sorted(s.name for s in steps) == sorted(f"janitor.{name}" for name in runs[-1])
    assert all(s.kind is SpanKind.INTERNAL and s.context.trace_id == last.context.trace_id for s in steps)
    expiry = next(s for s in steps if s.name == "janitor.producer-expiry")
    assert dict(expiry.attributes or {}) == {
        "snapcoord.janitor.step": "producer-expiry",
        "snapcoord.janitor.outcome": "ok",
        "snapcoord.janitor.removed": 1,
    }
    assert expiry.status.status_code is StatusCode.UNSET
    # The deletion's store calls are the step's children, not the pass's or roots of their own.
    calls = _children(spans, expiry)
    names = {s.name for s in calls}
    assert all(s.name.startswith(("zookeeper.", "s3.")) and s.kind is SpanKind.CLIENT for s in calls), names
    assert "zookeeper.transaction" in names, names  # the record and its index entry, deleted together
    assert not [s for s in spans if s.name.startswith(("zookeeper.", "s3.")) and s.parent is None]
    # Every span a pass made belongs to one of the passes' traces.
    assert {s.context.trace_id for s in spans} == {p.context.trace_id for p in passes}


def test_a_failed_step_fails_its_span_and_the_pass_goes_on() -> None:
    tracing, exporter = _new_tracing()

    def outage() -> int:
        raise StoreUnavailable("ZooKeeper connection suspended")

    steps = [Step("outage", outage), Step("sweep", lambda: 2)]
    janitor = Janitor(
        steps, election=_no_election, interval_ms=1000, metrics=CoordinatorMetrics(CollectorRegistry())
    )
    janitor.trace_with(tracing.janitor_span)
    assert janitor.run_once() == {"sweep": 2}
    spans = exporter.get_finished_spans()
    (one_pass,) = _passes(spans)
    assert dict(one_pass.attributes or {}) == {
        "snapcoord.janitor.outcome": "partial",
        "snapcoord.janitor.removed": 2,
    }
    by_name = {s.name: s for s in _children(spans, one_pass)}
    assert set(by_name) == {"janitor.outage", "janitor.sweep"}
    failed = by_name["janitor.outage"]
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["snapcoord.janitor.outcome"] == "interrupted"
    assert [e.name for e in failed.events] == ["exception"]
    assert (failed.events[0].attributes or {})[
        "exception.type"
    ] == "snapcoord.coordinator.errors.StoreUnavailable"
    assert (by_name["janitor.sweep"].attributes or {})["snapcoord.janitor.removed"] == 2


def test_a_pass_that_loses_leadership_says_so_and_opens_no_span_for_the_steps_it_skips() -> None:
    tracing, exporter = _new_tracing()
    steps = [Step("first", lambda: 1), Step("second", lambda: 1)]
    janitor = Janitor(
        steps, election=_no_election, interval_ms=1000, metrics=CoordinatorMetrics(CollectorRegistry())
    )
    janitor.trace_with(tracing.janitor_span)
    allowed = [True, False]
    assert janitor.run_once(lambda: allowed.pop(0)) == {"first": 1}
    spans = exporter.get_finished_spans()
    (one_pass,) = _passes(spans)
    assert (one_pass.attributes or {})["snapcoord.janitor.outcome"] == "interrupted"
    assert [s.name for s in _children(spans, one_pass)] == ["janitor.first"]
