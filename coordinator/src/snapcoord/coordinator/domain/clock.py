"""Time as an injected dependency, so TTL, lease and janitor behaviour is tested without sleeping.

The coordinator computes every expiry from its own clock (``expires_at_ms = now + ttl``); clients
never supply absolute times.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


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
