"""A real ``snapcoord serve`` process for end-to-end tests, and in-process servers on port 0.

It binds port 0 for gRPC and metrics and reports both on its serving line, so tests never guess
ports. stdout (where only the serving line belongs) and stderr (the log) go to separate files;
their tails are part of every error raised here. Inherited ``SNAPCOORD_*`` variables are dropped
so that a developer's shell cannot change what a test runs against; pass ``env`` to set some.
The log is text (``SNAPCOORD_LOG_FORMAT=text``) unless ``args`` or ``env`` say otherwise.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.process import ManagedProcess, ServerStartError, log_tail, wait_until
from snapcoord.coordinator.config.settings import Config
from snapcoord.coordinator.config.settings import load as load_config
from snapcoord.coordinator.observability.logging_setup import serving_message
from snapcoord.coordinator.server.app import CoordinatorServer, build_server
from snapcoord.coordinator.services import Deps

if TYPE_CHECKING:
    from snapcoord.coordinator.observability.tracing import Tracing

SERVING_LINE_RE = re.compile(
    r"^snapcoord serving grpc=(?P<grpc>\S+) metrics=(?P<metrics>\S+)(?: health=(?P<health>\S+))?$"
)
_ANY_ADDRESS = {"0.0.0.0", "::", ""}


def split_hostport(hostport: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port)."""
    host, _, port = hostport.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def snapcoord_command() -> list[str]:
    """The installed console script next to this interpreter, else the module (same code)."""
    script = Path(sys.executable).parent / "snapcoord"
    if script.exists():
        return [str(script)]
    found = shutil.which("snapcoord")
    return [found] if found else [sys.executable, "-m", "snapcoord.coordinator.cli"]


