"""Partition scenarios on a ``PartitionedCluster``: fault, observe, heal, observe the recovery.

Each scenario cuts links, keeps one prober thread per replica calling it (a consistent read of a
snapshot that changes during the fault, a cached read of it, a producer registration, and for the
S3 scenario an upload) until what it expects to see was seen, heals, and waits for every replica
to answer a consistent read and report SERVING. It then checks what must hold whatever happened:
every acknowledged write is readable, no consistent read returned a generation older than one
acknowledged before the read began, and the lease taken before the fault still pins its snapshot.
A violated expectation raises ``ScenarioFailed`` naming the calls involved; the figures (calls that
succeeded per replica during the fault, time to the first success and to SERVING after the heal)
come back in a ``ScenarioResult``. The test module and ``bench/robustness.py`` both run these.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from robustness.checker import check
from robustness.history import History
from robustness.workload import Workload, final_reader

from harness.cluster import NOT_SERVING, SERVING
from harness.partitioned import S3, ZK, PartitionedCluster
from harness.process import wait_until
from snapcoord.client import (
    CoordinatorClient,
    NotFound,
    Offset,
    RetryPolicy,
    SnapcoordError,
    SnapshotRef,
    TaskSnapshot,
    Unavailable,
)

#: One attempt per probe (the figures count attempts), with a deadline past the coordinator's own
#: ZooKeeper retry deadline (5 s), so that a replica that gives up answers UNAVAILABLE in time.
PROBE_TIMEOUT_S = 10.0
#: Between two probes of one replica: enough calls to measure, a small share of a small machine.
PROBE_PAUSE_S = 0.05
#: Generous: an election plus a session expiry on a loaded 2-core machine.
WAIT_S = 120.0
#: A checkpoint over the inline limit, so that it goes to S3.
LARGE_PAYLOAD = b"x" * (256 * 1024)
LEASE_MS = 3_600_000
#: The replicas' --max-clock-skew (harness.cluster.REPLICA_FLAGS): the slack of lease bounds.
MAX_CLOCK_SKEW_S = 1.0
#: The history helper's workload runs beside the probers, lightly: the machine is small.
WORKLOAD_THREADS = 2


class ScenarioFailed(AssertionError):
    """An expectation of a partition scenario did not hold; the message names the calls."""


@dataclass(frozen=True)
class Call:
    replica: str
    op: str
    invoked_s: float  # monotonic
    returned_s: float
    outcome: str  # "ok" | "unavailable" | "error"
    detail: str = ""
    generation: int = 0


@dataclass(frozen=True)
class Availability:
    replica: str
    ok: int
    total: int

    def __str__(self) -> str:
        return f"{self.replica} {self.ok}/{self.total}"


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    during: tuple[Availability, ...]
    #: Seconds from the cut to the first UNAVAILABLE answer of each replica expected to refuse.
    refusing_after_s: dict[str, float] = field(default_factory=dict)
    #: Seconds from the heal to each replica's first successful consistent read / health SERVING.
    first_ok_after_heal_s: dict[str, float] = field(default_factory=dict)
    serving_after_heal_s: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def probe_client(target: str) -> CoordinatorClient:
    return CoordinatorClient(target, timeout_s=PROBE_TIMEOUT_S, retry=RetryPolicy(max_attempts=1))


class Log:
    """Every probe call, thread-safe; and what the checks need from them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[Call] = []
        self.acked_generations: list[tuple[float, int]] = []  # (ack time, generation)
        self.acked_producers: dict[str, tuple[Offset, ...]] = {}
        self.unknown_producers: dict[str, tuple[Offset, ...]] = {}

    def add(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def registered(self, producer: str, offsets: tuple[Offset, ...], *, acked: bool) -> None:
        with self._lock:
            (self.acked_producers if acked else self.unknown_producers)[producer] = offsets

    def registrations(self) -> tuple[dict[str, tuple[Offset, ...]], dict[str, tuple[Offset, ...]]]:
        """Copies of (acknowledged, unknown-outcome) registrations: producer -> offsets."""
        with self._lock:
            return dict(self.acked_producers), dict(self.unknown_producers)

    def acked_generation(self, generation: int) -> None:
        with self._lock:
            self.acked_generations.append((time.monotonic(), generation))

    def newest_acked_before(self, t: float) -> int:
        with self._lock:
            return max((g for at, g in self.acked_generations if at < t), default=0)

    def during(self, replica: str, start: float, end: float) -> Availability:
        with self._lock:
            mine = [c for c in self.calls if c.replica == replica and start <= c.invoked_s < end]
        return Availability(replica, sum(c.outcome == "ok" for c in mine), len(mine))

    def summary(self, replica: str, after: float) -> str:
        """How ``replica``'s calls since ``after`` ended, counted by operation, outcome and detail."""
        with self._lock:
            counts = Counter(
                (c.op, c.outcome, c.detail[:80])
                for c in self.calls
                if c.replica == replica and c.invoked_s >= after
            )
        return "; ".join(
            f"{n}x {op} {outcome} {detail}".rstrip() for (op, outcome, detail), n in counts.most_common()
        )

    def first_returned_ok(self, replica: str, after: float) -> float | None:
        """Seconds from ``after`` to the first consistent read of ``replica`` answered after it."""
        with self._lock:
            times = [
                c.returned_s
                for c in self.calls
                if c.replica == replica
                and c.op == "consistent_read"
                and c.outcome == "ok"
                and c.returned_s >= after
            ]
        return min(times) - after if times else None

    def first(self, replica: str, outcome: str, after: float, op: str | None = None) -> float | None:
        with self._lock:
            times = [
                c.returned_s
                for c in self.calls
                if c.replica == replica
                and c.outcome == outcome
                and c.invoked_s >= after
                and op in (None, c.op)
            ]
        return min(times) - after if times else None


class Prober:
    """One thread calling one replica in a loop until ``stop()``."""

    def __init__(self, name: str, target: str, app: str, log: Log, *, upload: bool) -> None:
        self.name = name
        self.app = app
        self.log = log
        self.upload = upload
        self._client = probe_client(target)
        self._stop = threading.Event()
        self._n = 0
        self._thread = threading.Thread(target=self._run, name=f"probe-{name}", daemon=True)

    def start(self) -> Prober:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=WAIT_S)
        self._client.close()

    def _ops(self) -> list[tuple[str, Callable[[], int]]]:
        c, app = self._client, self.app
        ops: list[tuple[str, Callable[[], int]]] = [
            ("consistent_read", lambda: c.get_current_snapshot(app, consistent=True).generation),
            ("cached_read", lambda: c.get_current_snapshot(app).generation),
            ("register", self._register),
        ]
        if self.upload:
            ops.append(("upload", self._upload))
        return ops

    def _register(self) -> int:
        producer = f"{self.app}-{self.name}-{self._n}"
        offsets = (Offset("s", 0, self._n),)
        try:
            self._client.register_producer_offsets(producer, offsets)
        except SnapcoordError:
            self.log.registered(producer, offsets, acked=False)
            raise
        self.log.registered(producer, offsets, acked=True)
        return 0

    def _upload(self) -> int:
        # Refused before any data is stored when the generation is not open: the S3 put happens
        # first only for an open one, so the prober's app keeps one open (see ``open_generation``).
        gen = self._client.get_current_snapshot(self.app + "-up", consistent=True).generation
        self._client.upload_checkpoint(self.app + "-up", gen, "t", "state", LARGE_PAYLOAD)
        return gen

    def _run(self) -> None:
        ops = self._ops()
        while not self._stop.is_set():
            name, fn = ops[self._n % len(ops)]
            self._n += 1
            t0 = time.monotonic()
            try:
                gen = fn()
                call = Call(self.name, name, t0, time.monotonic(), "ok", generation=gen)
            except Unavailable as e:
                call = Call(self.name, name, t0, time.monotonic(), "unavailable", str(e)[:200])
            except SnapcoordError as e:
                call = Call(self.name, name, t0, time.monotonic(), "error", f"{type(e).__name__}: {e}"[:200])
            self.log.add(call)
            self._stop.wait(PROBE_PAUSE_S)


