"""A process's resident memory, sampled from /proc while something runs (memory-bound tests)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType


def rss_bytes(pid: int) -> int:
    """The process's VmRSS now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class PeakRss:
    """``with PeakRss(pid) as rss: ...``: ``rss.baseline`` at entry, ``rss.peak`` over the block
    (sampled every ``interval_s`` by a thread)."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.pid = pid
        self.baseline = self.peak = rss_bytes(pid)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    def _sample(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pid))
