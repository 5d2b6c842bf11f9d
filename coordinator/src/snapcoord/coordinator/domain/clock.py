"""Time as an injected dependency, so TTL, lease and janitor behaviour is tested without sleeping.

The coordinator computes every expiry from its own clock (``expires_at_ms = now + ttl``); clients
never supply absolute times.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

from snapcoord.coordinator.errors import Unavailable


class Clock(Protocol):
    """Wall-clock milliseconds since the Unix epoch."""

    def now_ms(self) -> int: ...


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for tests."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now_ms

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a clock never goes back")
        with self._lock:
            self._now_ms += ms


# --- the skew check ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockReading:
    """One comparison of the local clock with the metadata store's: ``offset_ms`` is how far the
    local clock runs behind the store's (negative: ahead), known to within ``uncertainty_ms``."""

    offset_ms: float
    uncertainty_ms: float


def clock_usable(reading: ClockReading, max_clock_skew_ms: int) -> bool:
    """True while the local clock may be trusted for expiries.

    Every replica refuses once its clock is surely (beyond the reading's uncertainty) more than half
    of ``--max-clock-skew`` from the store's, so two replicas that both still serve are within the
    margin of each other. A reading too coarse to tell keeps the replica serving.
    """
    return abs(reading.offset_ms) - reading.uncertainty_ms <= max_clock_skew_ms / 2


def skew_refusal(reading: ClockReading, max_clock_skew_ms: int) -> str:
    """The reason a replica gives while ``clock_usable`` is False: what, by how much, and the fix."""
    direction = "behind" if reading.offset_ms > 0 else "ahead of"
    return (
        f"clock skew: this replica's clock runs {abs(reading.offset_ms) / 1000:.3f}s "
        f"(+-{reading.uncertainty_ms / 1000:.3f}s) {direction} ZooKeeper's, more than half of "
        f"--max-clock-skew ({max_clock_skew_ms / 1000:g}s); it refuses calls that compute expiries "
        "until its clock is back: synchronise this host's clock (NTP/chrony)"
    )


class ClockGuard:
    """The latest verdict on the local clock, shared by the checker (which records readings) and
    every call that computes an expiry (which ``check``s). Thread-safe; starts trusting the clock."""

    def __init__(self, max_clock_skew_ms: int) -> None:
        self.max_clock_skew_ms = max_clock_skew_ms
        self._refusal: str | None = None
        self._lock = threading.Lock()

    def record(self, reading: ClockReading) -> tuple[bool, bool]:
        """Take a reading; returns (usable now, usable before)."""
        usable = clock_usable(reading, self.max_clock_skew_ms)
        with self._lock:
            before = self._refusal is None
            self._refusal = None if usable else skew_refusal(reading, self.max_clock_skew_ms)
        return usable, before

    def refusal(self) -> str | None:
        """Why the clock is not trusted now, or None while it is."""
        with self._lock:
            return self._refusal

    def check(self) -> None:
        """Raise ``Unavailable`` naming the skew while the clock is not trusted."""
        refusal = self.refusal()
        if refusal is not None:
            raise Unavailable(refusal, metadata={"cause": "clock_skew"})


class GuardedClock:
    """A clock that refuses to tell the time while its guard does not trust it: every expiry the
    coordinator computes or compares goes through ``now_ms``, so a replica with a skewed clock
    refuses those calls (and its janitor's steps) with UNAVAILABLE instead of acting on it."""

    def __init__(self, clock: Clock, guard: ClockGuard) -> None:
        self._clock = clock
        self._guard = guard

    def now_ms(self) -> int:
        self._guard.check()
        return self._clock.now_ms()