@contextmanager
def probing(scenario: Scenario, *, upload: bool = False) -> Iterator[list[Prober]]:
    """The probers, and the history helper's workload on every replica, for the ``with`` block."""
    cluster, app, log = scenario.cluster, scenario.app, scenario.log
    probers = [
        Prober(r, cluster.replica(r).target, app, log, upload=upload).start() for r in cluster.replica_names
    ]
    workload = Workload(
        [r.target for r in cluster.replicas],
        scenario.history,
        threads=WORKLOAD_THREADS,
        keys=2,
        seed=scenario.seed,
        prefix=f"{app}-w",
    ).start()
    try:
        yield probers
    finally:
        try:
            workload.stop(timeout=WAIT_S)
        finally:
            for p in probers:
                p.stop()


# -- setup and checks shared by the scenarios ------------------------------------------------------


def complete_generation(client: CoordinatorClient, app: str) -> int:
    """Create the app's next generation and complete it (one task); returns its number."""
    snap = client.create_snapshot(app, ["t"])
    client.report_task_snapshot(app, snap.generation, TaskSnapshot("t", (Offset("s", 0, snap.generation),)))
    return snap.generation


def open_generation(client: CoordinatorClient, app: str) -> int:
    """A generation of ``app`` left CREATED, so that uploads for it are accepted."""
    return client.create_snapshot(app, ["t"], timeout_ms=LEASE_MS).generation


