"""The janitor: one replica at a time expires TTL records and sweeps orphan payloads.

Leadership comes from the metadata store's election (ZooKeeper's recipe, or always-leader on the
embedded store). The janitor acts only while ``Leadership.may_act()``: on a suspended ZooKeeper
connection it pauses at the next step, and on a lost session it steps down and contends again,
since another replica may lead by then. Every step is bounded (``batch`` deletions) and safe to
run twice or concurrently (deletions are version-checked), so a pass cut short costs nothing.

With tracing on (``trace_with``), each pass is one span, with a child span per step it ran (and
under those, the store wrappers' ZooKeeper and S3 spans): a slow or failing pass shows where its
time went, like an RPC does. This module knows only the small ``SpanFactory`` protocol, so it runs
without OpenTelemetry installed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from snapcoord.coordinator.errors import CorruptRecord, SnapcoordError, Unavailable
from snapcoord.coordinator.kernel.corruption import skipped
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.storage.election import Election, Leadership

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """One bounded unit of cleanup; ``run`` returns how many things it removed.

    ``every_ms`` makes a costly step (a listing) run at most that often, on the passes that fall
    due; None runs it on every pass.
    """

    name: str
    run: Callable[[], int]
    every_ms: int | None = None


class SpanNotes(Protocol):
    """What the janitor writes on an open span."""

    def set(self, key: str, value: str | int) -> None: ...

    def failed(self, error: BaseException) -> None:
        """Mark the span failed with ``error`` (recorded, not raised)."""


class SpanFactory(Protocol):
    """Opens a span named ``name``, current in this thread until the ``with`` block ends."""

    def __call__(self, name: str, attributes: Mapping[str, str]) -> AbstractContextManager[SpanNotes]: ...


class _NoSpan:
    def set(self, key: str, value: str | int) -> None:
        pass

    def failed(self, error: BaseException) -> None:
        pass


@contextlib.contextmanager
def no_spans(name: str, attributes: Mapping[str, str]) -> Iterator[SpanNotes]:
    """The default: tracing off."""
    yield _NoSpan()


#: Span attribute names (OpenTelemetry style, in the coordinator's namespace).
STEP_ATTRIBUTE = "snapcoord.janitor.step"
OUTCOME_ATTRIBUTE = "snapcoord.janitor.outcome"
REMOVED_ATTRIBUTE = "snapcoord.janitor.removed"
PASS_SPAN = "janitor.pass"


class Janitor:
    """Runs its steps every ``interval_ms`` on the elected replica; ``run_once`` runs them now."""

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        election: Callable[[], Election],
        interval_ms: int,
        metrics: CoordinatorMetrics,
    ) -> None:
        self._steps = tuple(steps)
        self._new_election = election  # made at start(): building a server does no I/O
        self._election: Election | None = None
        self._interval_s = interval_ms / 1000
        self._metrics = metrics
        self._thread: threading.Thread | None = None
        self._last_run: dict[str, float] = {}  # step name -> time.monotonic() of its last start
        self._spans: SpanFactory = no_spans

    def trace_with(self, spans: SpanFactory) -> None:
        """Open a span per pass and per step with ``spans`` (before ``start``)."""
        self._spans = spans

    def run_once(self, may_act: Callable[[], bool] = lambda: True) -> dict[str, int]:
        """One pass over every step, stopping early when ``may_act()`` turns False.

        Returns what each step removed; a step that failed (e.g. a backend outage) is logged and
        counted, and the pass goes on with the next step.
        """
        done: dict[str, int] = {}
        with self._spans(PASS_SPAN, {}) as pass_span:
            outcome = "ok"
            for step in self._steps:
                if not self._due(step):
                    continue
                if not may_act():
                    self._metrics.janitor_passes.labels(step.name, "interrupted").inc()
                    _log.info("janitor: stopping before %s: no longer allowed to act", step.name)
                    outcome = "interrupted"
                    break
                with self._spans(f"janitor.{step.name}", {STEP_ATTRIBUTE: step.name}) as span:
                    removed = self._run_step(step, span)
                if removed is None:
                    outcome = "partial"
                else:
                    done[step.name] = removed
            pass_span.set(OUTCOME_ATTRIBUTE, outcome)
            pass_span.set(REMOVED_ATTRIBUTE, sum(done.values()))
        return done

    def _run_step(self, step: Step, span: SpanNotes) -> int | None:
        """Run one step; what it removed, or None when it failed (logged, counted, on the span)."""
        started = time.perf_counter()
        self._last_run[step.name] = time.monotonic()
        try:
            removed = step.run()
        except Unavailable as e:  # the store unreachable, or this replica's clock refused for skew
            self._metrics.janitor_passes.labels(step.name, "interrupted").inc()
            _log.warning("janitor: %s interrupted: %s", step.name, e)
            span.set(OUTCOME_ATTRIBUTE, "interrupted")
            span.failed(e)
            return None
        except CorruptRecord as e:
            # A record the step could not go past (the steps skip the records they can): the
            # record is at fault, not the code, so a WARNING naming it, no traceback.
            self._metrics.janitor_passes.labels(step.name, "error").inc()
            skipped(self._metrics, e, f"janitor: {step.name}")
            span.set(OUTCOME_ATTRIBUTE, "error")
            span.failed(e)
            return None
        except SnapcoordError as e:
            self._metrics.janitor_passes.labels(step.name, "error").inc()
            _log.exception("janitor: %s failed", step.name)
            span.set(OUTCOME_ATTRIBUTE, "error")
            span.failed(e)
            return None
        finally:
            self._metrics.janitor_pass_seconds.labels(step.name).observe(time.perf_counter() - started)
        self._metrics.janitor_passes.labels(step.name, "ok").inc()
        self._metrics.janitor_last_success.labels(step.name).set_to_current_time()
        span.set(OUTCOME_ATTRIBUTE, "ok")
        span.set(REMOVED_ATTRIBUTE, removed)
        if removed:
            _log.info("janitor: %s removed %d", step.name, removed)
        return removed

    def _due(self, step: Step) -> bool:
        last = self._last_run.get(step.name)
        return step.every_ms is None or last is None or time.monotonic() - last >= step.every_ms / 1000

    def start(self) -> None:
        """Contend for leadership in a background thread and run passes while leading."""
        if self._thread is not None:
            raise RuntimeError("the janitor is already running")
        self._election = self._new_election()
        self._thread = threading.Thread(
            target=self._election.run, args=(self._lead,), name="snapcoord-janitor", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Step down and wait for the current step to finish (each step is bounded)."""
        if self._election is not None:
            self._election.cancel()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                _log.warning("janitor: still finishing a step after %.0fs; not waiting longer", timeout_s)

    def _lead(self, leadership: Leadership) -> None:
        _log.info("janitor: this replica leads; a pass every %.0fs", self._interval_s)
        try:
            while not leadership.is_lost():
                if leadership.may_act():
                    self._metrics.janitor_leader.set(1)
                    self.run_once(leadership.may_act)
                else:
                    self._metrics.janitor_leader.set(0)
                if leadership.wait(self._interval_s):
                    break
        finally:
            self._metrics.janitor_leader.set(0)
            _log.info("janitor: stepped down")
