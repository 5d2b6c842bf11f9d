"""A process whose wall clock is off by an offset the test changes while it runs (libfaketime).

``SkewedClock(path)`` owns a libfaketime timestamp file; ``skewed_env(clock)`` is the environment
that makes a child process read it. With ``FAKETIME_NO_CACHE=1`` libfaketime rereads the file on
every clock call, so ``clock.set(offset_s)`` moves the child's wall clock (``time.time``, the
clocks ZooKeeper's client and the coordinator compute expiries from) at once.

The monotonic clock stays real (``FAKETIME_DONT_FAKE_MONOTONIC=1``): gRPC deadlines, kazoo's
session pings and every timeout run on it, and a monotonic clock that jumped with each change of
offset would fire them early or never. Verified under Python 3.11 with Debian's libfaketime 0.9.10:
``time.time`` follows the file at once, ``time.monotonic`` and every wait on a lock, condition,
queue or ``select`` stay real. One thing breaks: ``time.sleep`` fails with EINVAL (libfaketime
rewrites ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` even when monotonic time is excluded),
so the skewed process also gets ``SLEEP_FIX_DIR`` on its ``PYTHONPATH``, whose ``sitecustomize``
sleeps by waiting on ``select`` instead (same semantics; nothing else is changed).
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.process import HarnessError

#: Where Debian's ``libfaketime`` package puts the library (``apt-get install faketime``).
LIBFAKETIME_DIRS = (Path("/usr/lib/x86_64-linux-gnu/faketime"), Path("/usr/lib/aarch64-linux-gnu/faketime"))
LIBRARY_NAME = "libfaketime.so.1"

_SITECUSTOMIZE = '''"""time.sleep without clock_nanosleep (libfaketime, real monotonic time)."""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
'''


def libfaketime() -> Path:
    """The library's path, or a HarnessError naming the install step."""
    for directory in LIBFAKETIME_DIRS:
        if (directory / LIBRARY_NAME).is_file():
            return directory / LIBRARY_NAME
    raise HarnessError(
        f"libfaketime not found ({LIBRARY_NAME} under {', '.join(map(str, LIBFAKETIME_DIRS))}): "
        "run scripts/install-test-deps (it installs Debian's faketime package)"
    )


class SkewedClock:
    """The offset, in seconds, of every process started with ``skewed_env(self)``; 0 at first."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.offset_s = 0.0
        self.set(0.0)

    def set(self, offset_s: float) -> None:
        """Move the wall clock of the skewed processes to real time plus ``offset_s`` (may be < 0)."""
        # Written to a temporary file and renamed: a reader never sees a half-written offset.
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        os.replace(tmp, self.path)
        self.offset_s = offset_s

    @property
    def sleep_fix_dir(self) -> Path:
        directory = self.path.parent / "faketime-site"
        directory.mkdir(exist_ok=True)
        (directory / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        return directory


def skewed_env(clock: SkewedClock) -> dict[str, str]:
    """Environment variables that put a child process's wall clock under ``clock``."""
    python_path = os.environ.get("PYTHONPATH")
    fix = str(clock.sleep_fix_dir)
    return {
        "LD_PRELOAD": str(libfaketime()),
        "FAKETIME_TIMESTAMP_FILE": str(clock.path),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": f"{fix}{os.pathsep}{python_path}" if python_path else fix,
    }