def check_no_stale_consistent_reads(log: Log) -> None:
    with log._lock:
        calls = list(log.calls)
    stale = [
        c
        for c in calls
        if c.op == "consistent_read"
        and c.outcome == "ok"
        and c.generation < log.newest_acked_before(c.invoked_s)
    ]
    if stale:
        raise ScenarioFailed(f"consistent reads older than an acknowledged generation: {stale[:5]}")


def check_acknowledged(client: CoordinatorClient, log: Log) -> None:
    """Every acknowledged registration is stored as sent; an unknown one is absent or as sent."""
    acked, unknown = log.registrations()
    for producer, offsets in acked.items():
        got = client.get_producer_offsets(producer, timeout_s=30).offsets
        if got != offsets:
            raise ScenarioFailed(f"acknowledged registration {producer} {offsets} reads back as {got}")
    for producer, offsets in unknown.items():
        try:
            got = client.get_producer_offsets(producer, timeout_s=30).offsets
        except NotFound:
            continue
        if got != offsets:
            raise ScenarioFailed(
                f"registration {producer} of unknown outcome reads back as {got}, not {offsets}"
            )


def check_pin(client: CoordinatorClient, lease_id: str, app: str, generation: int) -> None:
    lease = client.get_lease(lease_id, timeout_s=30)
    if SnapshotRef(app, generation) not in set(lease.snapshots):
        raise ScenarioFailed(f"lease {lease_id} lost its pin of {app}/{generation}: {lease}")
    client.get_snapshot(app, generation, timeout_s=30)


