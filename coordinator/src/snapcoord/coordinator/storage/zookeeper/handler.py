"""kazoo's threading handler with a cheaper ``select`` for its connection thread.

kazoo's connection thread waits in ``handler.select`` once per request and reply. The stock
handler builds a new ``selectors.DefaultSelector`` each time (on Linux an epoll instance: a
create, two registrations and a close, plus the dictionaries around them), which profiles as a
large share of the coordinator's CPU per ZooKeeper call. ``poll`` answers the same question for
the two or three sockets involved without any kernel object to make and close, and has no limit
on descriptor numbers (the reason kazoo moved away from ``select.select``).
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

_READ = select.POLLIN | select.POLLPRI
_WRITE = select.POLLOUT
_FAILED = select.POLLERR | select.POLLHUP | select.POLLNVAL


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """``SequentialThreadingHandler`` whose ``select`` is one ``poll`` call."""

    def select(
        self, rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any], timeout: float | None = None
    ) -> tuple[list[Any], list[Any], list[Any]]:
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be non-negative")
        wanted: dict[int, int] = {}
        for obj in rlist:
            wanted[_fd(obj)] = wanted.get(_fd(obj), 0) | _READ
        for obj in wlist:
            wanted[_fd(obj)] = wanted.get(_fd(obj), 0) | _WRITE
        poller = select.poll()
        for fd, mask in wanted.items():
            poller.register(fd, mask)
        ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
        # As kazoo's selector_select: an error or hang-up counts as ready, so that the caller's
        # read or write meets it; a descriptor ready both ways is reported readable only.
        readable = [o for o in rlist if ready.get(_fd(o), 0) & (_READ | _FAILED)]
        seen = {_fd(o) for o in readable}
        writable = [o for o in wlist if _fd(o) not in seen and ready.get(_fd(o), 0) & (_WRITE | _FAILED)]
        return readable, writable, []
