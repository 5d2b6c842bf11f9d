"""Network partitions on a namespaced cluster: each scenario cuts links, watches, heals, watches.

The cluster (``harness.partitioned``) puts each ZooKeeper server, each replica, SeaweedFS and the
clients in their own network namespace; the scenarios (``harness.partition_scenarios``) say what
each asserts. They run in sequence on one cluster (started once for the module), each after a
full heal, and print their figures (``docs/robustness/partitions.md`` has a table of them).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.netns import PREFIX, Network, ip, namespaces, sweep_dead
from harness.partition_scenarios import SCENARIOS
from harness.partitioned import PartitionedCluster
from harness.process import wait_until

pytestmark = [pytest.mark.zookeeper, pytest.mark.s3, pytest.mark.process, pytest.mark.timeout(900)]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_partition(healed: PartitionedCluster, name: str) -> None:
    result = SCENARIOS[name](healed)
    print(f"\n{result}")


def test_the_namespaces_go_with_the_cluster(tmp_path_factory: pytest.TempPathFactory) -> None:
    """After stop (here: a start that fails half-way), no namespace of this cluster is left."""
    cluster = PartitionedCluster(tmp_path_factory.mktemp("gone"))
    cluster.network.create()
    mine = {n.netns for n in cluster.network.nodes.values()}
    assert mine <= set(namespaces())
    cluster.stop()
    assert not mine & set(namespaces())
    assert all(name.startswith(PREFIX) for name in mine)


def test_sweep_removes_what_dead_runs_left() -> None:
    """A namespace named after a process that no longer exists is removed; one of ours is not."""
    with open("/proc/sys/kernel/pid_max") as f:
        dead = int(f.read()) + 1  # above pid_max: no process has this id
    leftover = f"{PREFIX}{dead}n0-zk1"
    ip("netns", "add", leftover)
    try:
        with Network(["a", "b"], [("a", "b")]) as live:  # create() sweeps first
            assert leftover not in namespaces()
            assert live["a"].netns not in sweep_dead()
            assert {live["a"].netns, live["b"].netns} <= set(namespaces())
    finally:
        ip("netns", "delete", leftover, check=False)


def _connect(network: Network, source: str, address: str, port: int) -> str:
    """From ``source``'s namespace, connect to ``address:port``: "ok", or the error's name."""
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(({address!r}, {port}), timeout=2).close(); print('ok')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    argv = network[source].command([sys.executable, "-I", "-S", "-c", code])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_a_cut_drops_packets_silently_and_a_heal_restores_the_link() -> None:
    """Connects across a cut time out (no refusal, no unreachable network), as on a partition."""
    with Network(["a", "b"], [("a", "b")]) as network:
        address = network["b"].address
        listen = f"import socket, time; s = socket.create_server(({address!r}, 9000)); time.sleep(120)"
        server = network["b"].command([sys.executable, "-I", "-S", "-c", listen])
        with subprocess.Popen(server) as listener:
            try:
                target = (network, "a", network["b"].address, 9000)
                wait_until(lambda: _connect(*target) == "ok", timeout=60, what="the listener")
                network.cut("a", "b")
                assert _connect(*target) == "TimeoutError"
                network.heal("a", "b")
                assert _connect(*target) == "ok"
            finally:
                listener.kill()