class Scenario:
    """What every scenario shares: its ids, the log, the pinned generation, the heal and checks."""

    def __init__(self, cluster: PartitionedCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.app = f"{name}-{secrets.token_hex(3)}"
        self.log = Log()
        self.history = History()
        self.seed = secrets.randbits(32)
        self.lease_id = f"{self.app}-lease"
        self.notes: list[str] = []
        with CoordinatorClient(cluster.replicas[0].target, timeout_s=WAIT_S) as c:
            self.pinned = complete_generation(c, self.app)
            c.acquire_snapshots(self.lease_id, [SnapshotRef(self.app, self.pinned)], duration_ms=LEASE_MS)
            self.log.acked_generation(self.pinned)
        self.cut_at = 0.0

    def cut(self, side: Sequence[str], other: Sequence[str]) -> None:
        self.cut_at = time.monotonic()
        self.cluster.network.isolate(side, other)

    def write_through(self, replica: str) -> int:
        """Complete a new generation through ``replica`` (retrying until it is acknowledged)."""
        with CoordinatorClient(self.cluster.replica(replica).target, timeout_s=WAIT_S) as c:
            gen = complete_generation(c, self.app)
        self.log.acked_generation(gen)
        return gen

    def heal_and_recover(self, during_end: float) -> ScenarioResult:
        during = tuple(self.log.during(r, self.cut_at, during_end) for r in self.cluster.replica_names)
        healed_at = time.monotonic()
        self.cluster.network.heal_all()
        names = self.cluster.replica_names
        first_ok: dict[str, float] = {}
        serving: dict[str, float] = {}

        def recovered() -> bool:
            # The probers go on calling: the first consistent read answered after the heal.
            for name in names:
                if name not in serving and self.cluster.replica(name).safe_health() == SERVING:
                    serving[name] = time.monotonic() - healed_at
                if name not in first_ok and (t := self.log.first_returned_ok(name, healed_at)) is not None:
                    first_ok[name] = t
            return len(serving) == len(first_ok) == len(names)

        try:
            wait_until(recovered, timeout=WAIT_S, interval=0.05, what="every replica to recover")
        except TimeoutError as e:
            calls = "; ".join(f"{n}: {self.log.summary(n, healed_at)}" for n in names)
            raise ScenarioFailed(f"{e}: serving {serving}, answering {first_ok}; calls: {calls}") from None
        self.cluster.ensemble.wait_quorum(timeout=WAIT_S)
        with CoordinatorClient(self.cluster.replicas[0].target, timeout_s=WAIT_S) as c:
            check_no_stale_consistent_reads(self.log)
            check_acknowledged(c, self.log)
            check_pin(c, self.lease_id, self.app, self.pinned)
            newest = self.log.newest_acked_before(time.monotonic())
            for name in self.cluster.replica_names:
                with probe_client(self.cluster.replica(name).target) as rc:
                    got = rc.get_current_snapshot(self.app, consistent=True).generation
                if got < newest:
                    raise ScenarioFailed(
                        f"{name} reads generation {got} after the heal; {newest} was acknowledged"
                    )
        refusing = {
            r: t
            for r in self.cluster.replica_names
            if (t := self.log.first(r, "unavailable", self.cut_at)) is not None
        }
        return ScenarioResult(self.name, during, refusing, first_ok, serving, tuple(self.notes))

    def check_history(self) -> None:
        """The checker's verdict on the workload's history (kept next to the cluster's logs)."""
        path = self.cluster.workdir / f"{self.app}.history.jsonl"
        self.history.dump(path)
        # Final reads through every replica after the run: an acknowledged write they miss is lost.
        targets = [r.target for r in self.cluster.replicas]
        report = check(self.history, final_reader(targets), margin_s=MAX_CLOCK_SKEW_S)
        if not report.ok:
            raise ScenarioFailed(f"history {path} (seed {self.seed}): {report}")


def wait_outcome(log: Log, replica: str, after: float, op: str, outcome: str) -> float:
    """Wait for a call ``op`` invoked after ``after`` to end with ``outcome``; the error says how
    the replica's calls ended instead."""
    try:
        return wait_until(
            lambda: log.first(replica, outcome, after, op),
            timeout=WAIT_S,
            interval=0.1,
            what=f"{replica} to answer {op} {outcome}",
        )
    except TimeoutError as e:
        raise ScenarioFailed(f"{e}; its calls meanwhile: {log.summary(replica, after)}") from None


def wait_refusing(log: Log, replica: str, after: float, op: str = "consistent_read") -> float:
    return wait_outcome(log, replica, after, op, "unavailable")


def wait_ok(log: Log, replica: str, after: float, op: str = "consistent_read") -> float:
    return wait_outcome(log, replica, after, op, "ok")


def wait_calls(log: Log, after: float, n: int = 3) -> None:
    """Wait until every replica has ``n`` more probe calls after ``after`` (all answered before a
    cut: the probers and the workload are under way)."""

    def enough() -> bool:
        return all(
            a.total >= n
            for a in (log.during(r, after, time.monotonic()) for r in {c.replica for c in log.calls})
        )

    wait_until(enough, timeout=WAIT_S, interval=0.1, what=f"{n} probe calls on every replica")


# -- the scenarios ---------------------------------------------------------------------------------


def replica_cut_from_zookeeper(cluster: PartitionedCluster) -> ScenarioResult:
    """r1 loses every ZooKeeper server; its clients still reach it. It must refuse (UNAVAILABLE)
    consistent reads and writes rather than answer from what it knew, and report NOT_SERVING,
    while r2 goes on; after the heal it must come back by itself."""
    s = Scenario(cluster, "zkcut")
    with probing(s):
        wait_calls(s.log, time.monotonic())
        s.cut(["r1"], ZK)
        wait_refusing(s.log, "r1", s.cut_at)
        wait_refusing(s.log, "r1", s.cut_at, "register")
        wait_until(
            lambda: cluster.replica("r1").safe_health() == NOT_SERVING,
            timeout=WAIT_S,
            interval=0.1,
            what="r1's health NOT_SERVING",
        )
        gen = s.write_through("r2")
        wait_until(
            lambda: cluster.janitor_contenders() == len(cluster.replica_names) - 1,
            timeout=WAIT_S,
            interval=0.2,
            what="ZooKeeper to expire r1's session",
        )
        s.notes.append(f"generation {gen} completed through r2 during the cut")
        end = time.monotonic()
        result = s.heal_and_recover(end)
    s.check_history()
    return result


def leader_isolated(cluster: PartitionedCluster) -> ScenarioResult:
    """The ZooKeeper leader loses both followers (replicas still reach all three): the followers
    elect a new leader, and both replicas must serve again during the fault, through them."""
    s = Scenario(cluster, "zkleader")
    leader = cluster.ensemble.wait_quorum(timeout=WAIT_S)
    name = cluster.ensemble.name_of(leader)
    others = [z for z in ZK if z != name]
    with probing(s):
        wait_calls(s.log, time.monotonic())
        s.cut([name], others)
        wait_until(
            lambda: (lead := cluster.ensemble.leader()) is not None and lead is not leader,
            timeout=WAIT_S,
            interval=0.2,
            what="a new ZooKeeper leader among the followers",
        )
        s.notes.append(f"old leader {name}")
        recovered_at = time.monotonic()
        for r in cluster.replica_names:
            wait_ok(s.log, r, recovered_at)
        s.write_through(cluster.replica_names[0])
        wait_calls(s.log, time.monotonic())
        end = time.monotonic()
        result = s.heal_and_recover(end)
    s.check_history()
    return result


def minority_majority_split(cluster: PartitionedCluster) -> ScenarioResult:
    """{zk1, r1} against {zk2, zk3, r2}: r1 must refuse, r2 must serve (after moving to the
    majority if it was on zk1), and a generation completed on the majority side is what r1 reads
    after the heal."""
    s = Scenario(cluster, "split")
    minority, majority = ["zk1", "r1"], ["zk2", "zk3", "r2", S3]
    with probing(s):
        wait_calls(s.log, time.monotonic())
        s.cut(minority, majority)
        wait_refusing(s.log, "r1", s.cut_at)
        s.write_through("r2")
        wait_ok(s.log, "r2", time.monotonic())
        end = time.monotonic()
        result = s.heal_and_recover(end)
    s.check_history()
    return result


def janitor_leader_cut(cluster: PartitionedCluster) -> ScenarioResult:
    """The replica whose janitor leads loses ZooKeeper: leadership must move to the other replica
    while the cut lasts, the old leader must stop reporting leadership while still cut, and pins
    must survive. How long both gauges read 1 is measured: the old leader's gauge is set at the
    start of a pass, so it lags while a pass is blocked on the lost connection."""
    s = Scenario(cluster, "janitor")
    old = cluster.janitor_leader(timeout=WAIT_S)
    old_name = cluster.replica_names[old]
    both: list[float] = []
    with probing(s):
        wait_calls(s.log, time.monotonic())
        s.cut([old_name], ZK)

        def gauges() -> list[int]:
            leaders = [i for i, r in enumerate(cluster.replicas) if r.is_janitor_leader()]
            if len(leaders) > 1:
                both.append(time.monotonic() - s.cut_at)
            return leaders

        wait_until(
            lambda: any(i != old for i in gauges()), timeout=WAIT_S, interval=0.1, what="a new janitor leader"
        )
        moved = time.monotonic() - s.cut_at
        wait_until(
            lambda: gauges() == [1 - old], timeout=WAIT_S, interval=0.1, what="the cut leader to step down"
        )
        stepped_down = time.monotonic() - s.cut_at
        s.notes.append(f"new janitor leader after {moved:.1f} s, the cut one at 0 after {stepped_down:.1f} s")
        if both:
            s.notes.append(f"both janitor gauges at 1 from {min(both):.1f} to {max(both):.1f} s")
        end = time.monotonic()
        result = s.heal_and_recover(end)
    s.check_history()
    return result


def s3_cut_from_replica(cluster: PartitionedCluster) -> ScenarioResult:
    """r1 loses S3 only: its uploads must fail (UNAVAILABLE, or the client's deadline first: a
    silent partition leaves the S3 client waiting out its read timeout) while its ZooKeeper-only
    calls (reads, registrations with small payloads) go on; r2 uploads throughout."""
    s = Scenario(cluster, "s3cut")
    with CoordinatorClient(cluster.replicas[0].target, timeout_s=WAIT_S) as c:
        open_generation(c, s.app + "-up")
    with probing(s, upload=True):
        wait_calls(s.log, time.monotonic())
        s.cut(["r1"], [S3])
        wait_until(
            lambda: (
                s.log.first("r1", "unavailable", s.cut_at, "upload")
                or s.log.first("r1", "error", s.cut_at, "upload")
            ),
            timeout=WAIT_S,
            interval=0.1,
            what="an upload through r1 to fail",
        )
        after = time.monotonic()
        for op in ("consistent_read", "register"):
            wait_ok(s.log, "r1", after, op)
        wait_ok(s.log, "r2", after, "upload")
        end = time.monotonic()
        bad = [
            c
            for c in s.log.calls
            if c.replica == "r1"
            and c.op == "upload"
            and c.invoked_s >= s.cut_at
            and not (c.outcome == "unavailable" or c.detail.startswith("DeadlineExceeded"))
        ]
        if bad:
            raise ScenarioFailed(
                f"uploads without S3 ended otherwise than UNAVAILABLE or the deadline: {bad[:3]}"
            )
        result = s.heal_and_recover(end)
    s.check_history()
    return result


#: Past the clock check's limit (half of --max-clock-skew: 0.5 s) and within the margin the lease
#: and TTL rules allow (1 s), so the refusal is required and the histories must still check.
SKEW_S = 0.8


def clock_skew(cluster: PartitionedCluster) -> ScenarioResult:
    """r1's wall clock runs SKEW_S ahead, then SKEW_S behind: each time r1 must refuse the calls
    that compute an expiry (its registrations: a producer record has a TTL) with UNAVAILABLE naming
    the clock, go on answering consistent reads (no expiry in them), and serve registrations again
    once its clock is back; r2 serves throughout. The workload beside it records leases and TTL
    records through both replicas, and its history must check at the 1 s margin."""
    s = Scenario(cluster, "skew")
    refused: list[Call] = []
    with probing(s):
        wait_calls(s.log, time.monotonic())
        s.cut_at = time.monotonic()
        for offset in (SKEW_S, -SKEW_S):
            moved = time.monotonic()
            cluster.skewed.set(offset)
            refused_after = wait_refusing(s.log, "r1", moved, "register")
            wait_ok(s.log, "r1", time.monotonic(), "consistent_read")
            s.notes.append(f"r1 {offset:+.1f} s: registrations refused {refused_after:.1f} s after")
            refused += [
                c
                for c in s.log.calls
                if c.replica == "r1"
                and c.op == "register"
                and c.invoked_s >= moved
                and c.outcome == "unavailable"
            ]
            back = time.monotonic()
            cluster.skewed.set(0.0)
            wait_ok(s.log, "r1", back, "register")
        wait_ok(s.log, "r2", s.cut_at, "register")
        end = time.monotonic()
        unnamed = [c for c in refused if "clock" not in c.detail]
        if unnamed:
            raise ScenarioFailed(f"r1's refusals while skewed do not name its clock: {unnamed[:3]}")
        result = s.heal_and_recover(end)
    s.check_history()
    return result


SCENARIOS: dict[str, Callable[[PartitionedCluster], ScenarioResult]] = {
    "replica_cut_from_zookeeper": replica_cut_from_zookeeper,
    "leader_isolated": leader_isolated,
    "minority_majority_split": minority_majority_split,
    "janitor_leader_cut": janitor_leader_cut,
    "s3_cut_from_replica": s3_cut_from_replica,
    "clock_skew": clock_skew,
}
