"""``--processes N``: N coordinator processes serving one port, so that the server uses N cores.

gRPC Python's documented way to use several cores: each process is a complete coordinator (its
own gRPC server bound with SO_REUSEPORT, its own ZooKeeper session and S3 client, its own health
service and janitor candidacy: the ZooKeeper election makes one janitor leader among them) and
the kernel spreads incoming connections over them. This process is only the supervisor: it starts
the workers (``spawn``: nothing of the parent's threads or sessions is inherited), prints one
serving line once every worker serves, forwards SIGTERM/SIGINT, and exits when they have drained.
A worker that dies stops the others: the supervisor above us (systemd, Kubernetes) restarts the
whole set, rather than this process running short of workers unnoticed. With metrics on, this
process serves them for the whole set on ``--metrics-port`` (``shared_metrics``); workers serve none.
"""

from __future__ import annotations

import io
import logging
import multiprocessing
import os
import re
import signal
import socket
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Literal, TextIO

from snapcoord.coordinator.config.environment import processes_refusal
from snapcoord.coordinator.config.settings import Config, hostport
from snapcoord.coordinator.observability import logging_setup
from snapcoord.coordinator.server.cpus import usable_cpus
from snapcoord.coordinator.server.shared_metrics import SharedMetrics

_log = logging.getLogger(__name__)

#: How long a worker may take to connect to its stores and start serving.
START_TIMEOUT_S = 120.0


def process_count(config: Config) -> int:
    """How many processes to serve with: ``--processes`` with ``auto`` resolved (logged with its
    reasons); an explicit count above 1 without ZooKeeper metadata is refused (ValueError)."""
    asked = config.grpc.processes
    # The embedded store belongs to one process: others would not see its watches, and their
    # janitors would not elect one leader.
    zookeeper = config.storage.metadata_uri.startswith("zk://")
    if asked == "auto":
        if not zookeeper:  # warned at start (config.environment.embedded_store_warnings)
            return 1
        cpus = usable_cpus()
        _log.info("--processes auto: %s", cpus)
        return cpus.count
    refused = processes_refusal(asked, config.storage.metadata_uri)  # load refuses it too
    if refused is not None:
        raise ValueError(refused)
    return asked


def worker_config(config: Config, port: int) -> Config:
    """A worker's config: the shared port, SO_REUSEPORT, and no metrics exporter of its own (the
    supervisor serves every worker's metrics on ``--metrics-port``)."""
    return replace(
        config,
        grpc=replace(config.grpc, port=port, processes=1, reuse_port=True),
        metrics=replace(config.metrics, port=-1),
    )


def _worker(config: Config, out: Connection, log_level: int, log_format: Literal["json", "text"]) -> None:
    """A worker's main: serve until SIGTERM; its serving line goes to the supervisor."""
    # Its own process group: a terminal's Ctrl-C reaches the supervisor only, which forwards it
    # once (a second SIGINT would cut the drain short).
    os.setpgrp()
    # ... which also means a SIGKILL of the supervisor's group would leave us serving: watch it.
    supervisor = os.getppid()
    threading.Thread(target=_exit_with, args=(supervisor,), name="supervisor-watch", daemon=True).start()
    if log_format == "json":  # the supervisor passes JSON lines on its stderr through as they are
        logging_setup.configure(logging.getLevelName(log_level), "json")
    else:
        logging.basicConfig(
            level=log_level, format=f"%(asctime)s %(levelname)s [worker {os.getpid()}] %(name)s: %(message)s"
        )
    from snapcoord.coordinator.server.app import run

    class _Line(io.StringIO):
        def flush(self) -> None:
            for line in self.getvalue().splitlines():
                out.send(line)
            self.seek(0)
            self.truncate()

    try:
        code = run(config, out=_Line())
    except Exception as e:
        logging.getLogger(__name__).error("worker failed: %s", e)
        code = 1
    out.close()
    raise SystemExit(code)


def _exit_with(supervisor: int) -> None:
    """Drain and exit (SIGTERM to ourselves) once the supervisor is gone."""
    while os.getppid() == supervisor:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _shared_port(host: str, port: int) -> tuple[int, socket.socket | None]:
    """The port the workers share; for port 0 a free one, held by a SO_REUSEPORT socket (not
    listening, so it takes no connections) until the workers have bound it."""
    if port != 0:
        return port, None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((host, 0))
    return int(holder.getsockname()[1]), holder


