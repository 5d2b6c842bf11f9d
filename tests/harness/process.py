"""Child-process plumbing shared by the server wrappers: start, stop, logs, and never leaving orphans.

Servers run in their own session (``start_new_session=True``) so a Ctrl-C aimed at pytest does not hit
java or weed in the middle of a test; in exchange the harness must stop them itself. Three layers do that:
fixture finalizers (normal path), an ``atexit`` hook plus a SIGTERM handler (pytest dies "politely"), and a
tiny watchdog process per server that kills the server's process group when the pytest process vanishes
without running any Python code (SIGKILL, ``os._exit``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self, TypeVar

T = TypeVar("T")


class HarnessError(RuntimeError):
    """A test server could not be provided (missing install, failed start); the message says what to do."""


class ServerStartError(HarnessError):
    """A server process exited or never became ready. The message carries the log path and its tail."""


class PortInUseError(ServerStartError):
    """A port the server needs was taken by another process; a first start retries on fresh ports."""


def log_tail(path: Path, lines: int = 40) -> str:
    """Last ``lines`` lines of a log file, for error messages (empty string if there is no log)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that (TimeoutError on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


# The watchdog blocks on its stdin. A byte means "the server was stopped normally: exit quietly"; EOF
# without a byte means the harness process is gone, so it kills the server's whole process group and
# removes the unix sockets the server would have removed itself (those created before the kill only, so
# never a newer server's). Sending the byte before closing avoids a killpg on a recycled pgid.
_WATCHDOG_CODE = (
    "import os, signal, stat, sys, time\n"
    "if not sys.stdin.buffer.read(1):\n"
    "    killed_at = time.time()\n"
    "    try:\n"
    "        os.killpg(int(sys.argv[1]), signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
    "    for path in sys.argv[2:]:\n"
    "        try:\n"
    "            st = os.lstat(path)\n"
    "            if stat.S_ISSOCK(st.st_mode) and st.st_ctime <= killed_at:\n"
    "                os.unlink(path)\n"
    "        except OSError:\n"
    "            pass\n"
)


class ManagedProcess:
    """One server process (its own session and process group), logging to a file, with a watchdog.

    Not thread-safe for concurrent stop/kill of the same instance; the fixtures never do that.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        name: str,
        cleanup_paths: Sequence[Path] = (),
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.name = name
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append: a restarted server keeps the history of earlier runs in the same file.
        with log_path.open("ab") as log:
            self.log_offset = log.tell()  # where this run's output starts in a log shared with earlier runs
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"\n=== harness: starting {name} at {stamp}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._watchdog: subprocess.Popen[bytes] | None = None
        try:
            self._watchdog = subprocess.Popen(
                # -I -S: no site packages to import, so it costs ~10 ms and a few MB.
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _WATCHDOG_CODE,
                    str(self.popen.pid),
                    *map(str, cleanup_paths),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            # Without a watchdog we still have finalizers and atexit; not worth failing a start for.
            self._watchdog = None
        _register(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        """What this run (not earlier runs of the same server) has written to the log so far."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self.log_offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def check_running(self, start_error: Callable[[str], ServerStartError]) -> None:
        """Raise ``start_error(what)`` if the process exited while starting: a ``PortInUseError`` when its
        output says a port was taken (a first start then retries on fresh ports)."""
        if self.alive():
            return
        error = start_error(f"exited with code {self.returncode} during start")
        if "Address already in use" in self.output():
            raise PortInUseError(str(error))
        raise error

    def _signal_group(self, sig: int) -> None:
        # The server leads its own process group (start_new_session), so killpg also reaches any children.
        # Only signal while we have not reaped it: after wait() the pid may belong to someone else.
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM, wait up to ``timeout`` for exit, then SIGKILL. Returns the exit code."""
        self._signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
        return self._reap()

    def kill(self) -> int:
        """SIGKILL the process group and reap it (a crash, as far as the server can tell)."""
        self._signal_group(signal.SIGKILL)
        return self._reap()

    def _reap(self) -> int:
        if self.popen.returncode is None:
            # Wait for the exit but leave the zombie (WNOWAIT): until it is reaped its pid, and so its
            # process group id, cannot be recycled, which makes this killpg of stragglers safe (none are
            # expected: java and weed do not fork helpers).
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOWAIT)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        code = self.popen.wait()
        self._release_watchdog()
        _unregister(self)
        return code

    def _release_watchdog(self) -> None:
        wd, self._watchdog = self._watchdog, None
        if wd is None or wd.stdin is None:
            return
        with contextlib.suppress(OSError):
            wd.stdin.write(b"x")
            wd.stdin.close()
        try:
            wd.wait(timeout=5)
        except subprocess.TimeoutExpired:
            wd.kill()
            wd.wait()

    def emergency_kill(self) -> None:
        """Used from atexit/signal handlers: SIGKILL without waiting on anything that could block."""
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.popen.wait(timeout=5)
        with contextlib.suppress(Exception):
            self._release_watchdog()


_live_lock = threading.Lock()
_live: set[ManagedProcess] = set()


class ServerProcess:
    """What every server wrapper of the harness shares: its one ``ManagedProcess``, whether it runs, a
    start error that carries the tail of its log, stops that keep its files for the next ``start()``,
    and use as a context manager (started on entry, stopped on exit).

    A subclass sets ``log_path`` and ``stop_timeout_s``, and gives ``start()`` and ``_describe()``.
    """

    log_path: Path
    #: How long a graceful stop waits for the process before SIGKILL.
    stop_timeout_s: float = 15.0
    _proc: ManagedProcess | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Self:
        raise NotImplementedError

    def _describe(self) -> str:
        """What the server is and where, for messages: ``ZooKeeper on 127.0.0.1:2181``."""
        raise NotImplementedError

    def _start_error(self, what: str) -> ServerStartError:
        return ServerStartError(
            f"{self._describe()} {what}.\nlog: {self.log_path}\n--- last lines ---\n{log_tail(self.log_path)}"
        )

    def _reap_dead(self) -> None:
        """Before a start: reap a process that died by itself, and release its watchdog."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None

    def stop(self, timeout: float | None = None) -> None:
        """Graceful stop (SIGTERM; SIGKILL after ``timeout``, default ``stop_timeout_s``); the server's
        files and ports are kept for ``start()``."""
        if self._proc is not None:
            self._proc.terminate(self.stop_timeout_s if timeout is None else timeout)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL: a crash. What the server made durable stays for the next ``start()``."""
        if self._proc is not None:
            self._proc.kill()
            self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.stop()
            return
        with contextlib.suppress(Exception):  # the error that ended the block is the one to see
            self.stop()


def _register(proc: ManagedProcess) -> None:
    with _live_lock:
        _live.add(proc)


def _unregister(proc: ManagedProcess) -> None:
    with _live_lock:
        _live.discard(proc)


def kill_all_live() -> None:
    """SIGKILL every server process still running (atexit safety net; finalizers normally did it already)."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        proc.emergency_kill()
        _unregister(proc)


atexit.register(kill_all_live)

_sigterm_installed = False


def install_sigterm_cleanup() -> None:
    """Make SIGTERM to the test process stop the servers first (Python's default SIGTERM skips atexit).

    Chains to a previously installed handler; with the default disposition it re-raises SIGTERM so the exit
    status still says "killed by SIGTERM". Call from the main thread (pytest_configure does).
    """
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: FrameType | None) -> None:
        kill_all_live()
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)
    _sigterm_installed = True
