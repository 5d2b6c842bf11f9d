"""A real 3-node ZooKeeper ensemble on 127.0.0.1 (one java process per node) for failure tests.

Each node has its own client, quorum and election port and its own data dir with a ``myid`` file, so
a node killed with SIGKILL comes back with ``start()`` as the same server id on the same ports and
rejoins the quorum. Leaders are found with the ``srvr`` four-letter word; a node without a quorum
answers that it "is not currently serving requests", which ``mode()`` reports as None.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from harness.ports import LOOPBACK, free_port
from harness.process import (
    HarnessError,
    ManagedProcess,
    ServerProcess,
    ServerStartError,
    log_tail,
    wait_until,
)
from harness.zookeeper import INSTALL_HINT, SLF4J_SIMPLE_JAR, ZOOKEEPER_JAR, four_letter_word

_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

#: Generous on purpose: on a loaded 2-core machine an election plus a follower sync takes seconds.
QUORUM_TIMEOUT_S = 120.0


class EnsembleNode(ServerProcess):
    """One ZooKeeper server of an ensemble: ``start()``, ``kill()`` (SIGKILL), ``stop()``, ``pause()``."""

    def __init__(self, ensemble: ZooKeeperEnsemble, myid: int) -> None:
        self.ensemble = ensemble
        self.myid = myid
        self.workdir = ensemble.workdir / f"zk{myid}"
        self.data_dir = self.workdir / "data"
        self.config_path = self.workdir / "zoo.cfg"
        self.log_path = self.workdir / "zookeeper.log"
        self.client_port = free_port()
        self.quorum_port = free_port()
        self.election_port = free_port()
        self._proc: ManagedProcess | None = None

    @property
    def hosts(self) -> str:
        return f"{self.ensemble.address(self)}:{self.client_port}"

    def start(self) -> EnsembleNode:
        """Spawn the node; it serves only once a quorum forms (see ``ZooKeeperEnsemble.wait_quorum``)."""
        if self.running:
            raise HarnessError(f"ZooKeeper node {self.myid} is already running")
        self._reap_dead()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "myid").write_text(f"{self.myid}\n")
        self.config_path.write_text(self.ensemble.config(self))
        java = shutil.which("java")
        if java is None:
            raise HarnessError(f"java not found on PATH; {INSTALL_HINT}")
        argv = [
            java,
            "-Xms32m",
            f"-Xmx{self.ensemble.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:-UsePerfData",
            "-Djava.net.preferIPv4Stack=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            "-cp",
            f"{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}",
            _MAIN_CLASS,
            str(self.config_path),
        ]
        argv = self.ensemble.command(self, argv)
        self._proc = ManagedProcess(argv, log_path=self.log_path, cwd=self.workdir, name=f"zk{self.myid}")
        return self

    def _describe(self) -> str:
        return f"ZooKeeper node {self.myid} on {self.hosts}"

    def pause(self) -> None:
        """SIGSTOP: the node hangs with its sockets open (a frozen VM, a long GC)."""
        if self._proc is not None and self._proc.alive():
            os.killpg(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None and self._proc.alive():
            os.killpg(self._proc.pid, signal.SIGCONT)

    def mode(self) -> str | None:
        """``leader``, ``follower``, or None when the node is down or has no quorum."""
        if not self.running:
            return None
        try:
            reply = four_letter_word(*self.ensemble.probe_address(self), "srvr", timeout=2.0)
        except OSError:
            return None
        for line in reply.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def mntr(self) -> dict[str, str]:
        """The ``mntr`` key/value pairs ({} when the node does not answer)."""
        try:
            reply = four_letter_word(*self.ensemble.probe_address(self), "mntr", timeout=2.0)
        except OSError:
            return {}
        pairs = (line.split("\t", 1) for line in reply.splitlines() if "\t" in line)
        return {k: v for k, v in pairs}

    def log_tail(self) -> str:
        return f"--- zk{self.myid} {self.log_path} ---\n{log_tail(self.log_path, 20)}"

    def __repr__(self) -> str:
        return f"EnsembleNode(myid={self.myid}, {self.hosts}, running={self.running})"


class ZooKeeperEnsemble:
    """``size`` ZooKeeper nodes forming one quorum on loopback.

    ``tick_time_ms`` is small so that a dead leader is noticed within ``sync_limit`` ticks and sessions
    can be short; ``init_limit`` is large so that a follower syncing on a busy machine is not dropped.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        size: int = 3,
        tick_time_ms: int = 200,
        init_limit: int = 150,
        sync_limit: int = 25,
        heap_mb: int = 128,
    ) -> None:
        if not ZOOKEEPER_JAR.exists() or not SLF4J_SIMPLE_JAR.exists():
            raise HarnessError(f"ZooKeeper is not installed; {INSTALL_HINT}")
        self.workdir = Path(workdir)
        self.tick_time_ms = tick_time_ms
        self.init_limit = init_limit
        self.sync_limit = sync_limit
        self.heap_mb = heap_mb
        self.nodes = [EnsembleNode(self, myid) for myid in range(1, size + 1)]

    @property
    def hosts(self) -> str:
        """``127.0.0.1:P1,127.0.0.1:P2,...``: a kazoo hosts string, and the host part of a zk:// URI."""
        return ",".join(n.hosts for n in self.nodes)

    def uri(self, chroot: str) -> str:
        return f"zk://{self.hosts}/{chroot.strip('/')}"

    # -- where nodes run: hooks for an ensemble whose nodes live elsewhere (network namespaces) -------
    def address(self, node: EnsembleNode) -> str:
        """The address ``node`` binds and its peers and clients reach it at."""
        return LOOPBACK

    def command(self, node: EnsembleNode, argv: list[str]) -> list[str]:
        """The command that runs ``node``'s server ``argv``."""
        return argv

    def probe_address(self, node: EnsembleNode) -> tuple[str, int]:
        """Where this process reaches ``node``'s client port (four-letter words)."""
        return LOOPBACK, node.client_port

    def config(self, node: EnsembleNode) -> str:
        servers = [f"server.{n.myid}={self.address(n)}:{n.quorum_port}:{n.election_port}" for n in self.nodes]
        return "\n".join(
            [
                f"tickTime={self.tick_time_ms}",
                f"initLimit={self.init_limit}",
                f"syncLimit={self.sync_limit}",
                f"minSessionTimeout={2 * self.tick_time_ms}",
                "maxSessionTimeout=60000",
                f"dataDir={node.data_dir}",
                f"clientPort={node.client_port}",
                f"clientPortAddress={self.address(node)}",
                "admin.enableServer=false",
                "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
                "maxClientCnxns=0",
                "forceSync=no",
                # A node restarted right after a SIGKILL rebinds its quorum/election ports.
                "electionPortBindRetry=0",
                *servers,
                "",
            ]
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = QUORUM_TIMEOUT_S) -> ZooKeeperEnsemble:
        for node in self.nodes:
            node.start()
        try:
            self.wait_quorum(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.resume()
                node.kill()

    def running(self) -> list[EnsembleNode]:
        return [n for n in self.nodes if n.running]

    def leader(self) -> EnsembleNode | None:
        leaders = [n for n in self.nodes if n.mode() == "leader"]
        return leaders[0] if len(leaders) == 1 else None

    def followers(self) -> list[EnsembleNode]:
        return [n for n in self.nodes if n.mode() == "follower"]

    def has_quorum(self, nodes: Sequence[EnsembleNode] | None = None) -> bool:
        """True when exactly one of the running nodes leads and every one of ``nodes`` (default: all
        running nodes) serves as leader or follower."""
        wanted = list(nodes) if nodes is not None else self.running()
        modes = {n.myid: n.mode() for n in self.nodes if n.running}
        if list(modes.values()).count("leader") != 1:
            return False
        return all(modes.get(n.myid) in ("leader", "follower") for n in wanted)

    def wait_quorum(self, *, timeout: float = QUORUM_TIMEOUT_S) -> EnsembleNode:
        """Wait until every running node serves and one leads; returns the leader."""
        for node in self.nodes:
            if node._proc is not None and not node._proc.alive():
                raise ServerStartError(f"ZooKeeper node {node.myid} exited\n{node.log_tail()}")
        try:
            wait_until(self.has_quorum, timeout=timeout, interval=0.2, what="a ZooKeeper quorum")
        except TimeoutError as e:
            raise ServerStartError(f"{e}\n" + "\n".join(n.log_tail() for n in self.nodes)) from None
        leader = self.leader()
        assert leader is not None
        return leader

    def wait_no_quorum(self, *, timeout: float = QUORUM_TIMEOUT_S) -> None:
        """Wait until no running node serves (after stopping a majority)."""
        wait_until(
            lambda: all(n.mode() is None for n in self.nodes),
            timeout=timeout,
            interval=0.2,
            what="every ZooKeeper node to lose the quorum",
        )

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperEnsemble({self.hosts})"