def serve_processes(config: Config, count: int, *, out: TextIO) -> int:
    """Run ``count`` workers (``process_count``) on one port until SIGTERM/SIGINT; the exit code
    is the worst of theirs."""
    # First, so that a taken metrics port fails the start before any worker runs, and so that the
    # workers inherit the metrics directory in their environment.
    shared = SharedMetrics.start(config.metrics) if config.metrics.enabled else None
    try:
        return _serve(config, count, shared, out=out)
    finally:
        if shared is not None:
            shared.close()  # every worker has exited by now


def _serve(config: Config, count: int, shared: SharedMetrics | None, *, out: TextIO) -> int:
    context = multiprocessing.get_context("spawn")
    port, holder = _shared_port(config.grpc.host, config.grpc.port)
    workers = _Workers(shared)
    lines: list[str] = []
    log_level = logging.getLogger().getEffectiveLevel()
    try:
        for index in range(count):
            receive, send = context.Pipe(duplex=False)
            worker = context.Process(
                target=_worker,
                args=(worker_config(config, port), send, log_level, logging_setup.chosen_format()),
                name=f"snapcoord-worker-{index}",
            )
            worker.start()
            send.close()
            workers.started(index, worker)
            # One at a time: a worker that cannot start (a store that refuses it) fails the
            # start before the next one is tried.
            if not receive.poll(START_TIMEOUT_S):
                _log.error("worker %d did not start serving within %.0fs", index, START_TIMEOUT_S)
                return workers.stop(1)
            try:
                lines.append(logging_setup.serving_message(str(receive.recv())))
            except EOFError:
                worker.join()
                _log.error("worker %d exited with code %s before serving", index, worker.exitcode)
                return workers.stop(1)
    except BaseException:
        workers.stop(1)
        raise
    finally:
        if holder is not None:
            holder.close()
    # Every worker printed "snapcoord serving grpc=H:P metrics=disabled"; one line for the set,
    # naming the metrics address this process serves for all of them.
    _log.info("serving with %d processes: %s", count, "; ".join(lines))
    metrics_at = hostport(shared.exporter.host, shared.exporter.port) if shared else "disabled"
    line = re.sub(r" metrics=\S+", f" metrics={metrics_at}", lines[0], count=1)
    fields = dict(pair.split("=", 1) for pair in line.removeprefix("snapcoord serving ").split())
    print(logging_setup.serving_line(line, **fields), file=out)
    out.flush()
    return workers.supervise()


class _Workers:
    """The running workers; every exit seen is reported to the shared metrics once."""

    def __init__(self, shared: SharedMetrics | None) -> None:
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._shared = shared

    def started(self, index: int, worker: multiprocessing.process.BaseProcess) -> None:
        self.processes.append(worker)
        if self._shared is not None and worker.pid is not None:
            self._shared.worker_started(index, worker.pid)

    def _alive(self) -> list[multiprocessing.process.BaseProcess]:
        """The live workers; reports the dead ones (mark_process_dead), so that a dead janitor
        leader's gauge leaves the aggregate while the others drain."""
        alive = []
        for worker in self.processes:
            if worker.is_alive():
                alive.append(worker)
            elif self._shared is not None and worker.pid is not None:
                self._shared.worker_exited(worker.pid)
        return alive

    def _signal(self, signum: int) -> None:
        for worker in self._alive():
            if worker.pid is not None:
                os.kill(worker.pid, signum)

    def supervise(self) -> int:
        signals = {signal.SIGTERM, signal.SIGINT}
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # taken by sigtimedwait below
        try:
            while True:
                info = signal.sigtimedwait(signals, 0.5)
                if info is not None:
                    name = signal.Signals(info.si_signo).name
                    _log.info("%s: stopping %d workers", name, len(self.processes))
                    self._signal(info.si_signo)
                    break
                if len(self._alive()) < len(self.processes):
                    dead = next(w for w in self.processes if not w.is_alive())
                    _log.error("worker %s exited (code %s): stopping the others", dead.name, dead.exitcode)
                    return self.stop(1)
            # Drain: a second signal is forwarded too (the workers then cancel in-flight calls).
            while self._alive():
                info = signal.sigtimedwait(signals, 0.2)
                if info is not None:
                    self._signal(info.si_signo)
            return max(
                (w.exitcode or 0) if w.exitcode is not None and w.exitcode >= 0 else 1 for w in self.processes
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def stop(self, code: int) -> int:
        """SIGTERM every live worker and wait for them (they drain), then SIGKILL stragglers."""
        for worker in self._alive():
            worker.terminate()
        deadline = time.monotonic() + 60
        for worker in self.processes:
            worker.join(max(0.1, deadline - time.monotonic()))
            if worker.is_alive():
                worker.kill()
                worker.join()
        self._alive()  # reports the last exits
        return code
