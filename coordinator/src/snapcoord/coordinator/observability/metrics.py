"""Prometheus metrics: a registry per server, the standard gRPC server metrics, the HTTP exporter.

Each coordinator gets its own ``CollectorRegistry`` rather than prometheus_client's global one,
so tests can build many servers in one process without "Duplicated timeseries" errors. Metric
names and labels follow go-grpc-prometheus (``grpc_server_handled_total`` etc.), which existing
dashboards and alerts expect. Labels name the service, method, type and code only: ids go to
logs, never to labels (each distinct label value is a new time series). With ``--processes`` > 1
the metrics of every process are served together (``shared_metrics``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from snapcoord.coordinator.domain.documents import RECORD_KINDS

_log = logging.getLogger(__name__)

# Buckets from go-grpc-prometheus (prometheus.DefBuckets): 5 ms to 10 s, enough to tell a ZK
# round trip (~1 ms) from an S3 put (~3 ms) from a retry loop.
_HANDLING_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: How ``--processes`` > 1 (prometheus_client's multiprocess mode, ``shared_metrics``) aggregates
#: the gauges that describe the whole cluster, which only the elected janitor sets (the others
#: export 0): the maximum, like ``max()`` over replicas, over live processes only, so that a dead
#: janitor's 1 leaves with it (``mark_process_dead``). A single process ignores the mode.
_CLUSTER_GAUGE: Literal["livemax"] = "livemax"


def new_registry() -> CollectorRegistry:
    """A registry with the process, platform and GC collectors (shared, stateless readers)."""
    # ``*_created`` series double the exposition for no use in PromQL; go-grpc-prometheus has none.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


class GrpcServerMetrics:
    """The standard gRPC server metrics, registered on one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("grpc_type", "grpc_service", "grpc_method")
        self.started = Counter(
            "grpc_server_started",
            "Total number of RPCs started on the server.",
            labels,
            registry=registry,
        )
        self.handled = Counter(
            "grpc_server_handled",
            "Total number of RPCs completed on the server, regardless of success or failure.",
            (*labels, "grpc_code"),
            registry=registry,
        )
        self.handling_seconds = Histogram(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled"
            " by the server.",
            labels,
            buckets=_HANDLING_BUCKETS,
            registry=registry,
        )
        # grpc refuses these itself, before any handler runs, so they are in no other series.
        self.refused = Counter(
            "snapcoord_calls_refused",
            "Calls grpc refused with RESOURCE_EXHAUSTED because --max-concurrent-rpcs calls were"
            " already in flight.",
            ("grpc_service", "grpc_method"),
            registry=registry,
        )


