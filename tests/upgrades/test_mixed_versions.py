"""The previous release and this tree side by side, as in a rolling upgrade: one replica of each on
one 3-node ZooKeeper ensemble and the shared S3 (``MixedCluster``), the previous one built from
its commit (``installed``).

- Each replica runs what it should (``snapcoord_build_info``).
- Every RPC works whichever version writes and whichever reads (``client_calls``, with this tree's
  client), and the previous release's own client works against this tree's coordinator and the
  reverse.
- Janitor leadership moves from one version to the other and back, one leader at a time.
- A rolling upgrade under the robustness workload (its histories checked against the model of each
  RPC): two replicas of the previous release, replaced one by one by this tree's, one rolled back
  and upgraded again; no anomaly, no INTERNAL, UNKNOWN or DATA_LOSS, no record a replica cannot
  read, one janitor leader after each step. The calls, errors by code and longest client gap of
  each step are printed. The same check fails on a planted format incompatibility.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from robustness.checker import check
from robustness.history import History
from robustness.runner import MARGIN_S
from robustness.workload import Workload, final_reader

from harness.cluster import SERVING, Replica
from harness.process import wait_until
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient
from upgrades import client_calls
from upgrades.installed import InstalledRelease, install
from upgrades.mixed import Build, MixedCluster
from upgrades.planted_format import planted_command
from upgrades.releases import find, read_releases, version_key
from upgrades.steps import balanced_seed, step_stats

pytestmark = [pytest.mark.process, pytest.mark.zookeeper, pytest.mark.s3]

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
PREVIOUS, CURRENT = 0, 1


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedS3Server, previous_release: InstalledRelease
) -> Iterator[MixedCluster]:
    workdir = tmp_path_factory.mktemp("mixed")
    blobs = s3_server.uri(f"mixed-{secrets.token_hex(4)}")
    with MixedCluster(workdir, blobs, [previous_release, None]) as c:
        yield c


def calls_through(write: str, read: str, prefix: str) -> dict[str, str]:
    """``client_calls`` with this tree's client, writing through ``write`` and reading through ``read``."""
    with CoordinatorClient(write, timeout_s=60) as w, CoordinatorClient(read, timeout_s=60) as r:
        return client_calls.run(w, r, prefix)


