"""The guard that keeps the markers true: an unmarked test that starts a process fails, naming them.

These tests start processes themselves (``true``), so they carry ``process``: the session's guard then
leaves them alone and only the guard under test decides.
"""

from __future__ import annotations

import ctypes.util
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import pytest

from harness.markers import MARKERS, SpawnGuard

pytestmark = pytest.mark.process


@dataclass(frozen=True)
class _Item:
    """The two things the guard reads from a test item."""

    nodeid: str
    markers: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def _guard(*, all_threads: bool) -> Iterator[SpawnGuard]:
    guard = SpawnGuard(all_threads=all_threads)
    guard.install()
    try:
        yield guard
    finally:
        guard.uninstall()


@pytest.fixture
def guard() -> Iterator[SpawnGuard]:
    yield from _guard(all_threads=False)


@pytest.fixture
def fast_guard() -> Iterator[SpawnGuard]:
    yield from _guard(all_threads=True)


def _in_a_thread() -> list[BaseException]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            subprocess.run(["true"], check=True)
        except BaseException as error:  # pytest.fail raises a BaseException
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return errors


def test_an_unmarked_test_that_starts_a_process_fails_naming_the_markers(guard: SpawnGuard) -> None:
    with (
        guard.refusing(cast(pytest.Item, _Item("t::unmarked"))),
        pytest.raises(pytest.fail.Exception) as failed,
    ):
        subprocess.run(["true"], check=True)
    message = str(failed.value)
    assert "t::unmarked started a process (true)" in message
    assert all(name in message for name in MARKERS)


@pytest.mark.parametrize("marker", MARKERS)
def test_a_marked_test_may_start_processes(guard: SpawnGuard, marker: str) -> None:
    with guard.refusing(cast(pytest.Item, _Item("t::marked", (marker,)))):
        subprocess.run(["true"], check=True)


def test_outside_a_test_nothing_is_refused(guard: SpawnGuard) -> None:
    subprocess.run(["true"], check=True)


def test_a_full_run_spares_background_threads_and_the_fast_subset_does_not(
    guard: SpawnGuard, fast_guard: SpawnGuard
) -> None:
    with guard.refusing(cast(pytest.Item, _Item("t::unmarked"))):
        assert _in_a_thread() == []  # the shared servers boot in such threads
    with fast_guard.refusing(cast(pytest.Item, _Item("t::unmarked"))):
        errors = _in_a_thread()
    assert len(errors) == 1 and "carries none of the markers" in str(errors[0])


def test_ctypes_library_lookup_is_allowed(fast_guard: SpawnGuard) -> None:
    with fast_guard.refusing(cast(pytest.Item, _Item("t::unmarked"))):
        assert ctypes.util.find_library("c") is not None  # runs ldconfig -p
