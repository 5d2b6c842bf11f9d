"""A server-wide budget of checkpoint payload bytes in flight: admission of payloads into memory.

Every call that holds payloads in memory (a report's checkpoints while they are uploaded, the
payloads a GetSnapshot reads) takes their size from one budget first and gives it back when it is
done. A call that does not fit waits, at most ``wait_s``, for others to finish, then gets
RESOURCE_EXHAUSTED (reason OVERLOADED) instead of growing the process without bound. One call
larger than the whole budget is refused at once: no amount of waiting would admit it.

What it bounds: the payload bytes the handlers hold across concurrent calls, and the request
messages gRPC receives for them: ``server.admission`` holds a message's worth (at the receive
limit, ``memory_bounds``) before gRPC reads it and shrinks the hold to the message's size once
it has it (``Held.shrink``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from snapcoord.coordinator.errors import Reason, ResourceExhausted

MiB = 1024 * 1024
#: Room in a request message beside its inline payload: identifiers, offsets, task sets, backlog
#: partitions at their configured limits (the largest, 10,000 partitions with 200-character stream
#: names, is about 2.2 MB).
MESSAGE_ENVELOPE_BYTES = 4 * MiB
#: Copies of a received message that may be in memory at once: gRPC's buffer while it hands the
#: bytes to Python, the bytes, and the parsed message's own copy of its payload fields.
MESSAGE_COPIES = 3


def receive_limit(max_inline_payload: int) -> int:
    """gRPC's limit on one request message: the inline payload cap and the envelope. A larger
    message is refused by gRPC (RESOURCE_EXHAUSTED) before it is buffered."""
    return max_inline_payload + MESSAGE_ENVELOPE_BYTES


def message_hold(max_inline_payload: int) -> int:
    """What a call holds from the budget while gRPC receives one of its request messages."""
    return MESSAGE_COPIES * receive_limit(max_inline_payload)


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
        #: Calls waiting for room: a give-back wakes them only when there are any, and
        #: ``try_take`` does not pass them.
        self._waiting = 0
        self._on_change = on_change
        self._cond = threading.Condition()

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._used

    @contextlib.contextmanager
    def hold(self, nbytes: int, what: str) -> Iterator[Held]:
        """Hold ``nbytes`` of the budget for the block (waiting up to ``wait_s`` for room); the
        ``Held`` it yields may give part of it back early."""
        held = self.take(nbytes, what)
        try:
            yield held
        finally:
            held.release()

    def take(self, nbytes: int, what: str) -> Held:
        """``nbytes`` of the budget, waiting up to ``wait_s`` for room (ResourceExhausted when none
        comes, or at once when ``nbytes`` exceeds the whole budget); the caller must ``release``."""
        if nbytes <= 0:
            return Held(self, 0)
        if nbytes > self.max_bytes:
            raise self._refusal(nbytes, what, f"more than the whole budget of {self.max_bytes} bytes")
        with self._cond:
            if self._used + nbytes > self.max_bytes:
                self._wait_for_room(nbytes, what)
            self._used += nbytes
            self._on_change(self._used)
        return Held(self, nbytes)

    def try_take(self, nbytes: int) -> Held | None:
        """``nbytes`` of the budget if they fit now and no call waits for room (so that none is
        passed); None otherwise. Never waits."""
        with self._cond:
            if self._waiting or self._used + nbytes > self.max_bytes:
                return None
            self._used += nbytes
            self._on_change(self._used)
        return Held(self, nbytes)

    def _wait_for_room(self, nbytes: int, what: str) -> None:
        """Under the lock: wait until ``nbytes`` fit, at most ``wait_s``."""
        deadline = time.monotonic() + self._wait_s
        self._waiting += 1
        try:
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
        finally:
            self._waiting -= 1

    def _give_back(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._cond:
            self._used -= nbytes
            self._on_change(self._used)
            if self._waiting:
                self._cond.notify_all()

    def _refusal(self, nbytes: int, what: str, why: str) -> ResourceExhausted:
        return ResourceExhausted(
            f"{what} needs {nbytes} payload bytes in memory: {why} (--payload-budget)",
            reason=Reason.OVERLOADED,
            metadata={"limit": self.max_bytes, "requested": nbytes},
        )


class Held:
    """The bytes one ``PayloadBudget.take`` (or ``hold`` block) holds now."""

    def __init__(self, budget: PayloadBudget, nbytes: int) -> None:
        self._budget = budget
        self.nbytes = nbytes

    def shrink(self, nbytes: int) -> None:
        """Hold only ``nbytes`` from now on (no-op when that is not less): the rest goes back to
        the budget at once, for calls that wait."""
        given = self.nbytes - max(nbytes, 0)
        if given > 0:
            self.nbytes -= given
            self._budget._give_back(given)

    def release(self) -> None:
        """Give back everything still held (once; later calls do nothing)."""
        self.shrink(0)
