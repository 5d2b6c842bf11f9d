"""One metrics endpoint for ``--processes N``: prometheus_client's multiprocess mode.

Each worker's prometheus_client writes its values to memory-mapped files in a directory named by
``PROMETHEUS_MULTIPROC_DIR``; the supervisor serves ``MultiProcessCollector`` over that directory
on ``--metrics-port``, so one scrape covers every process: counters and histograms are summed,
the cluster gauges (``livemax``, see ``metrics``) are the maximum over the live workers. The
library picks multiprocess mode when its value class is imported, so the variable is set in the
supervisor's environment before the workers are spawned (they inherit it before importing
anything), and only by a supervisor: a single-process server keeps its plain in-memory registry.

The directory is fresh and private for each run (``mkdtemp``) and removed on exit: files left by
an earlier run would bring its counts back. A supervisor killed outright cannot remove its own;
the next one to start under the same temp dir does, knowing it abandoned by its lock: each
supervisor holds an flock on a file in its directory, which the kernel releases however the
process dies (a pid would not do: in a container the supervisor is pid 1 every time).

The process collectors do not work across processes (the library's docs say so): each process's
``process_*`` series (CPU, memory, file descriptors, read from ``/proc/<pid>``) are exported with a
``process`` label instead (``supervisor``, ``worker-0``, ...), stable across restarts. The GC
collector reads the calling interpreter only, so it is left out; ``python_info`` is the same for
every process and stays.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable

from prometheus_client import PLATFORM_COLLECTOR, CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from snapcoord.coordinator.config.settings import MetricsConfig
from snapcoord.coordinator.observability import build_info
from snapcoord.coordinator.observability.metrics import MetricsExporter, start_exporter

_log = logging.getLogger(__name__)

#: The variable that puts prometheus_client in multiprocess mode, naming its directory.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The metrics directories' names start with this, under the temp dir (``$TMPDIR``).
DIRECTORY_PREFIX = "snapcoord-metrics-"
#: In each directory, the file its supervisor holds locked while it lives (not ``*.db``: the
#: collector reads those).
LOCK_FILE = "supervisor.lock"


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

    def __init__(self, directory: str, lock_fd: int, exporter: MetricsExporter, stats: ProcessStats) -> None:
        self.directory = directory
        self.exporter = exporter
        self._lock_fd = lock_fd
        self._stats = stats
        self._previous_env = os.environ.get(MULTIPROC_DIR_ENV)
        self._reported: set[int] = set()

    @classmethod
    def start(cls, config: MetricsConfig) -> SharedMetrics:
        """Create the directory, point the environment (what spawned workers inherit) at it and
        serve the aggregate on ``config``'s address; a failed bind undoes both and raises OSError."""
        for abandoned in remove_abandoned(tempfile.gettempdir()):
            _log.warning("removed %s, left by a supervisor that did not exit cleanly", abandoned)
        directory = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)
        lock_fd = -1
        try:
            lock_fd = _hold_lock(directory)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
            registry.register(PLATFORM_COLLECTOR)
            build_info.register(registry, config.revision)
            stats = ProcessStats()
            registry.register(stats)
            exporter = start_exporter(
                registry, config.host, config.port, certfile=config.tls_cert, keyfile=config.tls_key
            )
        except BaseException:
            _remove(directory)
            if lock_fd >= 0:
                os.close(lock_fd)
            raise
        shared = cls(directory, lock_fd, exporter, stats)
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
        os.close(self._lock_fd)  # after the removal: until then, no other start may take it


def _hold_lock(directory: str) -> int:
    """Lock ``directory``'s LOCK_FILE for as long as this process lives; returns the fd.

    Locked under another name and renamed into place, so that the file is never seen unlocked:
    another supervisor's ``remove_abandoned`` could otherwise take it in between and remove a
    directory just created."""
    staging = os.path.join(directory, LOCK_FILE + ".new")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, os.path.join(directory, LOCK_FILE))
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_abandoned(parent: str) -> list[str]:
    """Remove the metrics directories under ``parent`` whose supervisor is gone (their lock is
    free); returns them. Left alone: a directory a live supervisor holds, one of another user,
    anything that is not a plain directory, and one without a lock file (its supervisor died
    within ``start``; never read again, and too small to matter)."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError as e:
        _log.warning("could not look for abandoned metrics directories in %s: %s", parent, e)
        return removed
    for entry in entries:
        if not entry.name.startswith(DIRECTORY_PREFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(entry.path, LOCK_FILE), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, or no lock file
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its supervisor lives
        try:
            # Held while removing: a start sweeping at the same time takes it for a live one.
            shutil.rmtree(entry.path)
            removed.append(entry.path)
        except FileNotFoundError:
            pass  # another supervisor starting at the same time removed it first
        except OSError as e:
            _log.warning("could not remove the abandoned metrics directory %s: %s", entry.path, e)
        finally:
            os.close(fd)
    return removed


def _remove(directory: str) -> None:
    try:
        shutil.rmtree(directory)
    except OSError as e:  # the exit goes on; the directory is never read again
        _log.warning("could not remove the metrics directory %s: %s", directory, e)
