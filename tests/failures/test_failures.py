"""Faults under a steady mixed load on 3 coordinator replicas and a 3-node ZooKeeper ensemble.

Every test runs the load from several client processes, injects one fault by SIGKILL, SIGSTOP or a
TCP cut, waits (on conditions, with generous deadlines) until the system has recovered, and then
checks the whole history: no acknowledged write lost, no record pointing at a missing S3 object,
exactly one winner per create-if-absent, and no call ever ended INTERNAL or UNKNOWN. Availability
during the fault and the time to recover are printed (``-s`` shows them), never asserted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.cluster import NOT_SERVING, SERVING, Cluster
from harness.faults import TcpProxy
from harness.mixedload import MixedLoad, Row, Window, check_history, window
from harness.process import wait_until
from snapcoord.client import CoordinatorClient, NotFound, Offset, SnapshotRef, Unavailable
from snapcoord.client._retry import RetryPolicy

pytestmark = pytest.mark.timeout(600)

WAIT_S = 120.0  # every wait on the cluster; the loaded 2-core CI machine needs the slack


def ok_calls_after(load: MixedLoad, t: float) -> int:
    return sum(1 for r in load.rows() if r.ok and r.start >= t)


@contextmanager
def under_load(cluster: Cluster, workdir: Path, name: str, *, workers: int = 3) -> Iterator[MixedLoad]:
    """Mixed load that is warm on entry; on exit it must succeed again, then it stops."""
    load = MixedLoad(cluster.target, workdir / name, workers=workers, seconds=240, prefix=f"{name}-")
    load.start()
    try:
        started = time.time()
        wait_until(
            lambda: ok_calls_after(load, started) >= 20, timeout=WAIT_S, interval=0.2, what="a warm load"
        )
        yield load
        back = time.time()
        wait_until(
            lambda: ok_calls_after(load, back) >= 20,
            timeout=WAIT_S,
            interval=0.2,
            what="calls to succeed again",
        )
    finally:
        load.stop()


def verify(
    cluster: Cluster, load: MixedLoad, name: str, fault: tuple[float, float]
) -> tuple[Window, list[Row]]:
    rows: list[Row] = load.rows()
    during = window(rows, *fault)
    with CoordinatorClient(cluster.target, timeout_s=60) as client:
        verdict = check_history(rows, client)
    print(f"\n[{name}] during the fault: {during}; overall {window(rows)}; {verdict}")
    assert verdict.acknowledged > 0
    assert verdict.ok, str(verdict)
    return during, rows


def run_fault(
    cluster: Cluster, tmp_path: Path, name: str, fault: Callable[[], None]
) -> tuple[Window, list[Row]]:
    """``fault`` breaks something and returns once the cluster has recovered from it."""
    with under_load(cluster, tmp_path, name) as load:
        t0 = time.time()
        try:
            fault()
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{cluster.describe()}") from None
        t1 = time.time()
    return verify(cluster, load, name, (t0, t1))


def test_zookeeper_leader_killed(healed: Cluster, tmp_path: Path) -> None:
    def fault() -> None:
        leader = healed.ensemble.wait_quorum()
        leader.kill()
        new = healed.ensemble.wait_quorum(timeout=WAIT_S)
        assert new is not leader
        leader.start()
        healed.ensemble.wait_quorum(timeout=WAIT_S)

    run_fault(healed, tmp_path, "zk-leader", fault)


def test_quorum_lost_means_unavailable_then_back(healed: Cluster, tmp_path: Path) -> None:
    probe = CoordinatorClient(healed.target, timeout_s=30, retry=RetryPolicy(max_attempts=1))

    outage: list[float] = []  # the load's clock (time.time): the quorum gone, the nodes restarting

    def fault() -> None:
        leader = healed.ensemble.wait_quorum()
        down = [*[n for n in healed.ensemble.nodes if n is not leader][:1], leader]
        for node in down:
            node.kill()
        healed.ensemble.wait_no_quorum(timeout=WAIT_S)
        outage.append(time.time())
        healed.wait_health(NOT_SERVING, timeout=WAIT_S)
        # Reads and writes both fail with UNAVAILABLE (never INTERNAL or UNKNOWN) on every replica.
        for i in range(6):
            with pytest.raises(Unavailable) as raised:
                if i % 2:
                    probe.get_producer_offsets("quorum-probe")
                else:
                    probe.register_producer_offsets(f"quorum-probe-{i}", [Offset("s", 0, i)])
            assert raised.value.code == "UNAVAILABLE"
        outage.append(time.time())  # no quorum can exist before the killed nodes start again
        for node in down:
            node.start()
        healed.ensemble.wait_quorum(timeout=WAIT_S)
        healed.wait_health(SERVING, timeout=WAIT_S)

    during, rows = run_fault(healed, tmp_path, "quorum", fault)
    lost, restart = outage
    # Nothing is acknowledged without a quorum: no call of the load both started and ended OK
    # while the quorum was gone. And the load saw the outage, not only the probe: a call failed,
    # or one was held across it (the client retries UNAVAILABLE within its deadline).
    served = [r for r in rows if r.ok and r.start >= lost and r.end <= restart]
    assert served == [], served[:3]
    held = [r for r in rows if r.start < restart and r.end > restart and r.end - r.start > 1.0]
    assert during.ok < during.calls or held, f"the load saw no outage: {during}"
    assert probe.register_producer_offsets("quorum-after", [Offset("s", 0, 1)]).registered
    probe.close()


def test_replica_killed(healed: Cluster, tmp_path: Path) -> None:
    def fault() -> None:
        healed.replicas[1].kill()
        healed.replace(1)

    run_fault(healed, tmp_path, "replica", fault)


def test_janitor_leader_killed_another_expires_records(healed: Cluster, tmp_path: Path) -> None:
    figures: dict[str, float] = {}

    def fault() -> None:
        leader = healed.janitor_leader(timeout=WAIT_S)
        others = [r for i, r in enumerate(healed.replicas) if i != leader]
        with CoordinatorClient([r.target for r in others], timeout_s=30) as client:
            t0 = time.monotonic()
            healed.replicas[leader].kill()
            ids = [f"janitor-ttl-{i}" for i in range(5)]
            for pid in ids:
                client.register_producer_offsets(pid, [Offset("s", 0, 1)], ttl_ms=1000)
            keep = "janitor-keep"
            client.register_producer_offsets(keep, [Offset("s", 0, 2)])  # 24 h: must survive

            def expired() -> bool:
                for pid in ids:
                    try:
                        client.get_producer_offsets(pid)
                        return False
                    except NotFound:
                        pass
                return True

            wait_until(lambda: any(r.is_janitor_leader() for r in others), timeout=WAIT_S, interval=0.1,
                       what="another janitor leader")  # fmt: skip
            figures["failover_s"] = time.monotonic() - t0
            wait_until(expired, timeout=WAIT_S, interval=0.2, what="the short-TTL records to expire")
            figures["expired_after_s"] = time.monotonic() - t0
            assert client.get_producer_offsets(keep).offsets == (Offset("s", 0, 2),)
        healed.replace(leader)

    run_fault(healed, tmp_path, "janitor-leader", fault)
    print(f"\n[janitor-leader] new leader after {figures['failover_s']:.1f}s, "
          f"records expired {figures['expired_after_s']:.1f}s after the kill")  # fmt: skip


def test_replica_cut_off_from_zookeeper_until_its_session_expires(healed: Cluster, tmp_path: Path) -> None:
    node = healed.ensemble.nodes[0]
    with TcpProxy("127.0.0.1", node.client_port) as proxy:
        cut_off = healed.replace(2, metadata=f"zk://{proxy.address}/{healed.chroot}")
        wait_until(
            lambda: healed.janitor_contenders() == 3, timeout=WAIT_S, interval=0.5, what="3 contenders"
        )
        figures: dict[str, float] = {}

        def fault() -> None:
            t0 = time.monotonic()
            proxy.cut()
            wait_until(lambda: cut_off.safe_health() == NOT_SERVING, timeout=WAIT_S, interval=0.1,
                       what="the cut-off replica NOT_SERVING")  # fmt: skip
            # Its session expires on the ensemble: its ephemeral election node goes away.
            wait_until(
                lambda: healed.janitor_contenders() == 2,
                timeout=WAIT_S,
                interval=0.5,
                what="the cut-off replica's session to expire (2 janitor contenders left)",
            )
            figures["session_expired_after_s"] = time.monotonic() - t0
            assert cut_off.safe_health() == NOT_SERVING
            proxy.restore()
            wait_until(lambda: cut_off.safe_health() == SERVING, timeout=WAIT_S, interval=0.2,
                       what="the replica SERVING on a new session")  # fmt: skip

        run_fault(healed, tmp_path, "zk-cut", fault)
        print(f"\n[zk-cut] session expired {figures['session_expired_after_s']:.1f}s after the cut")
        # It serves correctly again on its new session.
        with CoordinatorClient(cut_off.target, timeout_s=30) as direct:
            assert direct.register_producer_offsets("after-cut", [Offset("s", 0, 3)]).registered
            assert direct.get_producer_offsets("after-cut").offsets == (Offset("s", 0, 3),)
        healed.replace(2)


def test_paused_janitor_leader_deletes_nothing_when_it_resumes(healed: Cluster, tmp_path: Path) -> None:
    """A janitor leader frozen past its session timeout may hold a stale view (a lease it saw expire);
    when it resumes it must notice it lost the lead, not act on that view."""
    leader_index = healed.janitor_leader(timeout=WAIT_S)
    leader = healed.replicas[leader_index]
    others = [r for r in healed.replicas if r is not leader]
    renewals: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    with CoordinatorClient([r.target for r in others], timeout_s=30) as client:
        snap = client.create_snapshot("pause-app", ["t0"])
        ref = SnapshotRef("pause-app", snap.generation)
        # A 2 s lease, renewed every 0.3 s through the other replicas: a leader frozen for longer
        # than that saw it close to expiry; if it acted on that after resuming it would delete it.
        client.acquire_snapshots("pause-lease", [ref], duration_ms=2000)

        def renew() -> None:
            while not stop.is_set():
                try:
                    client.renew_lease("pause-lease", duration_ms=2000)
                    renewals.append(1)
                except BaseException as e:  # NotFound here is the bug this test is about
                    failures.append(e)
                    return
                stop.wait(0.3)

        renewer = threading.Thread(target=renew, daemon=True)
        renewer.start()
        try:
            leader.pause()
            try:
                wait_until(lambda: any(r.is_janitor_leader() for r in others), timeout=WAIT_S, interval=0.2,
                           what="a new janitor leader while the old one is frozen")  # fmt: skip
                mark = len(renewals)
                wait_until(lambda: len(renewals) >= mark + 10 or failures, timeout=WAIT_S, interval=0.1,
                           what="renewals while the old leader is frozen")  # fmt: skip
            finally:
                leader.resume()
            wait_until(
                lambda: leader.safe_health() == SERVING and not leader.is_janitor_leader(),
                timeout=WAIT_S,
                interval=0.2,
                what="the resumed replica serving as a follower",
            )
            mark = len(renewals)
            # Several janitor passes (1 s interval) of the resumed replica and the new leader.
            wait_until(lambda: len(renewals) >= mark + 15 or failures, timeout=WAIT_S, interval=0.1,
                       what="renewals after the resume")  # fmt: skip
        finally:
            stop.set()
            renewer.join(30)
        assert not failures, f"a renewed lease was deleted: {failures!r}"
        assert client.get_lease("pause-lease").snapshots == (ref,)
        # The test can fail: once nobody renews, the janitor does delete the lease.
        wait_until(
            lambda: _gone(client, "pause-lease"), timeout=WAIT_S, interval=0.2, what="the lease to expire"
        )
    print(f"\n[paused-janitor] {len(renewals)} renewals, none lost")


def _gone(client: CoordinatorClient, lease_id: str) -> bool:
    try:
        client.get_lease(lease_id)
    except NotFound:
        return True
    return False
