"""The failure tests' cluster with every node in its own network namespace, so links can be cut.

Nodes: ``zk1``-``zk3`` (a ZooKeeper ensemble), ``s3`` (SeaweedFS), ``r1``.. (coordinator replicas)
and ``cl`` (the clients). Links: every ZooKeeper pair, every replica to every ZooKeeper server and to
S3, and the clients to every node. A replica reaches the clients over one link and ZooKeeper and
S3 over others, so a replica cut from ZooKeeper still answers its clients.

This process lives in the root namespace; it reaches the nodes through ``netns_forward.py``, one
subprocess inside ``cl`` that forwards loopback ports to the nodes' addresses. Its connections
therefore travel the clients' links, which no scenario cuts: the clients and the observer sit
outside every partition. Inside the namespaces every server listens on a fixed port of its own
address (each namespace has its own ports).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import sys
from pathlib import Path

from harness.clock import SkewedClock, skewed_env
from harness.cluster import REPLICA_FLAGS, Cluster, Replica
from harness.ensemble import EnsembleNode, ZooKeeperEnsemble
from harness.netns import Network
from harness.ports import (
    LOOPBACK,
    SEAWEED_MAX_BASE,
    SEAWEED_PORT_COUNT,
    ephemeral_port_range,
    free_port,
    is_port_free,
    seaweed_ports,
)
from harness.process import ManagedProcess, ServerStartError, wait_until
from harness.seaweed import SeaweedS3Server

ZK = ("zk1", "zk2", "zk3")
S3 = "s3"
CLIENTS = "cl"
GRPC_PORT = 7000
METRICS_PORT = 7001
_FORWARDER = Path(__file__).with_name("netns_forward.py")


def namespaced_seaweed_base() -> int:
    """A base port for a SeaweedFS in a namespace. Its ports are its namespace's own, but weed
    names unix sockets in the shared /tmp after them, so the base is drawn from the kernel's
    ephemeral range, where the harness never puts a server of the root namespace
    (``harness.ports``), and with no socket of any SeaweedFS named after one of its ports."""
    lo, hi = ephemeral_port_range()
    hi = min(hi, SEAWEED_MAX_BASE)
    for _ in range(500):
        base = random.randrange(lo, hi - SEAWEED_PORT_COUNT)
        grpc = seaweed_ports(base)[SEAWEED_PORT_COUNT:]
        free = not any(any(Path("/tmp").glob(f"seaweedfs-*-{p}.sock")) for p in grpc)
        # SeaweedS3Server checks its ports on this namespace's loopback before it starts weed.
        free = free and all(is_port_free(p) for p in seaweed_ports(base))
        if free and all(abs(base - b) >= SEAWEED_PORT_COUNT for b in _SEAWEED_BASES):
            _SEAWEED_BASES.add(base)
            return base
    raise RuntimeError(f"no SeaweedFS base port in [{lo}, {hi}) without sockets named after it")


_SEAWEED_BASES: set[int] = set()


class NamespacedEnsemble(ZooKeeperEnsemble):
    """A ZooKeeper ensemble whose node ``myid`` runs in namespace ``zk<myid>``."""

    def __init__(self, workdir: Path, network: Network) -> None:
        self.network = network
        self.forwarded: dict[int, int] = {}  # myid -> loopback port forwarded to its client port
        super().__init__(workdir)
        for node in self.nodes:
            self.forwarded[node.myid] = free_port()

    def _ns(self, node: EnsembleNode) -> str:
        return f"zk{node.myid}"

    def address(self, node: EnsembleNode) -> str:
        return self.network[self._ns(node)].address

    def command(self, node: EnsembleNode, argv: list[str]) -> list[str]:
        return self.network[self._ns(node)].command(argv)

    def probe_address(self, node: EnsembleNode) -> tuple[str, int]:
        return LOOPBACK, self.forwarded[node.myid]

    def node_named(self, name: str) -> EnsembleNode:
        return next(n for n in self.nodes if self._ns(n) == name)

    def name_of(self, node: EnsembleNode) -> str:
        return self._ns(node)

    @property
    def observer_hosts(self) -> str:
        """A kazoo hosts string for this process (through the clients' namespace)."""
        return ",".join(f"{LOOPBACK}:{self.forwarded[n.myid]}" for n in self.nodes)


class NamespacedReplica(Replica):
    """A replica in its own namespace; ``target`` and ``metrics_url`` are the forwarded ports."""

    def __init__(
        self, workdir: Path, *, node: str, grpc_forward: int, metrics_forward: int, **kw: object
    ) -> None:
        super().__init__(workdir, **kw)  # type: ignore[arg-type]
        self.node = node
        self.grpc_forward = grpc_forward
        self.metrics_forward = metrics_forward

    @property
    def target(self) -> str:
        if self.grpc_port is None:
            raise RuntimeError("the coordinator has not started")
        return f"{LOOPBACK}:{self.grpc_forward}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_forward}/metrics"


class PartitionedCluster(Cluster):
    """``replicas`` coordinators, a 3-node ensemble and SeaweedFS, each in its own namespace."""

    ensemble: NamespacedEnsemble

    def __init__(self, workdir: Path, *, replicas: int = 2, chroot: str = "snapcoord") -> None:
        self.workdir = Path(workdir)
        self.chroot = chroot
        self._spawned = 0
        self.replica_names = [f"r{i + 1}" for i in range(replicas)]
        names = [*ZK, S3, *self.replica_names, CLIENTS]
        links = [
            *itertools.combinations(ZK, 2),
            *((r, z) for r in self.replica_names for z in ZK),
            *((r, S3) for r in self.replica_names),
            *((CLIENTS, n) for n in names if n != CLIENTS),
        ]
        self.network = Network(names, links)
        self.ensemble = NamespacedEnsemble(self.workdir / "zk", self.network)
        s3_base = namespaced_seaweed_base()
        self.s3_forward = free_port()
        self.s3 = SeaweedS3Server(
            self.workdir / "s3",
            base_port=s3_base,
            host=self.network[S3].address,
            command_prefix=self.network[S3].command([]),
            client_url=f"http://{LOOPBACK}:{self.s3_forward}",
        )
        self.blobs_uri = self.s3.uri("partitions")
        self._forwards = {name: (free_port(), free_port()) for name in self.replica_names}
        self._forwarder: ManagedProcess | None = None
        #: The wall clock of ``r1`` (libfaketime; offset 0 until a scenario moves it). The others
        #: keep the real clock, the reference a skewed replica is measured against.
        self.skewed = SkewedClock(self.workdir / "clock" / "r1.offset")
        self.replicas = [self._replica(i) for i in range(replicas)]

    def _replica(self, i: int, metadata: str | None = None, port: int = 0) -> Replica:
        name = self.replica_names[i]
        node = self.network[name]
        self._spawned += 1
        grpc_forward, metrics_forward = self._forwards[name]
        return NamespacedReplica(
            self.workdir / f"{name}-{self._spawned}",
            node=name,
            grpc_forward=grpc_forward,
            metrics_forward=metrics_forward,
            host=node.address,
            command_prefix=node.command([]),
            env={**self.s3.env(), **(skewed_env(self.skewed) if i == 0 else {})},
            start_timeout_s=120,
            args=[
                "--metadata", metadata or self.ensemble.uri(self.chroot),
                "--blobs", self.blobs_uri,
                *REPLICA_FLAGS,
                "--port", str(GRPC_PORT),
                "--metrics-port", str(METRICS_PORT),
            ],
        )  # fmt: skip

    def _forward_specs(self) -> list[str]:
        specs = [
            f"{self.ensemble.forwarded[n.myid]}={self.ensemble.address(n)}:{n.client_port}"
            for n in self.ensemble.nodes
        ]
        specs.append(f"{self.s3_forward}={self.network[S3].address}:{self.s3.port}")
        for name, (grpc_forward, metrics_forward) in self._forwards.items():
            address = self.network[name].address
            specs += [f"{grpc_forward}={address}:{GRPC_PORT}", f"{metrics_forward}={address}:{METRICS_PORT}"]
        return specs

    def _start_forwarder(self) -> None:
        log = self.workdir / "forwarder.log"
        argv = [
            sys.executable,
            "-I",
            "-S",
            str(_FORWARDER),
            self.network[CLIENTS].netns_path,
            *self._forward_specs(),
        ]
        self._forwarder = ManagedProcess(argv, log_path=log, cwd=self.workdir, name="netns-forward")
        proc = self._forwarder

        def ready() -> bool:
            if not proc.alive():
                raise ServerStartError(f"the namespace forwarder exited: {proc.output()}")
            return "ready" in proc.output()

        wait_until(ready, timeout=60, interval=0.05, what="the namespace forwarder")

    def start(self) -> PartitionedCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.network.create()
        self._start_forwarder()
        self.ensemble.start()
        self.s3.start()
        for r in self.replicas:
            r.start()
        return self

    def heal(self) -> None:
        """Put every cut link and the skewed clock back, restart what died, and wait for every
        replica SERVING."""
        self.network.heal_all()
        self.skewed.set(0.0)
        super().heal()

    def replica(self, name: str) -> Replica:
        return self.replicas[self.replica_names.index(name)]

    @property
    def observer_hosts(self) -> str:
        return self.ensemble.observer_hosts

    def stop(self) -> None:
        try:
            super().stop()
            with contextlib.suppress(Exception):
                self.s3.kill()
            if self._forwarder is not None:
                self._forwarder.kill()
        finally:
            self.network.destroy()
