"""Network namespaces for partition tests: one namespace per node, one veth per pair, cut at will.

Every node (a ZooKeeper server, a coordinator replica, the S3 server, the clients) gets its own
namespace holding one stable address (a /32 on ``lo``) and, for each peer it may talk to, one veth
with a /32 route to that peer over it. So any pair of nodes can be cut on its own: ``cut(a, b)``
sets both ends of their veth down, which makes the kernel drop the /32 routes over it, and traffic
between them falls to a catch-all route over a "sink" veth whose other end stays down: packets are
dropped in silence, as on a real partition (no ECONNREFUSED, no ENETUNREACH; connects time out).
``heal(a, b)`` brings the veth up and puts the routes back.

The addresses (``10.77.0.0/24``) exist only inside the namespaces made here; the root namespace
gets no address, route or link, so parallel runs never meet. Namespace names start with
``snpart<pid>n<k>-``: ``sweep_dead()`` removes what runs of dead processes left behind (processes
inside them first, then the namespaces, which takes their veths along).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType

from harness.process import HarnessError

SUBNET = "10.77.0"
PREFIX = "snpart"
_NAME_RE = re.compile(rf"^{PREFIX}(?P<pid>\d+)n\d+-")
_SINK = "sink0"
_SINK_PEER = "sink1"
_counter = itertools.count()


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (iproute2); a failure raises HarnessError with its stderr."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    """Names of every network namespace ``ip netns`` knows."""
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_namespace(name: str) -> None:
    """SIGKILL every process inside ``name``, then delete it (its veths go with it)."""
    for line in ip("netns", "pids", name, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line), signal.SIGKILL)
    ip("netns", "delete", name, check=False)


def sweep_dead() -> list[str]:
    """Remove the namespaces of runs whose creating process is gone; returns their names."""
    swept = []
    for name in namespaces():
        m = _NAME_RE.match(name)
        if m and not _pid_alive(int(m["pid"])):
            remove_namespace(name)
            swept.append(name)
    return swept


@dataclass(frozen=True)
class Node:
    """One namespace: ``name`` (short, used in veth names), its namespace and its address."""

    name: str
    netns: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this node's namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


class Network:
    """Namespaces for ``names`` and a veth between each pair in ``links`` (all up at first).

    A node's name is at most 13 characters: its peers' veths are named ``p-<name>``.
    """

    def __init__(self, names: Sequence[str], links: Iterable[tuple[str, str]]) -> None:
        if len(set(names)) != len(names) or len(names) > 250:
            raise ValueError("node names must be distinct, at most 250 of them")
        if any(len(n) > 13 or not re.fullmatch(r"[a-z0-9]+", n) for n in names):
            raise ValueError("node names are 1-13 lowercase letters or digits")
        stem = f"{PREFIX}{os.getpid()}n{next(_counter)}-"
        self.nodes = {n: Node(n, stem + n, f"{SUBNET}.{i + 1}") for i, n in enumerate(names)}
        self.links = sorted({self._pair(a, b) for a, b in links})
        self._cut: set[tuple[str, str]] = set()
        self._created: list[str] = []

    @staticmethod
    def _pair(a: str, b: str) -> tuple[str, str]:
        if a == b:
            raise ValueError(f"a link joins two nodes, not {a} to itself")
        return (a, b) if a < b else (b, a)

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    # -- lifecycle ----------------------------------------------------------------------------------
    def create(self) -> Network:
        sweep_dead()
        try:
            for node in self.nodes.values():
                ip("netns", "add", node.netns)
                self._created.append(node.netns)
                self._node_setup(node)
            for a, b in self.links:
                na, nb = self.nodes[a], self.nodes[b]
                ip("link", "add", f"p-{b}", "netns", na.netns, "type", "veth",
                   "peer", "name", f"p-{a}", "netns", nb.netns)  # fmt: skip
                self._link_up(a, b)
        except BaseException:
            self.destroy()
            raise
        return self

    @staticmethod
    def _node_setup(node: Node) -> None:
        ns = ["-n", node.netns]
        ip(*ns, "link", "set", "lo", "up")
        ip(*ns, "addr", "add", f"{node.address}/32", "dev", "lo")
        # The sink: a veth whose peer stays down, without ARP, so what is routed to it is dropped.
        ip(*ns, "link", "add", _SINK, "type", "veth", "peer", "name", _SINK_PEER)
        ip(*ns, "link", "set", _SINK, "arp", "off", "up")
        ip(*ns, "route", "add", f"{SUBNET}.0/24", "dev", _SINK)

    def _link_up(self, a: str, b: str) -> None:
        for here, there in ((a, b), (b, a)):
            ip("-n", self.nodes[here].netns, "link", "set", f"p-{there}", "up")
        for here, there in ((a, b), (b, a)):
            node, peer = self.nodes[here], self.nodes[there]
            ip("-n", node.netns, "route", "replace", f"{peer.address}/32",
               "dev", f"p-{there}", "src", node.address)  # fmt: skip

    def destroy(self) -> None:
        """Kill what runs inside the namespaces and delete them. Idempotent."""
        created, self._created = self._created, []
        for name in created:
            remove_namespace(name)

    # -- faults -------------------------------------------------------------------------------------
    def cut(self, a: str, b: str) -> None:
        """Drop every packet between ``a`` and ``b`` (both directions) until ``heal(a, b)``."""
        pair = self._pair(a, b)
        if pair not in self.links:
            raise HarnessError(f"there is no link between {a} and {b}")
        for here, there in ((a, b), (b, a)):
            ip("-n", self.nodes[here].netns, "link", "set", f"p-{there}", "down")
        self._cut.add(pair)

    def heal(self, a: str, b: str) -> None:
        pair = self._pair(a, b)
        self._link_up(*pair)
        self._cut.discard(pair)

    def isolate(self, side: Iterable[str], other: Iterable[str]) -> list[tuple[str, str]]:
        """Cut every link between a node of ``side`` and a node of ``other``; returns the cut pairs."""
        others = set(other)
        pairs = [(a, b) for a, b in self.links if (a in side and b in others) or (b in side and a in others)]
        for a, b in pairs:
            self.cut(a, b)
        return pairs

    def heal_all(self) -> None:
        for a, b in sorted(self._cut):
            self.heal(a, b)

    @property
    def cut_links(self) -> list[tuple[str, str]]:
        return sorted(self._cut)

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()
