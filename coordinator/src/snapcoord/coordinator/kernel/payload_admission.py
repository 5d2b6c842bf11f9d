"""A server-wide budget of checkpoint payload bytes in flight: admission of payloads into memory.

Every call that holds payloads in memory (a report's checkpoints while they are uploaded, the
payloads a GetSnapshot reads) takes their size from one budget first and gives it back when it is
done. A call that does not fit waits, at most ``wait_s``, for others to finish, then gets
RESOURCE_EXHAUSTED (reason OVERLOADED) instead of growing the process without bound. One call
larger than the whole budget is refused at once: no amount of waiting would admit it.

What it bounds: the payload bytes the handlers hold across concurrent calls. gRPC itself has
already received a report's message when the handler runs; ``--max-concurrent-rpcs`` and the
message size limit bound that part.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from snapcoord.coordinator.errors import Reason, ResourceExhausted


class PayloadBudget:
    """Bytes in flight, shared by every call of the process."""

    def __init__(
        self, max_bytes: int, wait_s: float, on_change: Callable[[int], None] = lambda used: None
    ) -> None:
        """``on_change(used)`` is called, under the budget's lock, with the bytes in use after
        every change (a metric): keep it quick and non-blocking."""
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._wait_s = wait_s
        self._used = 0
        self._on_change = on_change
        self._cond = threading.Condition()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._used

    @contextlib.contextmanager
    def hold(self, nbytes: int, what: str) -> Iterator[None]:
        """Hold ``nbytes`` of the budget for the block (waiting up to ``wait_s`` for room)."""
        if nbytes <= 0:
            yield
            return
        if nbytes > self.max_bytes:
            raise self._refusal(nbytes, what, f"more than the whole budget of {self.max_bytes} bytes")
        deadline = time.monotonic() + self._wait_s
        with self._cond:
            while self._used + nbytes > self.max_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._refusal(
                        nbytes,
                        what,
                        f"{self._used} of {self.max_bytes} bytes are in flight after {self._wait_s:g} s; "
                        "retry after a pause",
                    )
                self._cond.wait(left)
            self._used += nbytes
            self._on_change(self._used)
        try:
            yield
        finally:
            with self._cond:
                self._used -= nbytes
                self._on_change(self._used)
                self._cond.notify_all()

    def _refusal(self, nbytes: int, what: str, why: str) -> ResourceExhausted:
        return ResourceExhausted(
            f"{what} needs {nbytes} payload bytes in memory: {why} (--payload-budget)",
            reason=Reason.OVERLOADED,
            metadata={"limit": self.max_bytes, "requested": nbytes},
        )
