"""A real local Spark Connect server, started from the pyspark wheel, for Spark Connect tests.

The wheel ships the server (``pyspark/jars/spark-connect_*.jar``) and ``sbin/start-connect-server.sh``;
that script daemonises through ``spark-daemon.sh`` (pid files, its own log dir), so the harness runs
what it runs, ``bin/spark-submit --class SparkConnectServer``, in the foreground instead: spark-submit
execs java, so the managed process *is* the JVM and a stop or kill reaches it directly.

The server listens on a free loopback port (``spark.connect.grpc.port.maxRetries=0``: a taken port
fails the start, which retries on a fresh one, instead of the server silently moving elsewhere).
``start()`` returns once a Spark Connect session runs a query through it; the JVM's start takes
seconds to tens of seconds on a busy machine, hence the generous deadline. Its Python workers (the
``foreachBatch`` functions a Connect client sends) run this interpreter, which has snapcoord installed.
The log stays in ``workdir`` for failures.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from harness.ports import LOOPBACK, free_port, is_port_free
from harness.process import HarnessError, ManagedProcess, PortInUseError, ServerProcess, log_tail

T = TypeVar("T")

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
INSTALL_HINT = "run `bash scripts/install-test-deps` (pyspark with the `connect` extra, and a Java 17 JRE)"


def pyspark_home() -> Path:
    """The installed pyspark package directory, which is a complete SPARK_HOME (bin/, jars/, sbin/)."""
    import pyspark

    return Path(pyspark.__file__).parent


class SparkConnectServer(ServerProcess):
    """``spark-submit --class SparkConnectServer`` on ``127.0.0.1:<free port>``, ``local[cores,4]``
    (a failed task is retried, as on a cluster)."""

    stop_timeout_s = 30.0

    def __init__(
        self,
        workdir: Path,
        *,
        cores: int = 2,
        driver_memory: str = "1g",
        start_timeout_s: float = 180.0,
        conf: dict[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "spark-connect.log"
        self.cores = cores
        self.driver_memory = driver_memory
        self.start_timeout_s = start_timeout_s
        self.conf = dict(conf or {})
        self.port: int | None = None
        self.last_start_s: float | None = None
        self._proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        """The ``sc://`` URL for ``SparkSession.builder.remote``."""
        if self.port is None:
            raise RuntimeError("the Spark Connect server has not started")
        return f"sc://{LOOPBACK}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> SparkConnectServer:
        if self.running:
            raise HarnessError(f"the Spark Connect server on {self.url} is already running")
        _check_installed()
        for attempt in range(1, 4):
            self.port = free_port()
            t0 = time.monotonic()
            try:
                self._start_once()
            except PortInUseError:
                if attempt < 3:
                    continue  # another process took the port between our check and the JVM's bind
                raise
            self.last_start_s = time.monotonic() - t0
            return self
        raise AssertionError("unreachable")

    def _argv(self, port: int) -> list[str]:
        home = pyspark_home()
        conf = {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(port),
            "spark.connect.grpc.port.maxRetries": "0",
            "spark.driver.bindAddress": LOOPBACK,
            "spark.driver.host": LOOPBACK,
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.warehouse.dir": str(self.workdir / "warehouse"),
            "spark.local.dir": str(self.workdir / "local"),
            # Serial GC: one GC thread instead of one per core fighting the tests for 2 cores.
            "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:-UsePerfData",
            **self.conf,
        }
        argv = [
            str(home / "bin" / "spark-submit"),
            "--master",
            f"local[{self.cores},4]",
            "--driver-memory",
            self.driver_memory,
            "--name",
            "snapcoord-tests-connect",
            "--class",
            SERVER_CLASS,
        ]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        return argv

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        conf_dir = self.workdir / "conf"  # empty: no developer's spark-defaults.conf leaks in
        conf_dir.mkdir(parents=True, exist_ok=True)
        env.update(
            SPARK_HOME=str(pyspark_home()),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP=LOOPBACK,
            # The server's Python workers (foreachBatch, listeners) must import snapcoord.
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        return env

    def _start_once(self) -> None:
        port = self.port
        assert port is not None
        if not is_port_free(port):
            raise PortInUseError(f"Spark Connect port {port} is taken by another process")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proc = ManagedProcess(
            self._argv(port),
            log_path=self.log_path,
            cwd=self.workdir,
            env=self._env(),
            name=f"spark-connect:{port}",
        )
        try:
            self._wait_ready()
        except BaseException:
            self._proc.kill()
            self._proc = None
            raise

    def _wait_ready(self) -> None:
        """Until a Connect session runs a query: the port opens before the server takes sessions."""
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            if not self._proc.alive():
                error = self._start_error(f"exited with code {self._proc.returncode} during start")
                if "Address already in use" in self._proc.output():
                    raise PortInUseError(str(error))
                raise error
            if not is_port_free(self.port or 0):  # something listens: try a real session
                try:
                    session = self.session()
                    try:
                        if session.range(3).count() == 3:
                            return
                    finally:
                        session.stop()
                except (
                    Exception
                ) as e:  # not serving yet (UNAVAILABLE and friends); retried until the deadline
                    last_error = f"{type(e).__name__}: {str(e)[:300]}"
            time.sleep(0.2)
        raise self._start_error(f"not ready after {self.start_timeout_s:.0f}s (last probe: {last_error})")

    def session(self) -> Any:
        """A new Spark Connect client session (``pyspark.sql.connect.session.SparkSession``).

        The same object ``SparkSession.builder.remote(url).getOrCreate()`` returns, built without that
        builder's side effect on this process (it sets ``SPARK_CONNECT_MODE_ENABLED``, which would switch
        every classic PySpark test that runs later in the same process into Connect mode).
        """
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        return ConnectSession.builder.remote(self.url).create()

    def _describe(self) -> str:
        return f"Spark Connect server on {LOOPBACK}:{self.port}"

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SparkConnectServer({self.port and self.url}, {state}, workdir={self.workdir})"


#: The server waits a fixed 10 s (not configurable) for a query's foreachBatch worker to connect
#: back; on a loaded host the worker's imports (pandas, pyarrow, grpc) can take longer, and the
#: query's start fails before any batch ran. Starting it again is safe.
WORKER_START_ERROR = "Python worker to connect back"


def start_with_retries(start: Callable[[], T], attempts: int = 12) -> T:
    """``start()`` (a streaming query's ``start``), again while it fails because the server's worker
    was too slow to connect back; any other error, or the last attempt's, propagates. Under a load
    burst several starts in a row can miss the 10 s, hence many attempts, a pause between them."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as e:
            if WORKER_START_ERROR not in str(e) or attempt == attempts:
                raise
            time.sleep(min(2.0 * attempt, 10.0))
            print(
                f"query start {attempt} failed (worker too slow to connect back); retrying", file=sys.stderr
            )
    raise AssertionError("unreachable")


def _check_installed() -> None:
    """A missing server is a failed start with the install command, never a skip."""
    try:
        home = pyspark_home()
    except ImportError as e:
        raise HarnessError(f"pyspark is not installed ({e}); {INSTALL_HINT}") from None
    if not list((home / "jars").glob("spark-connect_*.jar")):
        raise HarnessError(f"no spark-connect jar in {home / 'jars'}; {INSTALL_HINT}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise HarnessError(f"java not found on PATH and JAVA_HOME is unset; {INSTALL_HINT}")
    # The Connect client's own dependencies (the `connect` extra).
    missing = [
        m for m in ("grpc_status", "pandas", "pyarrow", "zstandard") if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise HarnessError(f"the Spark Connect client lacks {', '.join(missing)}; {INSTALL_HINT}")
