"""The clock-skew check: reads the local clock's offset from the store's every second, exports it,
and tells the ``ClockGuard`` whether the clock may be trusted (logging each change of verdict)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from snapcoord.coordinator.domain.clock import ClockGuard, ClockReading
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics

_log = logging.getLogger(__name__)

#: Seconds between readings: one small ZooKeeper write per replica and interval.
CHECK_INTERVAL_S = 1.0


class ClockCheck:
    """Runs ``read`` every ``interval_s`` in a thread between ``start`` and ``stop``.

    A reading that fails (the store unreachable) changes nothing: the last verdict stands, and
    every call that needs the store fails on its own meanwhile.
    """

    def __init__(
        self,
        read: Callable[[], ClockReading],
        guard: ClockGuard,
        metrics: CoordinatorMetrics,
        *,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self._read = read
        self._guard = guard
        self._metrics = metrics
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> ClockReading | None:
        """Take one reading and apply it; None when the store could not be asked."""
        try:
            reading = self._read()
        except Exception as e:  # kazoo's connection and session errors, a closed client
            _log.debug("clock check: no reading: %s", e)
            return None
        self._metrics.clock_offset.set(reading.offset_ms / 1000)
        usable, before = self._guard.record(reading)
        if before and not usable:
            _log.error("%s", self._guard.refusal())
        elif usable and not before:
            _log.warning(
                "clock skew: this replica's clock is back within the margin (offset %.3fs +-%.3fs); "
                "serving calls that compute expiries again",
                reading.offset_ms / 1000,
                reading.uncertainty_ms / 1000,
            )
        return reading

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the clock check is already running")
        self._thread = threading.Thread(target=self._run, name="snapcoord-clock-check", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.run_once()
            self._stopped.wait(self._interval_s)
