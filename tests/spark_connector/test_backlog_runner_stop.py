"""A switch stops the query and starts it again with the other trigger. A failure the query ends
with as the switch stops it is logged and the query starts again from its checkpoint (file system
clients report the stop's interrupt as all sorts of failures); a failure of a query the runner did
not stop is raised.

Pure logic, with stand-ins for the query and the tracker and PySpark's own exception class (the
Spark Connect one needs no JVM); the runs on real Spark, with the checkpoint on a real sftp server,
are in ``test_backlog_runner.py``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from pyspark.errors.exceptions.connect import StreamingQueryException

from snapcoord.spark_connector.backlog.runner import BacklogAwareRunner

CATCH_UP: dict[str, Any] = {"availableNow": True}
STEADY: dict[str, Any] = {"processingTime": "200 milliseconds"}

# What a classic driver raised for a stop that cut Hadoop's sftp listing short (a CI run).
CUT_LISTING = "batch 4 doesn't exist\n=== Streaming Query ===\nCurrent State: TERMINATED"


@dataclass
class Query:
    """What the runner reads of a ``StreamingQuery``; ``fails_on_stop`` is what it ends with."""

    trigger: dict[str, Any]
    fails_on_stop: BaseException | None = None
    id: str = "q-1"
    runId: str = "run-1"  # PySpark's names
    name: str = "events"
    isActive: bool = True
    recentProgress: list[Any] = field(default_factory=list)
    failure: BaseException | None = None

    def stop(self) -> None:
        self.isActive = False
        self.failure = self.fails_on_stop

    def exception(self) -> BaseException | None:
        return self.failure


class Tracker:
    """The tracker calls of a switch, for a job that has caught up."""

    def __init__(self) -> None:
        self.processing_backlog = False

    def observe(self, progress: Any) -> bool:
        return False

    def flush(self) -> bool:
        return True

    def caught_up(self) -> bool:
        return True


class Starter:
    def __init__(self, fails_on_stop: list[BaseException | None]) -> None:
        self.fails_on_stop = fails_on_stop
        self.started: list[Query] = []

    def __call__(self, trigger: dict[str, Any]) -> Query:
        fails = self.fails_on_stop.pop(0) if self.fails_on_stop else None
        query = Query(dict(trigger), fails_on_stop=fails)
        self.started.append(query)
        return query


def running(starter: Starter) -> BacklogAwareRunner:
    """A runner in catch-up with a running query, as after ``start()``."""
    runner = BacklogAwareRunner(starter, "job", client=None, catch_up_trigger=CATCH_UP, steady_trigger=STEADY)  # type: ignore[arg-type]
    runner.tracker = Tracker()  # type: ignore[assignment]
    runner.phase = "catch_up"
    runner._launch(CATCH_UP)
    return runner


def test_a_failure_as_the_switch_stops_the_query_restarts_it(caplog: pytest.LogCaptureFixture) -> None:
    starter = Starter([StreamingQueryException(message=CUT_LISTING)])
    runner = running(starter)
    with caplog.at_level(logging.WARNING, logger="snapcoord.spark_connector.backlog.runner"):
        assert runner.poll()  # caught up: switches to steady
    assert runner.phase == "steady"
    assert [q.trigger for q in starter.started] == [CATCH_UP, STEADY]
    assert starter.started[1].isActive
    assert [(s.from_phase, s.to_phase) for s in runner.switches] == [("catch_up", "steady")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "batch 4 doesn't exist" in warnings[0], warnings


def test_a_switch_without_a_failure_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    starter = Starter([None])
    runner = running(starter)
    with caplog.at_level(logging.WARNING, logger="snapcoord.spark_connector.backlog.runner"):
        assert runner.poll()
    assert runner.phase == "steady"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_failure_of_a_query_the_runner_did_not_stop_is_raised() -> None:
    starter = Starter([])
    runner = running(starter)
    error = StreamingQueryException(message="java.io.IOException: disk full")
    starter.started[0].failure, starter.started[0].isActive = error, False
    with pytest.raises(StreamingQueryException) as raised:
        runner.poll()
    assert raised.value is error
    assert len(starter.started) == 1  # not started again


def test_a_failure_that_persists_fails_the_restarted_run() -> None:
    """The restarted run fails on its own (the stop did not cause it): the next poll raises it."""
    starter = Starter([StreamingQueryException(message=CUT_LISTING)])
    runner = running(starter)
    assert runner.poll()
    error = StreamingQueryException(message="batch 4 doesn't exist")
    restarted = starter.started[1]
    restarted.failure, restarted.isActive = error, False
    with pytest.raises(StreamingQueryException) as raised:
        runner.poll()
    assert raised.value is error
