"""Coordinator replicas on a ZooKeeper ensemble and S3: the deployment the failure tests break.

Every replica is a real ``snapcoord serve`` process with the same ``--metadata`` (the ensemble's
three addresses, or a TcpProxy for one of them) and ``--blobs``. A short janitor interval, short
ZooKeeper sessions and a small clock-skew margin make expiry and failover visible within seconds;
retention keeps every completed snapshot so the history checks can read them all back.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from grpc_health.v1 import health_pb2
from kazoo.client import KazooClient

from harness.coordinator import CoordinatorProcess
from harness.ensemble import QUORUM_TIMEOUT_S, ZooKeeperEnsemble
from harness.process import ServerStartError, wait_until
from snapcoord.coordinator.storage.election import election_path

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

REPLICA_FLAGS = (
    "--cleanup-interval", "1s",
    "--zk-session-timeout", "4s",
    "--max-clock-skew", "1s",
    "--retention-keep-last-completed", "1000000",
    "--shutdown-grace", "1s",
    "--log-level", "INFO",
)  # fmt: skip

_LEADER_RE = re.compile(r"^snapcoord_janitor_leader(?:\{[^}]*\})?\s+(\S+)$", re.MULTILINE)
_RSS_RE = re.compile(r"^process_resident_memory_bytes\s+(\S+)$", re.MULTILINE)


class Replica(CoordinatorProcess):
    """A coordinator process with the failure-test helpers: janitor leadership, RSS, SIGSTOP/SIGCONT."""

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as reply:
            return str(reply.read().decode())

    def is_janitor_leader(self) -> bool:
        if not self.alive():
            return False
        try:
            m = _LEADER_RE.search(self.metrics_text())
        except (OSError, http.client.HTTPException):
            return False
        return m is not None and float(m.group(1)) == 1.0

    def rss_bytes(self) -> int | None:
        try:
            m = _RSS_RE.search(self.metrics_text())
        except (OSError, http.client.HTTPException):
            return None
        return int(float(m.group(1))) if m else None

    def pause(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)

    def is_serving(self) -> bool:
        return bool(self.safe_health() == SERVING)

    def safe_health(self) -> int | None:
        try:
            return self.health()
        except Exception:
            return None


class Cluster:
    """``replicas`` coordinators on a fresh 3-node ensemble, blobs under ``blobs_uri``."""

    def __init__(
        self,
        workdir: Path,
        blobs_uri: str,
        *,
        replicas: int = 3,
        chroot: str = "snapcoord",
        command: Sequence[str] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.command = command  # in place of ``snapcoord`` (harness.coordinator.CoordinatorProcess)
        self.ensemble = ZooKeeperEnsemble(self.workdir / "zk")
        self.blobs_uri = blobs_uri
        self.chroot = chroot
        self._spawned = 0
        self.replicas = [self._replica(i) for i in range(replicas)]

    def _replica(self, i: int, metadata: str | None = None, port: int = 0) -> Replica:
        args = [
            "--metadata",
            metadata or self.ensemble.uri(self.chroot),
            "--blobs",
            self.blobs_uri,
            *REPLICA_FLAGS,
        ]
        if port:
            args += ["--port", str(port)]  # the last --port wins over the harness's --port 0
        # A fresh workdir per process: CoordinatorProcess reads the first serving line of its stdout
        # file, and a restart in the same workdir would append to the old one.
        self._spawned += 1
        workdir = self.workdir / f"replica{i}-{self._spawned}"
        return Replica(workdir, args=args, start_timeout_s=120, command=self.command)

    @property
    def target(self) -> str:
        """A round-robin target over the replicas that are up."""
        return "ipv4:" + ",".join(r.target for r in self.replicas if r.alive())

    def start(self) -> Cluster:
        self.ensemble.start()
        for r in self.replicas:
            r.start()
        return self

    def replace(self, i: int, *, metadata: str | None = None) -> Replica:
        """Kill replica ``i`` if it runs and start a new one in its place (optionally on other metadata).

        The new process listens on the old gRPC port when it can, so that clients holding the
        cluster's address list (a running load) find it again, as they would behind a stable name.
        """
        old = self.replicas[i]
        if old.alive():
            with contextlib.suppress(Exception):
                old.resume()
            old.kill()
        new = self._replica(i, metadata, port=old.grpc_port or 0)
        self.replicas[i] = new
        try:
            new.start()
            return new
        except ServerStartError:
            if "--port" not in new.args:
                raise
            # Someone took the port meanwhile (the kernel may hand it to an outgoing connection).
            new = self._replica(i, metadata)
            self.replicas[i] = new
            new.start()
            return new

    def heal(self) -> None:
        """Bring every node and replica back (after a test that broke them), then wait for SERVING."""
        for node in self.ensemble.nodes:
            node.resume()
            if not node.running:
                node.start()
        self.ensemble.wait_quorum(timeout=QUORUM_TIMEOUT_S)
        for i, r in enumerate(self.replicas):
            if not r.alive() or self.ensemble.uri(self.chroot) not in r.args or r.safe_health() is None:
                self.replace(i)
        for r in self.replicas:
            wait_until(r.is_serving, timeout=120, interval=0.2, what=f"replica {r.target} SERVING")

    def describe(self) -> str:
        """Each node's mode and each replica's health and janitor gauge, for failure messages."""
        nodes = ", ".join(f"zk{n.myid}={n.mode()}" for n in self.ensemble.nodes)
        replicas = ", ".join(
            f"replica{i}(pid {r.pid}, health {r.safe_health()}, janitor leader {r.is_janitor_leader()})"
            for i, r in enumerate(self.replicas)
        )
        return f"{nodes}; {replicas}; logs under {self.workdir}"

    @property
    def observer_hosts(self) -> str:
        """Where this process reaches the ensemble (a kazoo hosts string)."""
        return self.ensemble.hosts

    def janitor_contenders(self) -> int | None:
        """How many replicas' sessions hold a node in the janitor election (None: cannot ask ZK).

        The nodes are ephemeral, so a replica's node disappears exactly when ZooKeeper expires
        its session: this is how a test sees a session expire from outside the replica.
        """
        client = KazooClient(hosts=self.observer_hosts, timeout=10)
        try:
            client.start(timeout=30)
            return len(client.get_children(f"/{self.chroot}{election_path('janitor')}"))
        except Exception:
            return None
        finally:
            with contextlib.suppress(Exception):
                client.stop()
            client.close()

    def wait_health(self, status: int, *, timeout: float = 120.0) -> None:
        """Wait until every running replica reports ``status`` (SERVING or NOT_SERVING)."""
        name = "SERVING" if status == SERVING else "NOT_SERVING"
        wait_until(
            lambda: all(r.safe_health() == status for r in self.replicas if r.alive()),
            timeout=timeout,
            interval=0.2,
            what=f"every replica {name}",
        )

    def janitor_leader(self, timeout: float = 120.0) -> int:
        """Index of the replica whose janitor leads (waits until exactly one does)."""

        def one() -> int | None:
            leaders = [i for i, r in enumerate(self.replicas) if r.is_janitor_leader()]
            return leaders[0] + 1 if len(leaders) == 1 else None

        return wait_until(one, timeout=timeout, interval=0.2, what="exactly one janitor leader") - 1

    def stop(self) -> None:
        for r in self.replicas:
            with contextlib.suppress(Exception):
                r.resume()
            with contextlib.suppress(Exception):
                r.kill()
        self.ensemble.stop()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
