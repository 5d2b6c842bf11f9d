"""Assemble and run the coordinator: ``build_server`` wires, ``run`` owns the process lifecycle.

``build_server(config, deps)`` builds a gRPC server on the given stores without starting it, so
tests can bind port 0, add a test-only handler and call it through a real channel. ``run(config)``
is what ``snapcoord serve`` does: open the stores named by the config, serve, and on SIGTERM or
SIGINT drain (health NOT_SERVING, stop accepting, let in-flight calls finish within the grace
period) and close the stores, which ends the ZooKeeper session.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import FrameType
from typing import TYPE_CHECKING, TextIO

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from prometheus_client import CollectorRegistry

from snapcoord.coordinator import __version__, api
from snapcoord.coordinator.auth.setup import grpc_credentials, new_auth_interceptor
from snapcoord.coordinator.config.settings import Config, GrpcConfig, hostport
from snapcoord.coordinator.domain.clock import ClockGuard, GuardedClock
from snapcoord.coordinator.kernel.clock_check import ClockCheck
from snapcoord.coordinator.kernel.payload_admission import PayloadBudget
from snapcoord.coordinator.observability import build_info, logging_setup
from snapcoord.coordinator.observability.metrics import (
    CoordinatorMetrics,
    GrpcServerMetrics,
    MetricsExporter,
    new_registry,
    start_exporter,
    track_usable,
)
from snapcoord.coordinator.server.admission import Admission, AdmissionInterceptor
from snapcoord.coordinator.server.api_series import initialize_api_series
from snapcoord.coordinator.server.concurrency_limit import concurrency_limit_probe
from snapcoord.coordinator.server.health_listener import HealthListener
from snapcoord.coordinator.server.memory_bounds import (
    RECEIVE_WINDOW_BYTES,
    check_memory_bounds,
    memory_bounds,
)
from snapcoord.coordinator.server.processes import process_count, serve_processes
from snapcoord.coordinator.server.worst_requests import check_lease_requests_fit
from snapcoord.coordinator.services import Deps, Services
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.zookeeper.clock import clock_probe
from snapcoord.coordinator.transport import reflection
from snapcoord.coordinator.transport.health import StoreHealth
from snapcoord.coordinator.transport.interceptors import ServerInterceptor
from snapcoord.coordinator.transport.request_decoding import GuardedRegistration
from snapcoord.v1 import backlog_pb2, producer_pb2

if TYPE_CHECKING:  # imported at run time only with tracing on: OpenTelemetry is an optional extra
    from snapcoord.coordinator.observability.tracing import Tracing

_log = logging.getLogger(__name__)

#: The services whose every write needs the blob store: NOT_SERVING while it is unreachable.
#: Snapshot and lease reads are answered from metadata, so those services stay SERVING.
BLOB_SERVICE_NAMES: tuple[str, ...] = (
    producer_pb2.DESCRIPTOR.services_by_name["ProducerOffsetService"].full_name,
    backlog_pb2.DESCRIPTOR.services_by_name["BacklogService"].full_name,
)

#: Everything the server lists through reflection: the API, health and reflection itself.
ALL_SERVICE_NAMES: tuple[str, ...] = (*api.SERVICE_NAMES, health.SERVICE_NAME, *reflection.SERVICE_NAMES)


class CoordinatorServer:
    """A built coordinator: the gRPC server plus the handles its lifecycle needs."""

    def __init__(
        self,
        server: grpc.Server,
        executor: ThreadPoolExecutor,
        store_health: StoreHealth,
        registry: CollectorRegistry,
        interceptor: ServerInterceptor,
        services: Services,
        run_janitor: bool,
        health_listener: HealthListener | None = None,
        clock_check: ClockCheck | None = None,
    ) -> None:
        self.grpc = server
        #: The plaintext health-only listener (``--health-port``), or None.
        self.health_listener = health_listener
        self.services = services
        self._run_janitor = run_janitor
        self._interceptor = interceptor
        self.health = store_health
        #: The metrics of this server only (see ``metrics``); serve it with ``start_exporter``.
        self.registry = registry
        self._executor = executor
        #: Measures this replica's clock against the store's (None on a store of its own).
        self.clock_check = clock_check

    @property
    def health_port(self) -> int | None:
        return self.health_listener.port if self.health_listener is not None else None

    def start(self) -> None:
        if self.health_listener is not None:
            self.health_listener.start()
        if self.clock_check is not None:
            self.clock_check.run_once()  # the first verdict before the first call
            self.clock_check.start()
        self.grpc.start()
        if self._run_janitor:
            self.services.janitor.start()

    def shutdown(self, grace_s: float | None) -> None:
        """Drain: NOT_SERVING first so health checkers move traffic away, then refuse new calls
        and give in-flight ones ``grace_s`` seconds before they are cancelled; returns when done."""
        self.health.enter_graceful_shutdown()
        if self._run_janitor:
            self.services.janitor.stop()  # step down now, so another replica can take over
        stopped = self.grpc.stop(grace_s)  # returns at once; new calls are refused from here on
        # Health watchers have seen NOT_SERVING; their streams would otherwise run to the end of
        # the grace period. Ended only after stop(), so that no new one can open behind us.
        ended = self._interceptor.end_open_streams()
        if ended:
            _log.info("ended %d health watch stream(s)", ended)
        stopped.wait()
        self.services.producers.close()  # no call is left to use its pooled intents
        if self.clock_check is not None:
            self.clock_check.stop()
        # Only now: probes on the health port saw NOT_SERVING all through the drain.
        if self.health_listener is not None:
            self.health_listener.stop()
        # Not wait=True: a handler stuck past the grace (say, in a backend call) must not hang the
        # exit; closing the stores afterwards makes such calls fail.
        self._executor.shutdown(wait=False, cancel_futures=True)

    def force_stop(self) -> None:
        """Cancel every in-flight call now (a second SIGTERM during a drain)."""
        self.grpc.stop(None)
        if self.health_listener is not None:
            self.health_listener.server.stop(None)


def keepalive_options(grpc_config: GrpcConfig) -> tuple[tuple[str, int], ...]:
    """The server's keepalive policy: which client pings it accepts before GOAWAY too_many_pings.

    gRPC's server default refuses pings closer than 5 minutes on a connection sending no data, and
    any ping on a connection without calls; after 2 such "strikes" it sends GOAWAY. A client that
    pings every minute through a quiet call (the snapcoord client's keepalive time; grpc-java and
    grpc-go clients keep pinging where the Python client stops after two) would be cut off.
    Pings without calls are accepted too: an idle connection kept warm is cheaper than a new one.
    (The C-core name of the interval is GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, but
    its key is ``grpc.http2.min_ping_interval_without_data_ms``.)
    """
    return (
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", grpc_config.keepalive_min_ping_interval_ms),
        ("grpc.http2.max_ping_strikes", grpc_config.keepalive_max_ping_strikes),
    )


def build_server(
    config: Config,
    deps: Deps,
    *,
    registry: CollectorRegistry | None = None,
    tracing: Tracing | None = None,
    check_clock: bool = True,
    admit_requests: bool = True,
) -> tuple[CoordinatorServer, int]:
    """Build (not start) a coordinator bound to ``config.grpc.host:port``; returns it and the bound port.

    With ``tracing``, every RPC gets a span and the stores are wrapped so that their calls are
    child spans of it (the backends themselves know nothing of tracing). On a shared (ZooKeeper)
    store the server checks its clock against the store's and refuses the calls that compute
    expiries while it is off (``check_clock=False`` only for tests: those showing what the check
    prevents, and those whose injected clock is moved away from ZooKeeper's on purpose).
    ``admit_requests=False`` serves unary requests without holding their messages from a budget
    (``server.admission``): only for the benchmark that measures what admission costs.
    """
    registry = registry if registry is not None else new_registry()
    build_info.register(registry, config.metrics.revision)
    raw_metadata = deps.metadata
    if tracing is not None:
        traced_metadata = tracing.trace_metadata(deps.metadata)
        deps = replace(deps, metadata=traced_metadata, blobs=tracing.trace_blobs(deps.blobs))
    bounds = memory_bounds(config)
    executor = ThreadPoolExecutor(max_workers=config.grpc.max_workers, thread_name_prefix="grpc-handler")
    grpc_metrics = GrpcServerMetrics(registry)
    initialize_api_series(grpc_metrics)  # rate-based alerts see a method's first error
    admission_interceptor = AdmissionInterceptor()
    try:
        # Inside the main interceptor, so refusals are mapped and counted like any other error.
        auth_interceptor = new_auth_interceptor(config.security)
        credentials = grpc_credentials(config.security)
    except ValueError:
        executor.shutdown(wait=False)
        raise
    # Admission between them: the main interceptor records its refusals, auth gets the parsed
    # request (server.admission). Both run as layers of the main one: one interceptor per call.
    interceptor = ServerInterceptor(
        grpc_metrics, version=__version__, tracer=tracing, layers=(admission_interceptor, auth_interceptor)
    )
    server = grpc.server(
        executor,
        interceptors=(interceptor,),
        maximum_concurrent_rpcs=config.grpc.max_concurrent_rpcs,
        # grpc sets SO_REUSEPORT by default: a second coordinator on a taken port would start
        # "fine" and get half the connections. Fail the bind instead, unless this is one of the
        # --processes sharing the port on purpose.
        options=(
            ("grpc.so_reuseport", 1 if config.grpc.reuse_port else 0),
            # --max-inline-payload and the envelope: a larger message is refused before it is
            # buffered (memory_bounds).
            ("grpc.max_receive_message_length", bounds.receive_limit_bytes),
            ("grpc.max_send_message_length", -1),
            # A fixed receive window per stream: with BDP probing, gRPC grows it while a client
            # streams an upload faster than the handler writes it to S3, and buffers that much
            # per upload outside the payload budget (measured: RSS at twice the budget with four
            # concurrent 64 MiB uploads). 4 MiB keeps a stream's throughput at S3's.
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", RECEIVE_WINDOW_BYTES),
            *keepalive_options(config.grpc),
        ),
    )
    interceptor.count_refusals(concurrency_limit_probe(server))
    address = hostport(config.grpc.host, config.grpc.port)
    try:
        port = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
    except RuntimeError as e:  # grpc reports a failed bind as RuntimeError (older versions: port 0)
        executor.shutdown(wait=False)
        raise OSError(f"cannot bind gRPC to {address}: {e} (port in use or address not local?)") from e
    if port == 0:
        executor.shutdown(wait=False)
        raise OSError(f"cannot bind gRPC to {address} (port in use or address not local?)")
    listener = None
    if config.grpc.health_port >= 0:
        reuse = ("grpc.so_reuseport", 1 if config.grpc.reuse_port else 0)
        try:
            address = hostport(config.grpc.health_host, config.grpc.health_port)
            listener = HealthListener(address, (reuse, *keepalive_options(config.grpc)))
        except OSError:
            server.stop(None)
            executor.shutdown(wait=False)
            raise
    # Wired after the binds, so that a failed bind leaves no listener registered on the store.
    metrics = CoordinatorMetrics(registry)
    clock_check = None
    read_clock = clock_probe(raw_metadata, deps.clock) if check_clock else None
    if read_clock is not None:  # other replicas share the store: expiries need agreeing clocks
        guard = ClockGuard(config.leases.max_clock_skew_ms)
        clock_check = ClockCheck(read_clock, guard, metrics)
        deps = replace(deps, clock=GuardedClock(deps.clock, guard))
    services = Services.build(config, deps, metrics)
    track_usable(metrics.metadata_store_usable, deps.metadata)
    if tracing is not None:
        services.janitor.trace_with(tracing.janitor_span)
    # Malformed request bytes: INVALID_ARGUMENT naming the RPC, not grpcio's INTERNAL.
    # From here on, each unary request message is held from a budget before gRPC receives it.
    admission = Admission(
        services.payload_budget,
        PayloadBudget(bounds.control_pool_bytes, config.grpc.payload_budget_wait_ms / 1000),
        bounds.message_hold_bytes,
        bounds.receive_limit_bytes,
    )
    if admit_requests:
        admission_interceptor.admit(admission)
    api.add_servicers(GuardedRegistration(server), services)
    store_health = StoreHealth(
        deps.metadata,
        api.SERVICE_NAMES,
        blobs=deps.blobs,
        blob_services=BLOB_SERVICE_NAMES,
        blob_probe_interval_s=config.storage.blob_probe_interval_ms / 1000,
    )
    health_pb2_grpc.add_HealthServicer_to_server(store_health.servicer, server)
    reflection.enable_reflection(server, ALL_SERVICE_NAMES)
    if listener is not None:
        listener.serve(store_health.servicer)
    coordinator = CoordinatorServer(
        server,
        executor,
        store_health,
        registry,
        interceptor,
        services,
        config.janitor.enabled,
        listener,
        clock_check,
    )
    return coordinator, port


def run(config: Config, *, out: TextIO = sys.stdout) -> int:
    """Serve until SIGTERM/SIGINT, then drain and close; returns the process exit code.

    Must run on the main thread (signal handlers). Prints one line to ``out`` once serving:
    ``snapcoord serving grpc=HOST:PORT metrics=HOST:PORT`` (``metrics=disabled`` with port -1),
    followed by `` health=HOST:PORT`` when the health-only port is on; with a JSON log, a JSON
    object with that ``message`` and the addresses as keys ``grpc``, ``metrics``, ``health``.
    """
    check_lease_requests_fit(config)
    check_memory_bounds(config)
    count = process_count(config)
    config = replace(config, grpc=replace(config.grpc, processes=count))  # auto resolved from here on
    if count > 1:
        return serve_processes(config, count, out=out)
    _log.info("snapcoord %s starting; effective config: %s", __version__, json.dumps(config.describe()))
    tracing: Tracing | None = None
    if config.tracing.enabled:
        from snapcoord.coordinator.observability import tracing as otel

        tracing = otel.from_config(config.tracing)
    storage = config.storage
    metadata = open_metadata_store(storage.metadata_uri, options=storage.metadata_options())
    blobs: BlobStore | None = None
    exporter: MetricsExporter | None = None
    stop: _StopSignals | None = None
    try:
        blobs = open_blob_store(storage.blobs_uri, options=storage.blob_options())
        blobs.check()  # a missing bucket or a rejected key fails the start, not a later RPC
        server, port = build_server(config, Deps(metadata=metadata, blobs=blobs), tracing=tracing)
        stop = _StopSignals(server)
        drained = False
        try:
            if config.metrics.enabled:
                exporter = start_exporter(
                    server.registry,
                    config.metrics.host,
                    config.metrics.port,
                    certfile=config.metrics.tls_cert,
                    keyfile=config.metrics.tls_key,
                )
            server.start()
            addresses = {
                "grpc": hostport(config.grpc.host, port),
                "metrics": hostport(exporter.host, exporter.port) if exporter else "disabled",
            }
            if server.health_port is not None:
                addresses["health"] = hostport(config.grpc.health_host, server.health_port)
            line = "snapcoord serving " + " ".join(f"{k}={v}" for k, v in addresses.items())
            _log.info("%s", line)
            print(logging_setup.serving_line(line, **addresses), file=out)
            out.flush()
            signum = stop.wait()
            grace_s = config.grpc.shutdown_grace_ms / 1000
            _log.info("%s: draining (grace %.1fs)", signal.Signals(signum).name, grace_s)
            server.shutdown(grace_s)
            drained = True
            _log.info("gRPC server stopped")
        finally:
            if not drained:  # failed between start and drain: do not leave grpc threads behind
                server.shutdown(0)
    finally:
        # Reverse order of opening; closing the metadata store ends the ZooKeeper session, which
        # removes this replica's ephemeral nodes at once instead of after the session timeout.
        if exporter is not None:
            exporter.stop()
        if blobs is not None:
            blobs.close()
        metadata.close()
        if tracing is not None:
            tracing.shutdown()  # exports the spans still buffered
        # Last: a SIGTERM repeated while the stores close (a supervisor that signals the process
        # group, then each process) is absorbed instead of ending the process with 143.
        if stop is not None:
            stop.restore()
    _log.info("stopped")
    return 0


class _StopSignals:
    """SIGTERM/SIGINT: the first starts the drain, a second one cuts the grace period short.

    Python runs signal handlers on the main thread only, and only when it executes bytecode. A
    signal the kernel delivers to another thread (grpc's, kazoo's) does not wake a main thread
    blocked in ``Event.wait()``, so a handler that sets the event may never run (a SIGTERM right
    after start would then hang the process). A handler that takes a lock can also deadlock against the main
    thread it interrupts. So the Python handler does nothing; the interpreter's C-level wakeup fd
    carries the signal number, from whichever thread got it, to a watcher thread.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, server: CoordinatorServer) -> None:
        self._server = server
        self._received = threading.Event()
        self._signum = 0
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # set_wakeup_fd requires it
        # The wakeup fd first, then the handlers: a signal in between still reaches the watcher.
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        for signum in self.SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, _ignore_signal)
        self._watcher = threading.Thread(target=self._watch, name="signal-watcher", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        seen = 0
        while data := os.read(self._read_fd, 1):  # EOF once restore() closes the write end
            signum = data[0]
            if signum not in self.SIGNALS:
                continue  # another signal with a Python handler also writes here
            seen += 1
            if seen == 1:
                self._signum = signum
                self._received.set()
            else:
                _log.warning("%s again: cancelling in-flight calls", signal.Signals(signum).name)
                self._server.force_stop()

    def wait(self, timeout_s: float | None = None) -> int:
        """Block until the first SIGTERM/SIGINT; returns its number (0 after ``timeout_s``)."""
        return self._signum if self._received.wait(timeout_s) else 0

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._write_fd)
        self._watcher.join()
        os.close(self._read_fd)


def _ignore_signal(signum: int, frame: FrameType | None) -> None:
    """Replaces the default action (exit, KeyboardInterrupt); the wakeup fd does the work."""