class CoordinatorProcess:
    """``snapcoord serve --port 0 --metrics-port 0 ...`` in ``workdir``, its own session.

    ``start()`` returns once the serving line is printed and health says SERVING through a real
    channel; ``serving_after_s`` is how long that took from the spawn.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        start_timeout_s: float = 60.0,
        health_credentials: grpc.ChannelCredentials | None = None,
        command: Sequence[str] | None = None,
        command_prefix: Sequence[str] = (),
    ) -> None:
        self.workdir = Path(workdir)
        #: What runs in place of ``snapcoord`` (e.g. a coordinator with a planted bug), or None.
        self.command = list(command) if command is not None else None
        #: Runs the coordinator through another command (``ip netns exec NS``, which execs it).
        self.command_prefix = list(command_prefix)
        #: For a coordinator serving TLS: the channel credentials of ``health()``.
        self.health_credentials = health_credentials
        self.stdout_path = self.workdir / "snapcoord.stdout"
        self.stderr_path = self.workdir / "snapcoord.stderr"
        self.host = host
        self.args = list(args)
        self.extra_env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        #: The health-only port (``--health-port``), None when the coordinator serves none.
        self.health_port: int | None = None
        self.serving_line: str | None = None
        self.serving_after_s: float | None = None
        self._proc: ManagedProcess | None = None

    # -- addresses ----------------------------------------------------------------------------------
    @property
    def target(self) -> str:
        """``host:port`` for ``grpc.insecure_channel``."""
        if self.grpc_port is None:
            raise RuntimeError("the coordinator has not started")
        return f"{self._connect_host(self.host)}:{self.grpc_port}"

    @property
    def pid(self) -> int:
        """The coordinator's process id (the shell that starts it execs it: same pid)."""
        if self._proc is None:
            raise RuntimeError("the coordinator has not started")
        return self._proc.pid

    @property
    def metrics_url(self) -> str:
        if self.metrics_port is None:
            raise RuntimeError("the coordinator has not started, or runs without metrics")
        return f"http://{self._connect_host(self.host)}:{self.metrics_port}/metrics"

    @staticmethod
    def _connect_host(host: str) -> str:
        if host in _ANY_ADDRESS:
            return "127.0.0.1"
        return f"[{host}]" if ":" in host else host

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> CoordinatorProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            *(self.command or snapcoord_command()),
            "serve",
            "--host",
            self.host,
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--data-dir",
            str(self.workdir / "data"),
            *self.args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCOORD_")}
        # stderr is a file here, so the default (auto) would be JSON; the tests that read the log
        # read text. Tests of the JSON format pass --log-format json (a flag beats this).
        env["SNAPCOORD_LOG_FORMAT"] = "text"
        env.update(self.extra_env)
        env["_SNAPCOORD_HARNESS_STDERR"] = str(self.stderr_path)
        # ManagedProcess sends stdout and stderr to one file; split stderr off with a shell that
        # execs the coordinator (same pid, so signals reach it directly).
        shell = ["/bin/sh", "-c", 'exec "$@" 2>>"$_SNAPCOORD_HARNESS_STDERR"', "snapcoord"]
        started = time.monotonic()
        self._proc = ManagedProcess(
            [*self.command_prefix, *shell, *argv],
            log_path=self.stdout_path,
            cwd=self.workdir,
            env=env,
            name="snapcoord",
        )
        try:
            line = wait_until(
                self._serving_line, timeout=self.start_timeout_s, interval=0.02, what="the serving line"
            )
            self._parse_serving_line(line)
            wait_until(
                lambda: self.health() == health_pb2.HealthCheckResponse.SERVING,
                timeout=self.start_timeout_s,
                interval=0.05,
                what="health SERVING",
            )
        except (TimeoutError, ServerStartError) as e:
            self.kill()
            raise ServerStartError(f"snapcoord did not start: {e}\n{self.tails()}") from None
        self.serving_after_s = time.monotonic() - started
        return self

    def _serving_line(self) -> str | None:
        assert self._proc is not None
        for line in self.stdout_lines():
            if SERVING_LINE_RE.match(serving_message(line)):
                return line
        if not self._proc.alive():
            raise ServerStartError(f"snapcoord exited with code {self._proc.returncode}")
        return None

    def _parse_serving_line(self, line: str) -> None:
        m = SERVING_LINE_RE.match(serving_message(line))  # a JSON log prints a JSON object
        assert m is not None
        self.serving_line = line
        self.grpc_port = split_hostport(m["grpc"])[1]
        self.metrics_port = None if m["metrics"] == "disabled" else split_hostport(m["metrics"])[1]
        self.health_port = split_hostport(m["health"])[1] if m["health"] else None

    def health(self, service: str = "", timeout_s: float = 2.0) -> int | None:
        """Health/Check status through a fresh channel; None when the call itself fails."""
        if self._proc is not None and not self._proc.alive():
            raise ServerStartError(f"snapcoord exited with code {self._proc.returncode}")
        channel = (
            grpc.insecure_channel(self.target)
            if self.health_credentials is None
            else grpc.secure_channel(self.target, self.health_credentials)
        )
        with channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
                )
            except grpc.RpcError:
                return None
        return int(reply.status)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def send_signal(self, signum: int = signal.SIGTERM) -> None:
        """Signal the coordinator without waiting, to watch the drain from outside."""
        if self._proc is not None and self._proc.alive():
            os.kill(self._proc.pid, signum)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        """Wait for the process to exit by itself; returns its exit code."""
        if self._proc is None:
            raise RuntimeError("the coordinator was never started")
        try:
            self._proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"snapcoord still running after {timeout_s}s\n{self.tails()}") from None
        return self._proc.terminate()  # already exited: just reaps and releases the watchdog

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); returns the exit code."""
        if self._proc is None:
            raise RuntimeError("the coordinator was never started")
        return self._proc.terminate(timeout=timeout_s)

    def kill(self) -> int:
        """SIGKILL: a crash as far as the coordinator can tell."""
        if self._proc is None:
            raise RuntimeError("the coordinator was never started")
        return self._proc.kill()

    # -- output -------------------------------------------------------------------------------------
    def stdout_lines(self) -> list[str]:
        """What the coordinator printed to stdout (without the harness's own marker lines)."""
        try:
            text = self.stdout_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [line for line in text.splitlines() if line and not line.startswith("=== harness:")]

    def stderr_text(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tails(self, lines: int = 40) -> str:
        return (
            f"--- {self.stdout_path} (tail) ---\n{log_tail(self.stdout_path, lines)}\n"
            f"--- {self.stderr_path} (tail) ---\n{log_tail(self.stderr_path, lines)}"
        )

    def __enter__(self) -> CoordinatorProcess:
        return self.start() if self._proc is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self.terminate()  # also right after an exit: it only reaps then


# --- in-process -------------------------------------------------------------------------------------


@dataclass
class InProcessCoordinator:
    """A coordinator built with ``build_server`` in this process, started, on a free port."""

    server: CoordinatorServer
    port: int
    config: Config

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.target)


def coordinator_config(**flags: str) -> Config:
    """A config for in-process servers: loopback, port 0, metrics and janitor off unless given (tests
    run janitor passes themselves, deterministically); no environment."""
    base = {"host": "127.0.0.1", "port": "0", "metrics_port": "-1", "cleanup_interval": "0s"}
    return load_config({**base, **flags}, {})


@contextlib.contextmanager
def serve_in_process(
    deps: Deps,
    *,
    handlers: Sequence[grpc.GenericRpcHandler] = (),
    grace_s: float = 0.0,
    tracing: Tracing | None = None,
    check_clock: bool = True,
    **flags: str,
) -> Iterator[InProcessCoordinator]:
    """Build, add the test-only ``handlers``, start; on exit shut down with ``grace_s``.
    ``check_clock=False`` for a test whose manual clock is moved away from ZooKeeper's on purpose
    (the clock check would rightly refuse it)."""
    config = coordinator_config(**flags)
    server, port = build_server(config, deps, tracing=tracing, check_clock=check_clock)
    if handlers:
        server.grpc.add_generic_rpc_handlers(tuple(handlers))
    server.start()
    try:
        yield InProcessCoordinator(server, port, config)
    finally:
        server.shutdown(grace_s)


@contextlib.contextmanager
def embedded_deps(directory: Path) -> Iterator[Deps]:
    """Deps on the embedded metadata store and local blobs in ``directory``; closed on exit."""
    from snapcoord.coordinator.storage.local.blob_files import LocalBlobStore
    from snapcoord.coordinator.storage.local.embedded import EmbeddedMetadataStore

    metadata = EmbeddedMetadataStore.from_uri((directory / "metadata").as_uri())
    try:
        blobs = LocalBlobStore.from_uri((directory / "blobs").as_uri())
        try:
            yield Deps(metadata=metadata, blobs=blobs)
        finally:
            blobs.close()
    finally:
        metadata.close()


class ProbeService:
    """A test-only service (``snapcoord.test.Probe``, raw bytes in and out) registered through a
    generic handler, to drive the interceptor with exactly the behaviour a test needs."""

    SERVICE = "snapcoord.test.Probe"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            self.SERVICE,
            {
                "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
                "Raise": grpc.unary_unary_rpc_method_handler(self.raise_named),
                "Abort": grpc.unary_unary_rpc_method_handler(self.abort),
                "SetCode": grpc.unary_unary_rpc_method_handler(self.set_code),
                "Slow": grpc.unary_unary_rpc_method_handler(self.slow),
                "Count": grpc.unary_stream_rpc_method_handler(self.count),
            },
        )

    @classmethod
    def call(cls, channel: grpc.Channel, method: str, request: bytes = b"", timeout_s: float = 30.0) -> bytes:
        return bytes(channel.unary_unary(f"/{cls.SERVICE}/{method}")(request, timeout=timeout_s))

    def echo(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    def raise_named(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """Raise the exception class named by the request: ``errors.X``, or a builtin."""
        name = request.decode()
        if name.startswith("errors."):
            from snapcoord.coordinator import errors

            cls = getattr(errors, name.removeprefix("errors."))
            if cls is errors.TransactionFailed:
                raise errors.TransactionFailed(f"raised {name}", index=0, cause=errors.NodeExistsError("n"))
            if cls is errors.CorruptRecord:
                raise errors.CorruptRecord(f"raised {name}", kind="lease")
            if cls is errors.NewerFormat:
                raise errors.NewerFormat(f"raised {name}", kind="lease", version=2, supported=1)
            raise cls(f"raised {name}")
        raise getattr(builtins, name)(f"raised {name}")

    def abort(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.NOT_FOUND, "aborted by the handler")
        raise AssertionError("unreachable")

    def set_code(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details("set by the handler")
        return b""

    def slow(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """Blocks until the test sets ``release``: an in-flight call to drain."""
        self.entered.set()
        if not self.release.wait(timeout=120):
            raise TimeoutError("the test never released the slow call")
        return b"finished"

    def count(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        """Streams ``n`` messages, then raises ``errors.Aborted`` if the request ends with ``!``."""
        text = request.decode()
        for i in range(int(text.rstrip("!") or "0")):
            yield str(i).encode()
        if text.endswith("!"):
            from snapcoord.coordinator import errors

            raise errors.Aborted("stream gave up")
