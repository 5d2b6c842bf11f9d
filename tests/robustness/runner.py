"""Run a recorded workload against a cluster while random process faults hit it, then check it.

``run_checked(cluster, seconds=..., seed=...)`` starts a ``Workload`` on the cluster's replicas,
injects faults from a seeded schedule (kill a replica and start a new one on its port, SIGSTOP a
replica for a moment, kill a ZooKeeper node and restart it, SIGSTOP one), heals the cluster, reads
the final state and returns the checker's ``Report`` with the history. The short CI run and the
long mode (``ROBUSTNESS_SECONDS``, see docs/robustness/histories.md) are the same code.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.cluster import REPLICA_FLAGS, Cluster
from robustness.checker import Report, check
from robustness.history import History
from robustness.workload import Workload, final_reader

#: The cluster's --max-clock-skew (harness.cluster.REPLICA_FLAGS), the slack of lease bounds.
MARGIN_S = float(REPLICA_FLAGS[REPLICA_FLAGS.index("--max-clock-skew") + 1].removesuffix("s"))


@dataclass
class FaultLog:
    """What was done to the cluster, when (monotonic seconds), for failure messages."""

    events: list[tuple[float, str]] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def __str__(self) -> str:
        start = self.events[0][0] if self.events else 0.0
        return "; ".join(f"+{t - start:.1f}s {what}" for t, what in self.events)


def _faults(cluster: Cluster, rng: random.Random) -> list[tuple[str, Callable[[], None]]]:
    """One of each fault, to be drawn at random; each undoes itself before it returns."""
    n = len(cluster.replicas)

    def kill_replica() -> None:
        cluster.replace(rng.randrange(n))

    def pause_replica() -> None:
        r = cluster.replicas[rng.randrange(n)]
        r.pause()
        time.sleep(rng.uniform(1.0, 3.0))
        r.resume()

    def kill_zk() -> None:
        node = rng.choice(cluster.ensemble.nodes)
        node.kill()
        time.sleep(rng.uniform(1.0, 3.0))
        node.start()

    def pause_zk() -> None:
        node = rng.choice(cluster.ensemble.nodes)
        node.pause()
        time.sleep(rng.uniform(1.0, 3.0))
        node.resume()

    return [
        ("kill and replace a replica", kill_replica),
        ("pause a replica", pause_replica),
        ("kill and restart a ZooKeeper node", kill_zk),
        ("pause a ZooKeeper node", pause_zk),
    ]


def run_checked(
    cluster: Cluster,
    *,
    seconds: float,
    seed: int,
    prefix: str,
    faults: bool = True,
    threads: int = 6,
    retention: bool = True,
) -> tuple[Report, History, FaultLog]:
    """Load ``cluster`` for ``seconds`` with faults every few seconds (``faults``), heal, check."""
    rng = random.Random(seed)
    history = History()
    log = FaultLog()
    targets = [r.target for r in cluster.replicas]
    workload = Workload(
        targets, history, threads=threads, keys=2, seed=seed, prefix=prefix, retention=retention
    )
    stop = threading.Event()
    log.add("start")
    workload.start()
    try:
        end = time.monotonic() + seconds
        kinds = _faults(cluster, rng)
        while faults and time.monotonic() < end - 2:
            if stop.wait(rng.uniform(1.0, 3.0)):
                break
            name, fault = rng.choice(kinds)
            log.add(name)
            fault()
            log.add(f"{name}: undone")
        stop.wait(max(0.0, end - time.monotonic()))
    finally:
        workload.stop()
    log.add("stop")
    cluster.heal()
    log.add("healed")
    report = check(history, final_reader([r.target for r in cluster.replicas]), margin_s=MARGIN_S)
    log.add(f"checked {len(history)} operations")
    return report, history, log
