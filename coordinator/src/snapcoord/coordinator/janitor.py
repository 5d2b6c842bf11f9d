"""The janitor: one replica at a time expires TTL records and sweeps orphan payloads.

Leadership comes from the metadata store's election (ZooKeeper's recipe, or always-leader on the
embedded store). The janitor acts only while ``Leadership.may_act()``: on a suspended ZooKeeper
connection it pauses at the next step, and on a lost session it steps down and contends again,
since another replica may lead by then. Every step is bounded (``batch`` deletions) and safe to
run twice or concurrently (deletions are version-checked), so a pass cut short costs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from snapcoord.coordinator.errors import SnapcoordError, StoreUnavailable
from snapcoord.coordinator.metrics import CoordinatorMetrics
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

    def run_once(self, may_act: Callable[[], bool] = lambda: True) -> dict[str, int]:
        """One pass over every step, stopping early when ``may_act()`` turns False.

        Returns what each step removed; a step that failed (e.g. a backend outage) is logged and
        counted, and the pass goes on with the next step.
        """
        done: dict[str, int] = {}
        for step in self._steps:
            if not self._due(step):
                continue
            if not may_act():
                self._metrics.janitor_passes.labels(step.name, "interrupted").inc()
                _log.info("janitor: stopping before %s: no longer allowed to act", step.name)
                break
            started = time.perf_counter()
            self._last_run[step.name] = time.monotonic()
            try:
                done[step.name] = step.run()
            except StoreUnavailable as e:
                self._metrics.janitor_passes.labels(step.name, "interrupted").inc()
                _log.warning("janitor: %s interrupted: %s", step.name, e)
                continue
            except SnapcoordError:
                self._metrics.janitor_passes.labels(step.name, "error").inc()
                _log.exception("janitor: %s failed", step.name)
                continue
            finally:
                self._metrics.janitor_pass_seconds.labels(step.name).observe(time.perf_counter() - started)
            self._metrics.janitor_passes.labels(step.name, "ok").inc()
            if done[step.name]:
                _log.info("janitor: %s removed %d", step.name, done[step.name])
        return done

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
