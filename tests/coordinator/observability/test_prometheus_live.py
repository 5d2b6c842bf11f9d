"""deploy/: the dashboard's queries and the rules, evaluated by a real Prometheus scraping a live coordinator.

The coordinator runs in this process on real ZooKeeper and S3 (SeaweedFS) with its metrics exporter;
Prometheus (Debian's) scrapes it every second and evaluates deploy/prometheus/snapcoord.rules.yml, every
``for:`` shortened to one second so that alerts fire within the test. The traffic touches every API
family; then the blob store fails a put (an UNAVAILABLE answer, a server-side error), holds one call
longer than the latency alert's threshold, and while that call holds the only slot of
``--max-concurrent-rpcs 1`` another call is refused. Each fault happens once: the server creates every API
method's series at start, so ``rate()`` sees the first increase.

Checked: every rule loads and evaluates without error, every recording rule returns series, every
dashboard query parses and evaluates (and returns series, but for the few listed that need events this
test cannot make), and the alerts that fire are exactly the ones these faults must fire.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from harness.coordinator import serve_in_process
from harness.process import wait_until
from harness.prometheus import PrometheusServer
from harness.stores import Stores
from snapcoord.client import (
    CoordinatorClient,
    NotFound,
    Offset,
    RetryPolicy,
    SnapshotRef,
    TaskSnapshot,
    Unavailable,
)
from snapcoord.coordinator.errors import StoreUnavailable
from snapcoord.coordinator.observability.metrics import start_exporter
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.blobs import BlobStore

pytestmark = [pytest.mark.timeout(420), pytest.mark.process]  # starts prometheus

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "snapcoord.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "snapcoord.json"
#: Held this long, the slow call lands above SnapcoordLatencyHigh's 1 s threshold in every p99.
SLOW_CALL_S = 1.5

#: What the faults must fire, and nothing else once the start-up has settled.
EXPECTED_FIRING = {
    "SnapcoordBackendUnavailable",  # the failed put answered UNAVAILABLE
    "SnapcoordHighErrorRatio",  # one server-side error among a dozen calls
    "SnapcoordLatencyHigh",  # the held RegisterProducerOffsets
    "SnapcoordCallsRefused",  # refused at --max-concurrent-rpcs
}

#: Dashboard queries that may be empty here, and why: they count events this test does not cause.
MAY_BE_EMPTY = {
    # The orphan sweep deletes only payloads older than --orphan-grace (minutes).
    'sum by (kind) (increase(snapcoord_orphan_objects_deleted_total{job="snapcoord"}[1m]))',
    # Conflicts need two writers racing for one record.
    'sum by (operation) (rate(snapcoord_commit_conflicts_total{job="snapcoord"}[1m]))',
}


class FaultyBlobs:
    """Faults at the blob store's edge: the next puts fail (as an S3 outage does) or wait for the test."""

    def __init__(self, blobs: BlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self._put = blobs.put
        self.failures_left = 0
        self.hold: threading.Event | None = None
        self.held = threading.Event()
        monkeypatch.setattr(blobs, "put", self.put)

    def put(self, key: str, data: bytes) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise StoreUnavailable(f"blob store down (test): cannot put {key}")
        hold, self.hold = self.hold, None
        if hold is not None:
            self.held.set()
            if not hold.wait(120):
                raise TimeoutError("the test never released the held put")
        self._put(key, data)


@pytest.fixture
def deps(zk_stores: Stores) -> Deps:
    return Deps(metadata=zk_stores.metadata, blobs=zk_stores.blobs)


def rules_for_the_test(directory: Path) -> Path:
    """The rules file with every ``for:`` at one second: alerts fire as soon as their condition holds."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "1s"
    path = directory / "snapcoord.rules.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def dashboard_queries() -> list[str]:
    """Every target's expression, Grafana's ``$__rate_interval`` as one minute (60 scrapes here)."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (t["expr"] for t in panel.get("targets", []))
            yield from walk(panel.get("panels", []))

    exprs = list(walk(json.loads(DASHBOARD.read_text())["panels"]))
    return [re.sub(r"\$__rate_interval\b", "1m", expr) for expr in exprs]


def test_dashboard_and_rules_on_a_real_prometheus(
    tmp_path: Path, deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = FaultyBlobs(deps.blobs, monkeypatch)
    with serve_in_process(deps, cleanup_interval="1s", max_concurrent_rpcs="1") as coord:
        exporter = start_exporter(coord.server.registry, "127.0.0.1", 0)
        prometheus = PrometheusServer(
            tmp_path / "prometheus",
            targets=[f"127.0.0.1:{exporter.port}"],
            job="snapcoord",
            rule_files=[rules_for_the_test(tmp_path)],
        )
        try:
            with prometheus:
                run_traffic_and_faults(coord.target, prometheus, faults)
                check_rules_dashboard_and_alerts(prometheus)
        finally:
            exporter.stop()


#: Offsets over the default inline limit (1 KiB): a registration of them puts its payload in the
#: blob store, where the faults are injected.
BLOB_SIZED_OFFSETS = [Offset("orders", p, 1_000_000 + p) for p in range(64)]


def scraped(prometheus: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    """Wait until ``expr`` returns series: Prometheus has scraped what the test just did."""
    return wait_until(
        lambda: prometheus.query(expr), timeout=60, interval=0.2, what=f"Prometheus to see {expr}"
    )


def run_traffic_and_faults(target: str, prometheus: PrometheusServer, faults: FaultyBlobs) -> None:
    scraped(prometheus, 'up{job="snapcoord"} == 1')
    # No retries: each injected failure is one UNAVAILABLE answer, seen by the caller.
    with CoordinatorClient(target, timeout_s=60, retry=RetryPolicy(max_attempts=1)) as client:
        client.register_producer_offsets("sink", [Offset("orders", 0, 1)])
        client.register_producer_offsets("sink", [Offset("orders", 0, 1)])  # existing
        with pytest.raises(NotFound):
            client.get_producer_offsets("no-such-sink")
        snapshot = client.create_snapshot("app", ["t"])
        client.report_task_snapshot("app", snapshot.generation, TaskSnapshot("t", (Offset("s", 0, 1),), {}))
        with client.lease("restore", [SnapshotRef("app", snapshot.generation)], duration_s=60):
            pass
        aborted = client.create_snapshot("app", ["t"])
        client.abort_snapshot("app", aborted.generation)
        client.mark_backlog("job", [Offset("orders", 0, 10)])
        client.report_progress("job", [Offset("orders", 0, 10)])
        scraped(prometheus, 'grpc_server_handling_seconds_count{grpc_method="RegisterProducerOffsets"}')

        # The error: a put that fails answers UNAVAILABLE.
        faults.failures_left = 1
        with pytest.raises(Unavailable):
            client.register_producer_offsets("sink-failing", BLOB_SIZED_OFFSETS)
        assert faults.failures_left == 0

        # The slow call holds the only slot of --max-concurrent-rpcs; calls meanwhile are refused.
        release = threading.Event()
        faults.hold = release
        started = time.monotonic()
        pool = ThreadPoolExecutor(1)
        slow = pool.submit(client.register_producer_offsets, "sink-slow", BLOB_SIZED_OFFSETS)
        try:
            assert faults.held.wait(60), "the slow call never reached its put"
            with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as refused:
                channel.unary_unary("/snapcoord.v1.SnapshotService/ListSnapshots")(b"", timeout=30)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # The slow call's duration is what makes it slow: not a timing assertion.
            release.wait(max(0.0, SLOW_CALL_S - (time.monotonic() - started)))
        finally:
            release.set()
            pool.shutdown(wait=True)
        assert slow.result().registered


def check_rules_dashboard_and_alerts(prometheus: PrometheusServer) -> None:
    # The alerts: the faults' ones fire, and the start-up's transients (no janitor leader yet, a
    # counter with one sample) have resolved.
    def firing_as_expected() -> bool:
        return {a["labels"]["alertname"] for a in prometheus.alerts()} == EXPECTED_FIRING

    try:
        wait_until(firing_as_expected, timeout=180, interval=0.5, what="the expected alerts to fire")
    except TimeoutError:
        firing = sorted({a["labels"]["alertname"] for a in prometheus.alerts()})
        pytest.fail(f"firing {firing}, expected {sorted(EXPECTED_FIRING)}\n{prometheus.output()[-3000:]}")

    # Every rule loaded and evaluates without error; every recording rule has series.
    rules = prometheus.rules()
    source = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert len(rules) == len(source), "Prometheus loaded another number of rules than the file has"
    for rule in rules:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
        if rule["type"] == "recording":
            assert scraped(prometheus, rule["name"]), rule["name"]

    # Every dashboard query parses, evaluates, and returns series (but for the listed ones).
    queries = dashboard_queries()
    empty = [expr for expr in queries if not prometheus.query(expr)]
    assert sorted(set(empty) - MAY_BE_EMPTY) == [], "dashboard queries with no series"
    assert len(queries) >= 29
