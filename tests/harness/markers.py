"""The markers that keep the fast subset (``scripts/test --fast``) free of servers and processes.

A test carries ``zookeeper``, ``s3``, ``spark`` or ``process`` when it needs that server or starts a
process. Most get their markers from the fixtures they use (``FIXTURE_MARKS``, applied at collection);
tests that start something without such a fixture say so with the marker itself.

``SpawnGuard`` keeps the markers true: while an unmarked test runs, starting a process fails it, naming
the marker it lacks. So a new test that starts a server or process without its marker fails in every run
(CI's included) instead of slowing down the fast subset unnoticed.
"""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# Registered, with their meanings, in pyproject.toml's [tool.pytest.ini_options] markers.
MARKERS = ("zookeeper", "s3", "spark", "process")

# Every fixture that starts a server or a process, and what it starts. Fixtures that use these inherit
# the markers through pytest's fixture closure, so only the starting fixture needs an entry.
FIXTURE_MARKS: dict[str, tuple[str, ...]] = {
    "zk_server": ("zookeeper",),
    "private_zk_server": ("zookeeper",),
    "s3_server": ("s3",),
    "private_s3_server": ("s3",),
    "spark": ("spark",),
    "spark_connect_server": ("spark",),
    "sshd": ("process",),
    "hdfs": ("process",),
    "kafka": ("process",),
    "zk_coordinator": ("process",),
    "cluster": ("zookeeper", "process"),
}


def check_registered(config: pytest.Config) -> None:
    registered = {line.split(":", 1)[0].strip() for line in config.getini("markers")}
    missing = [name for name in MARKERS if name not in registered]
    if missing:
        raise pytest.UsageError(f"register the markers {missing} in pyproject.toml [tool.pytest.ini_options]")


def fast_subset(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect every marked test: what is left needs no server and starts no process."""
    marked = [item for item in items if is_marked(item)]
    if marked:
        config.hook.pytest_deselected(items=marked)
        items[:] = [item for item in items if not is_marked(item)]


def mark_by_fixtures(items: list[pytest.Item]) -> None:
    """Add the markers of every server- or process-starting fixture in each test's fixture closure."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, markers in FIXTURE_MARKS.items():
            if fixture in names:
                for marker in markers:
                    item.add_marker(marker)


def is_marked(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) is not None for name in MARKERS)


class SpawnGuard:
    """Refuses to start processes from the main thread while an unmarked test runs.

    In a full run, background threads are left alone: the harness boots the shared servers in threads
    that may outlive the marked test that started them (tests/conftest.py checks their launch, which
    happens on the test's thread, instead). In the fast subset no marked test runs, so ``all_threads``
    refuses starts from any thread. ctypes' library lookup (``ldconfig -p``) is allowed too: it is how
    ``ctypes.util.find_library`` works, not a process the test means to start.

    A test that asks for a server fixture dynamically (``request.getfixturevalue``) while a marked test
    has already started it gets it without a process start; the fast subset still catches it, since
    there no marked test runs and the first request launches the server.
    """

    def __init__(self, *, all_threads: bool) -> None:
        self._all_threads = all_threads
        self._test: str | None = None
        self._patches = pytest.MonkeyPatch()

    def install(self) -> None:
        check = self.check
        execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
        spawnv_passfds = multiprocessing.util.spawnv_passfds
        fork = os.fork

        def guarded_execute_child(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
            check(args)
            return execute_child(popen, args, *rest, **kwargs)

        def guarded_spawnv_passfds(path: Any, args: Any, passfds: Any) -> int:
            check(args)
            return spawnv_passfds(path, args, passfds)

        def guarded_fork() -> int:
            check("os.fork()")
            return fork()

        self._patches.setattr(subprocess.Popen, "_execute_child", guarded_execute_child)
        self._patches.setattr(multiprocessing.util, "spawnv_passfds", guarded_spawnv_passfds)
        self._patches.setattr(os, "fork", guarded_fork)

    def uninstall(self) -> None:
        self._patches.undo()

    @contextmanager
    def refusing(self, item: pytest.Item) -> Iterator[None]:
        """Refuse process starts during ``item``'s setup, call and teardown unless it carries a marker."""
        self._test = None if is_marked(item) else item.nodeid
        try:
            yield
        finally:
            self._test = None

    def check(self, args: Any) -> None:
        test = self._test
        if test is None or not (self._all_threads or threading.current_thread() is threading.main_thread()):
            return
        if _called_from_ctypes_lookup():
            return
        command = args if isinstance(args, str) else " ".join(str(a) for a in args)
        pytest.fail(
            f"{test} started a process ({command[:200]}) but carries none of the markers "
            f"{', '.join(MARKERS)}: mark it (e.g. @pytest.mark.process, or pytestmark for its module) "
            "so that scripts/test --fast leaves it out",
            pytrace=True,
        )


def _called_from_ctypes_lookup() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("ctypes", "util.py")):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
