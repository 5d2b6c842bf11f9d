"""Read-your-writes across replicas: a call right after an acknowledged write through another
replica is never refused because this replica's ZooKeeper server (a follower) lags the leader.

The writer is pinned to the ensemble's leader and the reader to a follower. On loopback a
follower is rarely behind, so the test makes it so: it pauses the reader's follower (SIGSTOP; the
leader and the other follower still make a quorum), writes through the writer, sends the reader's
call, and resumes the follower, which then serves that read and applies the leader's queued
commits at once, in either order. The coordinator must sync before it answers NOT_FOUND or
SNAPSHOT_FENCED. (The kernel's unit test, ``tests/coordinator/kernel/test_stale_refusals.py``, forces the
stale read deterministically.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

import pytest

from harness.cluster import Cluster, Replica
from snapcoord.client import CoordinatorClient, NotFound, Offset, SnapshotFenced, TaskSnapshot

pytestmark = pytest.mark.timeout(600)

ROUNDS = 40
WAIT_S = 120.0


def pin(cluster: Cluster, i: int, hosts: str) -> Replica:
    """Restart replica ``i`` on one ZooKeeper server only."""
    return cluster.replace(i, metadata=f"zk://{hosts}/{cluster.chroot}")


def attempt(call: Callable[[], object], name: str, refused: list[str]) -> None:
    """``call()``; a refusal it may owe to a stale read is noted in ``refused``."""
    try:
        call()
    except (NotFound, SnapshotFenced) as e:
        refused.append(f"{name} {type(e).__name__}: {e}")


def test_calls_right_after_a_write_through_another_replica_are_not_refused(healed: Cluster) -> None:
    leader = healed.ensemble.wait_quorum(timeout=WAIT_S)
    follower = next(n for n in healed.ensemble.followers() if n is not leader)
    writer_replica = pin(healed, 0, leader.hosts)
    reader_replica = pin(healed, 1, follower.hosts)
    refused: list[str] = []
    calls = 0
    try:
        with (
            CoordinatorClient(writer_replica.target, timeout_s=60) as writer,
            CoordinatorClient(reader_replica.target, timeout_s=60) as reader,
        ):
            app = "stale-app"
            for i in range(ROUNDS):
                lease_id = f"stale-lease-{i}"
                producer_id = f"stale-producer-{i}"
                follower.pause()
                try:
                    writer.acquire_snapshots(lease_id, [], duration_ms=600_000)
                    writer.register_producer_offsets(producer_id, [Offset("s", 0, i)])
                    generation = writer.create_snapshot(app, ["t"]).generation
                    checks: dict[str, Callable[[], object]] = {
                        "RenewLease": partial(reader.renew_lease, lease_id, duration_ms=600_000),
                        "GetLease": partial(reader.get_lease, lease_id),
                        "GetProducerOffsets": partial(reader.get_producer_offsets, producer_id),
                        "GetSnapshot": partial(reader.get_snapshot, app, generation),
                        "ReportTaskSnapshot": partial(
                            reader.report_task_snapshot,
                            app,
                            generation,
                            TaskSnapshot("t", (Offset("s", 0, i),)),
                        ),
                    }
                    names = list(checks)
                    first = names[i % len(names)]  # each check meets the lagging follower in turn
                    outcome: list[str] = []
                    call = threading.Thread(target=attempt, args=(checks[first], first, outcome))
                    call.start()
                    time.sleep(0.05)  # let the call reach the paused follower: more chances to race
                finally:
                    follower.resume()
                call.join(timeout=WAIT_S)
                assert not call.is_alive(), f"{first} did not return"
                for name in names:
                    if name != first:
                        attempt(checks[name], name, outcome)
                calls += len(names)
                refused.extend(outcome)
    finally:
        healed.replace(0)
        healed.replace(1)
    print(f"\n[stale-reads] {calls} calls right after a write elsewhere; refused: {refused}")
    assert not refused, f"{len(refused)} of {calls} calls refused on a stale read: {refused}"
