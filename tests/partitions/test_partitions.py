"""Network partitions on a namespaced cluster: each scenario cuts links, watches, heals, watches.

The cluster (``harness.partitioned``) puts each ZooKeeper server, each replica, SeaweedFS and the
clients in their own network namespace; the scenarios (``harness.partition_scenarios``) say what
each asserts. They run in sequence on one cluster (started once for the module), each after a
full heal, and print their figures (``docs/robustness/partitions.md`` has a table of them).
"""

from __future__ import annotations

import pytest

from harness.netns import PREFIX, Network, ip, namespaces, sweep_dead
from harness.partition_scenarios import SCENARIOS
from harness.partitioned import PartitionedCluster

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
