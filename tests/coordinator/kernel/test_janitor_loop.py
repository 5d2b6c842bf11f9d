"""The janitor loop: bounded steps, failures isolated, pauses when it may not act, runs on the
embedded store's always-leader election."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from harness.process import wait_until
from snapcoord.coordinator.errors import Internal, StoreUnavailable
from snapcoord.coordinator.kernel.janitor_loop import Janitor, Step
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.storage.backends import open_metadata_store
from snapcoord.coordinator.storage.election import Election


def no_election() -> Election:
    pytest.fail("run_once needs no election")


def recording(log: list[str], name: str, result: int = 0) -> Callable[[], int]:
    def step() -> int:
        log.append(name)
        return result

    return step


def failing(log: list[str], error: type[Exception]) -> Callable[[], int]:
    def step() -> int:
        log.append(error.__name__)
        raise error("backend trouble (test)")

    return step


def passes(registry: CollectorRegistry, step: str, outcome: str) -> float | None:
    return registry.get_sample_value("snapcoord_janitor_passes_total", {"step": step, "outcome": outcome})


def test_run_once_isolates_failing_steps() -> None:
    registry = new_registry()
    log: list[str] = []
    steps = [
        Step("a", recording(log, "a", 3)),
        Step("down", failing(log, StoreUnavailable)),
        Step("bug", failing(log, Internal)),
        Step("b", recording(log, "b")),
    ]
    janitor = Janitor(steps, election=no_election, interval_ms=1000, metrics=CoordinatorMetrics(registry))
    assert janitor.run_once() == {"a": 3, "b": 0}
    assert log == ["a", "StoreUnavailable", "Internal", "b"]
    assert passes(registry, "down", "interrupted") == 1
    assert passes(registry, "bug", "error") == 1
    assert passes(registry, "a", "ok") == 1


def test_run_once_stops_as_soon_as_it_may_not_act() -> None:
    allowed = [True, True, False]
    log: list[str] = []
    steps = [Step(name, recording(log, name)) for name in ("a", "b", "c")]
    janitor = Janitor(
        steps, election=no_election, interval_ms=1000, metrics=CoordinatorMetrics(new_registry())
    )
    janitor.run_once(lambda: allowed.pop(0))
    assert log == ["a", "b"]


def test_a_costly_step_runs_at_most_every_interval() -> None:
    log: list[str] = []
    steps = [
        Step("cheap", recording(log, "cheap")),
        Step("sweep", recording(log, "sweep"), every_ms=3_600_000),
    ]
    metrics = CoordinatorMetrics(new_registry())
    janitor = Janitor(steps, election=no_election, interval_ms=1000, metrics=metrics)
    janitor.run_once()
    janitor.run_once()
    assert log == ["cheap", "sweep", "cheap"]


def test_the_janitor_runs_passes_while_leading_and_stops(tmp_path: Path) -> None:
    store = open_metadata_store((tmp_path / "metadata").as_uri())
    ran = threading.Semaphore(0)

    def count() -> int:
        ran.release()
        return 0

    registry = new_registry()
    janitor = Janitor(
        [Step("count", count)],
        election=lambda: store.election("janitor", "test"),
        interval_ms=20,
        metrics=CoordinatorMetrics(registry),
    )
    janitor.start()
    try:
        for _ in range(3):  # several passes, one per interval
            assert ran.acquire(timeout=30)
        wait_until(
            lambda: registry.get_sample_value("snapcoord_janitor_leader") == 1,
            timeout=30,
            what="the leader gauge",
        )
    finally:
        janitor.stop()
    assert registry.get_sample_value("snapcoord_janitor_leader") == 0
    store.close()