class CoordinatorMetrics:
    """The domain metrics: what the coordinator did, never which id it did it to."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.producer_registrations = Counter(
            "snapcoord_producer_registrations",
            "RegisterProducerOffsets outcomes: registered (this call created the record) or existing.",
            ("outcome",),
            registry=registry,
        )
        self.producer_records_expired = Counter(
            "snapcoord_producer_records_expired",
            "Producer offset records removed by the janitor after their TTL.",
            registry=registry,
        )
        self.commit_fences = Counter(
            "snapcoord_commit_fences",
            "FenceTable outcomes: raised (this call raised the table's fence), existing (the same "
            "epoch again: the recorded fence answered) or refused (TABLE_FENCED: a newer run's fence).",
            ("outcome",),
            registry=registry,
        )
        self.commit_claims = Counter(
            "snapcoord_commit_claims",
            "ClaimCommit outcomes: granted (this write holds the number, also on a retry), held "
            "(another write holds it) or refused (TABLE_FENCED or CLAIM_RETIRED).",
            ("outcome",),
            registry=registry,
        )
        self.commit_claims_removed = Counter(
            "snapcoord_commit_claims_removed",
            "Commit claims the janitor removed after --commit-claim-retention (never a table's "
            "highest claim, never a fence).",
            registry=registry,
        )
        self.backlog_marks = Counter(
            "snapcoord_backlog_marks",
            "MarkBacklog outcomes: marked (a first mark), existing (the stored mark was returned), "
            "grown (partitions added to the stored mark) or reset.",
            ("outcome",),
            registry=registry,
        )
        self.backlog_partitions_finished = Counter(
            "snapcoord_backlog_partitions_finished",
            "Partitions a progress report moved to their backlog boundary (each counted once).",
            registry=registry,
        )
        self.backlog_partitions_added = Counter(
            "snapcoord_backlog_partitions_added",
            "Partitions MarkBacklog added to a stored mark (a source that grew while its job ran).",
            registry=registry,
        )
        self.backlog_unmarked_positions = Counter(
            "snapcoord_backlog_unmarked_positions",
            "Positions ReportProgress received for partitions the job's mark does not name (answered "
            "in its unmarked field; a driver that keeps reporting them has not marked them).",
            registry=registry,
        )
        # The three backlog gauges describe the whole cluster; the elected janitor computes them each
        # pass and other replicas export 0 (like snapcoord_janitor_leader): aggregate with max().
        self.backlog_jobs_processing = Gauge(
            "snapcoord_backlog_jobs_processing",
            "Marked jobs with a partition still behind its backlog boundary (from the elected janitor).",
            multiprocess_mode=_CLUSTER_GAUGE,
            registry=registry,
        )
        self.backlog_partitions_remaining = Gauge(
            "snapcoord_backlog_partitions_remaining",
            "Marked partitions behind their backlog boundary, over all jobs (from the elected janitor).",
            multiprocess_mode=_CLUSTER_GAUGE,
            registry=registry,
        )
        self.backlog_partitions_unmarked = Gauge(
            "snapcoord_backlog_partitions_unmarked",
            "Partitions progress reports named that their job's mark does not, over all jobs (from "
            "the elected janitor).",
            multiprocess_mode=_CLUSTER_GAUGE,
            registry=registry,
        )
        self.snapshots_created = Counter(
            "snapcoord_snapshots_created", "Generation snapshots created.", registry=registry
        )
        self.snapshots_completed = Counter(
            "snapcoord_snapshots_completed",
            "Generation snapshots completed (every task reported).",
            registry=registry,
        )
        self.snapshots_aborted = Counter(
            "snapcoord_snapshots_aborted",
            "Generation snapshots aborted, by reason (request or timeout).",
            ("reason",),
            registry=registry,
        )
        self.snapshots_deleted = Counter(
            "snapcoord_snapshots_deleted",
            "Generation snapshots deleted (DeleteSnapshot or retention), with their payloads.",
            registry=registry,
        )
        self.lease_acquires = Counter(
            "snapcoord_lease_acquires", "AcquireSnapshots calls that committed.", registry=registry
        )
        self.lease_releases = Counter(
            "snapcoord_lease_releases", "Snapshots unpinned by ReleaseSnapshots.", registry=registry
        )
        self.lease_expirations = Counter(
            "snapcoord_lease_expirations",
            "Leases removed by the janitor after their expiry (plus the clock-skew margin).",
            registry=registry,
        )
        self.leases = Gauge(
            "snapcoord_leases",
            "Lease records, as last counted by the elected janitor.",
            multiprocess_mode=_CLUSTER_GAUGE,
            registry=registry,
        )
        self.pinned_snapshots = Gauge(
            "snapcoord_pinned_snapshots",
            "Snapshots with a pin index, as last counted by the elected janitor.",
            multiprocess_mode=_CLUSTER_GAUGE,
            registry=registry,
        )
        self.orphans_deleted = Counter(
            "snapcoord_orphan_objects_deleted",
            "Payload objects no record referenced, deleted by the janitor after the grace period.",
            ("kind",),
            registry=registry,
        )
        self.corrupt_records = Counter(
            "snapcoord_corrupt_records",
            "Stored records that could not be decoded, skipped by a janitor pass or a list call.",
            ("kind",),
            registry=registry,
        )
        for kind in RECORD_KINDS:  # every kind from the start, so that rate() sees the first one
            self.corrupt_records.labels(kind)
        self.commit_conflicts = Counter(
            "snapcoord_commit_conflicts",
            "Commits that lost a compare-and-set to a concurrent change and were decided again.",
            ("operation",),
            registry=registry,
        )
        self.commit_stale_copies = Counter(
            "snapcoord_commit_stale_copies",
            "Commits decided on this process's copy of a record (or on the guess that it is absent) "
            "that the store refused because the record had changed, and decided again on a fresh "
            "read: a repeat registration, a retried report, or a record another process wrote. "
            "Not in snapcoord_commit_conflicts, which counts races lost after a read.",
            ("operation",),
            registry=registry,
        )
        self.janitor_leader = Gauge(
            "snapcoord_janitor_leader",
            "1 while this replica is the elected janitor and may act, else 0.",
            multiprocess_mode=_CLUSTER_GAUGE,
            registry=registry,
        )
        self.janitor_pass_seconds = Histogram(
            "snapcoord_janitor_pass_seconds",
            "Duration of one janitor step.",
            ("step",),
            buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0),
            registry=registry,
        )
        self.janitor_passes = Counter(
            "snapcoord_janitor_passes",
            "Janitor steps run, by outcome (ok, error, interrupted).",
            ("step", "outcome"),
            registry=registry,
        )
        # A timestamp rather than an age: Prometheus computes the lag (time() - value) at query
        # time, so it keeps growing while the janitor is stuck and nobody updates the gauge.
        self.janitor_last_success = Gauge(
            "snapcoord_janitor_last_success_timestamp_seconds",
            "Unix time at which each janitor step last succeeded on this replica (set once it has).",
            ("step",),
            multiprocess_mode=_CLUSTER_GAUGE,
            registry=registry,
        )
        self.metadata_store_usable = Gauge(
            "snapcoord_metadata_store_usable",
            "1 while the metadata store can serve (for ZooKeeper: connected, session valid), else 0.",
            # With --processes > 1 each worker has its own session: 0 if any live worker lost it.
            multiprocess_mode="livemin",
            registry=registry,
        )
        self.clock_offset = Gauge(
            "snapcoord_clock_offset_seconds",
            "How far this replica's clock runs behind ZooKeeper's (negative: ahead), by the clock check.",
            multiprocess_mode="livemostrecent",
            registry=registry,
        )
        self.payload_budget_limit = Gauge(
            "snapcoord_payload_budget_limit_bytes",
            "Checkpoint payload bytes the process may hold in memory at once (--payload-budget).",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.payload_budget_in_use = Gauge(
            "snapcoord_payload_budget_in_use_bytes",
            "Checkpoint payload bytes held in memory by calls in flight (admitted from the budget).",
            multiprocess_mode="livesum",
            registry=registry,
        )


class _StateSource(Protocol):
    def is_usable(self) -> bool: ...

    def add_state_listener(self, listener: Callable[[bool], None]) -> None: ...


def track_usable(gauge: Gauge, store: _StateSource) -> None:
    """Keep ``gauge`` at 1 while ``store`` is usable and 0 otherwise, from its state events.

    The first reading is taken after the listener is registered and applied only if no event has
    come in since: an event is newer than that reading, and the reading applied over it could show
    a lost session as usable until the next change. The store is never called under the lock (its
    listener thread may hold a store lock while it calls us).
    """
    lock = threading.Lock()
    evented = False

    def on_change(usable: bool) -> None:
        nonlocal evented
        with lock:
            evented = True
            gauge.set(1 if usable else 0)

    store.add_state_listener(on_change)
    initial = store.is_usable()
    with lock:
        if not evented:
            gauge.set(1 if initial else 0)


@dataclass(frozen=True)
class MetricsExporter:
    """The running HTTP exporter; ``port`` is the bound one (useful with port 0)."""

    host: str
    port: int
    _httpd: WSGIServer
    _thread: threading.Thread

    def stop(self) -> None:
        """Stop serving and release the port; idempotent."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def start_exporter(
    registry: CollectorRegistry, host: str, port: int, *, certfile: str = "", keyfile: str = ""
) -> MetricsExporter:
    """Serve ``registry`` on ``http://host:port/metrics`` from a daemon thread (HTTPS with
    ``certfile`` and ``keyfile``)."""
    try:
        httpd, thread = start_http_server(
            port, addr=host, registry=registry, certfile=certfile or None, keyfile=keyfile or None
        )
    except OSError as e:
        raise OSError(f"cannot bind metrics to {host}:{port}: {e.strerror or e}") from e
    bound_port = int(httpd.server_address[1])
    _log.debug("metrics exporter listening on %s:%d", host, bound_port)
    return MetricsExporter(host, bound_port, httpd, thread)
