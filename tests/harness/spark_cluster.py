"""A Spark standalone cluster whose executors run in a network namespace of their own.

A master and two workers, each started from the pyspark package's ``bin/spark-class`` (the wheel
has no ``sbin/start-master.sh``), all inside one namespace the cluster makes (``harness.netns``).
The workers fork the executor JVMs there too. The driver stays in the root namespace, where the
coordinator runs, so the design's promise that only the driver talks to the coordinator is tested:

- inside the namespace, ``127.0.0.1:P`` is forwarded to the root namespace's ``127.0.0.1:P`` for the
  driver's two ports (its RPC and block manager: ``driver_conf``) and for every port in
  ``reachable`` (the S3 server), and for nothing else: a connect to the coordinator's port there is
  refused (``probe``);
- in the root namespace, the master's RPC and web UI ports are forwarded into the namespace, so
  the driver reaches ``spark://127.0.0.1:<port>`` and the harness reads ``/json``.

Both sides use the same loopback address and port numbers, so every address Spark advertises (the
driver's ``127.0.0.1:<port>``, the master's URL) means the same service on both sides. Executors
never need a connection from the driver: they run their RPC in client mode, and task results stay
small (under ``spark.task.maxDirectResultSize``), so they come back over the executor's own
connection rather than from its block manager.

``start`` returns once both workers are ALIVE in the master's ``/json``; ``stop`` stops the workers
(which stop their executors), the master and the forwarders, then deletes the namespace, which
kills anything left inside it. A missing piece (``ip``, Java, pyspark) fails ``start``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyspark

from harness.netns import Network
from harness.ports import free_port
from harness.process import ManagedProcess, ServerStartError, log_tail, wait_until

SPARK_HOME = Path(pyspark.__file__).resolve().parent
LOOPBACK = "127.0.0.1"
FORWARDER = Path(__file__).with_name("netns_forward.py")
START_TIMEOUT_S = 180.0  # JVM starts on a loaded 2-core machine


class SparkCluster:
    """Master + ``workers`` workers of ``cores`` cores each in a namespace; see the module docstring.

    ``reachable``: root-namespace loopback ports the executors may use (besides the driver's)."""

    def __init__(
        self,
        root: Path,
        *,
        reachable: Sequence[int] = (),
        workers: int = 2,
        cores: int = 1,
        worker_memory: str = "1g",
    ) -> None:
        self.root = root
        self.reachable = tuple(reachable)
        self.workers = workers
        self.cores = cores
        self.worker_memory = worker_memory
        self.network = Network(["sparkexec"], [])
        self.master_port = 0
        self.webui_port = 0
        self.driver_port = 0
        self.block_manager_port = 0
        self._procs: list[ManagedProcess] = []

    # -- addresses ----------------------------------------------------------------------------------
    @property
    def node(self) -> Any:
        return self.network["sparkexec"]

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    def driver_conf(self) -> dict[str, str]:
        """The settings a driver (in the root namespace) needs to run its executors on this cluster.

        The driver's ports are fixed (forwarded into the namespace), so one driver runs at a time;
        ``spark.port.maxRetries=0`` makes a taken port fail the start instead of moving elsewhere."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.driver.port": str(self.driver_port),
            "spark.driver.blockManager.port": str(self.block_manager_port),
            "spark.port.maxRetries": "0",
            "spark.cores.max": str(self.workers * self.cores),
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": "512m",
        }

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> SparkCluster:
        if not (SPARK_HOME / "bin" / "spark-class").exists():
            raise ServerStartError(f"{SPARK_HOME} has no bin/spark-class: is pyspark installed whole?")
        self.root.mkdir(parents=True, exist_ok=True)
        self.master_port, self.webui_port = free_port(), free_port()
        self.driver_port, self.block_manager_port = free_port(), free_port()
        self.network.create()
        try:
            inward = [f"{p}={LOOPBACK}:{p}" for p in (self.master_port, self.webui_port)]
            outward = [
                f"{p}={LOOPBACK}:{p}" for p in (self.driver_port, self.block_manager_port, *self.reachable)
            ]
            self._forwarder("inward", inward)
            self._forwarder("outward", outward, "--outward")
            self._spark(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", LOOPBACK, "--port", str(self.master_port), "--webui-port", str(self.webui_port),
            )  # fmt: skip
            wait_until(lambda: self._master_state() is not None, timeout=START_TIMEOUT_S,
                       interval=0.2, what=f"the Spark master's /json ({self._logs()})")  # fmt: skip
            for i in range(self.workers):
                work = self.root / f"worker-{i}"
                work.mkdir(exist_ok=True)
                self._spark(
                    f"worker-{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host", LOOPBACK, "--cores", str(self.cores), "--memory", self.worker_memory,
                    "--work-dir", str(work), "--webui-port", "0", self.master_url,
                )  # fmt: skip
            wait_until(lambda: len(self.alive_workers()) == self.workers, timeout=START_TIMEOUT_S,
                       interval=0.2, what=f"{self.workers} ALIVE workers ({self._logs()})")  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def _forwarder(self, name: str, specs: list[str], *flags: str) -> None:
        argv = [sys.executable, "-I", "-S", str(FORWARDER), *flags, self.node.netns_path, *specs]
        proc = ManagedProcess(argv, log_path=self.root / f"{name}.log", cwd=self.root, name=f"netns-{name}")
        self._procs.append(proc)

        def ready() -> bool:
            if not proc.alive():
                raise ServerStartError(f"the {name} namespace forwarder exited: {proc.output()}")
            return "ready" in proc.output()

        wait_until(ready, timeout=60, what=f"the {name} namespace forwarder")

    def _spark(self, name: str, main_class: str, *args: str) -> None:
        env = dict(
            os.environ,
            SPARK_HOME=str(SPARK_HOME),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_DAEMON_MEMORY="256m",
            SPARK_LOCAL_DIRS=str(self.root / f"{name}-local"),
            SPARK_LOG_DIR=str(self.root),
        )
        argv = self.node.command([str(SPARK_HOME / "bin" / "spark-class"), main_class, *args])
        proc = ManagedProcess(
            argv, log_path=self.root / f"{name}.log", cwd=self.root, env=env, name=f"spark-{name}"
        )
        self._procs.append(proc)

    def _master_state(self) -> dict[str, Any] | None:
        for proc in self._procs:
            if not proc.alive():
                raise ServerStartError(f"{proc.name} exited: {log_tail(proc.log_path)}")
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.webui_port}/json", timeout=5) as r:
                state: dict[str, Any] = json.loads(r.read())
        except (OSError, ValueError):
            return None
        return state if state.get("status") == "ALIVE" else None

    def alive_workers(self) -> list[dict[str, Any]]:
        """The master's ALIVE workers (from its ``/json``)."""
        state = self._master_state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def master_json(self) -> dict[str, Any]:
        state = self._master_state()
        if state is None:
            raise ServerStartError(f"the Spark master does not answer: {self._logs()}")
        return state

    def _logs(self) -> str:
        return ", ".join(str(p.log_path) for p in self._procs)

    def probe(self, port: int, host: str = LOOPBACK) -> str:
        """Connect to ``host:port`` from inside the namespace: ``"connected"`` or the OS error's name."""
        code = (
            "import errno, socket, sys\n"
            "s = socket.socket(); s.settimeout(10)\n"
            "try:\n"
            "    s.connect((sys.argv[1], int(sys.argv[2]))); print('connected')\n"
            "except OSError as e:\n"
            "    print(errno.errorcode.get(e.errno, type(e).__name__))\n"
        )
        argv = self.node.command([sys.executable, "-I", "-S", "-c", code, host, str(port)])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise ServerStartError(f"probe in {self.node.netns} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def stop(self) -> None:
        """Workers first (they stop their executors), then the master and the forwarders; then the
        namespace goes, with anything still inside it. Idempotent."""
        procs, self._procs = self._procs, []
        for proc in reversed(procs):
            proc.terminate(timeout=30)
        self.network.destroy()

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