def calls_of(release: InstalledRelease, write: str, read: str, prefix: str) -> dict[str, str]:
    """``client_calls`` with ``release``'s client (its venv's Python)."""
    done = subprocess.run(
        [
            str(release.python),
            str(Path(client_calls.__file__)),
            "--write",
            write,
            "--read",
            read,
            "--prefix",
            prefix,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {str(k): str(v) for k, v in json.loads(done.stdout).items()}


def failed(results: dict[str, str]) -> dict[str, str]:
    return {step: result for step, result in results.items() if result != "OK"}


def test_each_replica_runs_its_release(cluster: MixedCluster, previous_release: InstalledRelease) -> None:
    assert cluster.version(PREVIOUS) == previous_release.release.version
    assert cluster.version(CURRENT) == VERSION


@pytest.mark.parametrize(
    ("writer", "reader"),
    [(PREVIOUS, CURRENT), (CURRENT, PREVIOUS)],
    ids=["previous-writes", "current-writes"],
)
def test_every_rpc_written_by_one_version_reads_back_through_the_other(
    cluster: MixedCluster, writer: int, reader: int
) -> None:
    results = calls_through(
        cluster.replicas[writer].target, cluster.replicas[reader].target, f"x{writer}{reader}"
    )
    assert len(results) >= 25 and failed(results) == {}, failed(results)


def test_the_previous_client_against_this_coordinator(
    cluster: MixedCluster, previous_release: InstalledRelease
) -> None:
    target = cluster.replicas[CURRENT].target
    results = calls_of(previous_release, target, target, "old-client")
    assert len(results) >= 25 and failed(results) == {}, failed(results)


def test_this_client_against_the_previous_coordinator(cluster: MixedCluster) -> None:
    target = cluster.replicas[PREVIOUS].target
    results = calls_through(target, target, "new-client")
    assert len(results) >= 25 and failed(results) == {}, failed(results)


def test_janitor_leadership_moves_across_versions_one_leader_at_a_time(cluster: MixedCluster) -> None:
    for _ in range(2):  # the leader's version, then the other's
        leader = cluster.janitor_leader()
        other = 1 - leader
        cluster.replicas[leader].kill()
        assert wait_until(
            lambda: cluster.replicas[other].is_janitor_leader(),  # noqa: B023
            timeout=120,
            interval=0.2,
            what=f"replica {other} ({cluster.version(other)}) leading the janitor",
        )
        cluster.replace(leader)  # the same release again, now a follower
        wait_until(
            cluster.replicas[leader].is_serving, timeout=120, interval=0.2, what="the replaced replica"
        )
        assert cluster.janitor_leader() == other, cluster.describe()


#: ``SNAPCOORD_UPGRADE_LONG=1``: every compatible pair of releases, longer under load.
LONG = os.environ.get("SNAPCOORD_UPGRADE_LONG") == "1"
#: Seconds of load on each mix of versions.
LOAD_PER_STEP_S = 30.0 if LONG else 4.0
#: The first release whose replicas later releases may replace one by one (CHANGELOG 0.3.0;
#: 0.1.0 to 0.2.0 is all at once).
ROLLING_FROM = "0.2.0"
#: Recording client threads, spread evenly over the replicas.
THREADS = 4


class LeaderSampler(threading.Thread):
    """Reads every replica's janitor gauge a few times a second; ``most`` is the largest number of
    replicas that said they lead at once (a killed replica's gauge is gone, so it counts as not)."""

    def __init__(self, cluster: MixedCluster) -> None:
        super().__init__(name="leader-sampler", daemon=True)
        self.cluster = cluster
        self.most = 0
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.25):
            leaders = sum(self._leads(r) for r in list(self.cluster.replicas))
            self.most, self.samples = max(self.most, leaders), self.samples + 1

    @staticmethod
    def _leads(replica: Replica) -> bool:
        try:
            return replica.is_janitor_leader()
        except RuntimeError:  # starting: its metrics port is not known yet
            return False

    def stop(self) -> None:
        self._done.set()
        self.join(30)


def rolling_run(
    cluster: MixedCluster, start: Build, steps: list[tuple[str, int, Build]], *, seed: int, prefix: str
) -> list[str]:
    """Every replica on ``start``, then ``steps`` (name, replica, what it runs next) under the
    recorded workload; the problems found: checker anomalies, forbidden codes, unreadable records,
    a step without exactly one janitor leader, two replicas leading the janitor at once (their
    gauges sampled throughout). Prints each step's figures."""
    for i in range(len(cluster.replicas)):
        cluster.swap(i, start)
    cluster.wait_health(SERVING)
    history = History()
    targets = [r.target for r in cluster.replicas]
    seed = balanced_seed(seed, THREADS, len(targets))
    workload = Workload(targets, history, threads=THREADS, keys=2, seed=seed, prefix=prefix, retention=True)
    pause = threading.Event()
    marks = [("start", time.monotonic_ns())]
    problems = []
    leading = LeaderSampler(cluster)
    workload.start()
    leading.start()
    try:
        pause.wait(LOAD_PER_STEP_S)
        for name, i, build in steps:
            marks.append((name, time.monotonic_ns()))
            cluster.swap(i, build)
            wait_until(cluster.replicas[i].is_serving, timeout=120, interval=0.2, what=f"{name}: SERVING")
            if build is None or isinstance(build, InstalledRelease):
                expected = VERSION if build is None else build.release.version
                assert cluster.version(i) == expected, name
            pause.wait(LOAD_PER_STEP_S)
            try:
                cluster.janitor_leader(timeout=60)  # exactly one, whichever its version
            except TimeoutError:
                problems.append(f"{name}: not exactly one janitor leader")
    finally:
        leading.stop()
        workload.stop()
    end = time.monotonic_ns()
    print(f"janitor leaders at once: at most {leading.most} in {leading.samples} samples")
    if leading.most > 1:
        problems.append(f"{leading.most} replicas led the janitor at once")
    cluster.heal()
    report = check(history, final_reader([r.target for r in cluster.replicas]), margin_s=MARGIN_S)
    stats = step_stats(history, marks, end)
    print("\n".join(s.line() for s in stats))
    assert all(s.calls > 0 for s in stats), stats
    if not report.ok:
        problems.append(str(report))
    return problems + [p for s in stats for p in s.problems()]


def rolling_pairs() -> list[tuple[str, str]]:
    """(from, to) of the rolling runs: ``ROLLING_FROM`` to this tree in CI; in the long mode every
    pair of releases from ``ROLLING_FROM`` on, and this tree ("tree")."""
    if not LONG:
        return [(ROLLING_FROM, "tree")]
    first = version_key(ROLLING_FROM)
    versions = [r.version for r in read_releases() if version_key(r.version) >= first] + ["tree"]
    return [(a, b) for i, a in enumerate(versions) for b in versions[i + 1 :]]


def build_of(version: str) -> Build:
    return None if version == "tree" else install(find(version))


@pytest.mark.parametrize(("start", "target"), rolling_pairs(), ids=lambda v: str(v))
def test_rolling_upgrade_and_rollback_under_the_checked_workload(
    cluster: MixedCluster, start: str, target: str
) -> None:
    old, new = build_of(start), build_of(target)
    steps: list[tuple[str, int, Build]] = [
        ("replica 0 upgraded", 0, new),
        ("replica 1 upgraded", 1, new),
        ("replica 1 rolled back", 1, old),
        ("replica 1 upgraded again", 1, new),
    ]
    print(f"\nrolling {start} -> {target}")
    assert rolling_run(cluster, old, steps, seed=43, prefix=f"roll-{start}-{target}") == []


def test_the_rolling_check_catches_a_planted_format_incompatibility(
    cluster: MixedCluster, previous_release: InstalledRelease
) -> None:
    """A replica that writes leases in a format the previous release cannot read: its leases
    answer DATA_LOSS (or NEWER_FORMAT) through the previous replica, which the check reports."""
    steps: list[tuple[str, int, Build]] = [("replica 1 planted", 1, planted_command())]
    problems = rolling_run(cluster, previous_release, steps, seed=60, prefix="planted")
    assert any("could not read" in p for p in problems), problems
