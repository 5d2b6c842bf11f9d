"""One metrics endpoint for ``--processes N``: prometheus_client's multiprocess mode.

Each worker's prometheus_client writes its values to memory-mapped files in a directory named by
``PROMETHEUS_MULTIPROC_DIR``; the supervisor serves ``MultiProcessCollector`` over that directory
on ``--metrics-port``, so one scrape covers every process: counters and histograms are summed,
the cluster gauges (``livemax``, see ``metrics``) are the maximum over the live workers. The
library picks multiprocess mode when its value class is imported, so the variable is set in the
supervisor's environment before the workers are spawned (they inherit it before importing
anything), and only then: a single-process server keeps its plain in-memory registry.

The directory is fresh and private for each run (``mkdtemp``) and removed on exit: files left by
an earlier run would bring its counts back. (A supervisor killed outright leaves its directory
behind; it is never read again.)

The process collectors do not work across processes (the library's docs say so): each process's
``process_*`` series (CPU, memory, file descriptors, read from ``/proc/<pid>``) are exported with a
``process`` label instead (``supervisor``, ``worker-0``, ...), stable across restarts. The GC
collector reads the calling interpreter only, so it is left out; ``python_info`` is the same for
every process and stays.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterable

from prometheus_client import PLATFORM_COLLECTOR, CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from snapcoord.coordinator.config import MetricsConfig
from snapcoord.coordinator.metrics import MetricsExporter, start_exporter

_log = logging.getLogger(__name__)

#: The variable that puts prometheus_client in multiprocess mode, naming its directory.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class ProcessStats:
    """``process_*`` series of each process of the set, labelled ``process="<name>"``."""

    def __init__(self) -> None:
        self._collectors: dict[str, ProcessCollector] = {"supervisor": ProcessCollector(registry=None)}

    def add(self, name: str, pid: int) -> None:
        """Report ``pid`` as ``name`` from now on (a later ``add`` of the same name replaces it)."""
        self._collectors[name] = ProcessCollector(pid=lambda: pid, registry=None)

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        # A copy: add() runs on the supervisor's thread while a scrape collects here. A process
        # that has exited yields nothing (ProcessCollector ignores a missing /proc/<pid>).
        for name, collector in list(self._collectors.items()):
            for family in collector.collect():
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "process": name}, sample.value)
        return list(families.values())


class SharedMetrics:
    """The workers' metrics directory and the supervisor's exporter over it; ``close`` removes both."""

    def __init__(self, directory: str, exporter: MetricsExporter, stats: ProcessStats) -> None:
        self.directory = directory
        self.exporter = exporter
        self._stats = stats
        self._previous_env = os.environ.get(MULTIPROC_DIR_ENV)
        self._reported: set[int] = set()

    @classmethod
    def start(cls, config: MetricsConfig) -> SharedMetrics:
        """Create the directory, point the environment (what spawned workers inherit) at it and
        serve the aggregate on ``config``'s address; a failed bind undoes both and raises OSError."""
        directory = tempfile.mkdtemp(prefix="snapcoord-metrics-")
        try:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
            registry.register(PLATFORM_COLLECTOR)
            stats = ProcessStats()
            registry.register(stats)
            exporter = start_exporter(
                registry, config.host, config.port, certfile=config.tls_cert, keyfile=config.tls_key
            )
        except BaseException:
            _remove(directory)
            raise
        shared = cls(directory, exporter, stats)
        os.environ[MULTIPROC_DIR_ENV] = directory
        _log.info("metrics of every process aggregated from %s", directory)
        return shared

    def worker_started(self, index: int, pid: int) -> None:
        self._stats.add(f"worker-{index}", pid)

    def worker_exited(self, pid: int) -> None:
        """Drop a dead worker's live gauges (its janitor_leader=1 must not outlive it); its
        counters stay in the sums, as counters of a finished process do. Once per pid."""
        if pid in self._reported:
            return
        self._reported.add(pid)
        mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Stop serving, restore the environment and remove the directory (after the workers
        have exited: a live one would write to a removed file)."""
        self.exporter.stop()
        if self._previous_env is None:
            os.environ.pop(MULTIPROC_DIR_ENV, None)
        else:
            os.environ[MULTIPROC_DIR_ENV] = self._previous_env
        _remove(self.directory)


def _remove(directory: str) -> None:
    try:
        shutil.rmtree(directory)
    except OSError as e:  # the exit goes on; the directory is never read again
        _log.warning("could not remove the metrics directory %s: %s", directory, e)
