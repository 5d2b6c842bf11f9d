"""Clock skew between replicas on real ZooKeeper and SeaweedFS: what the margin tolerates, what breaks
beyond it without the clock check, and the check itself.

A lease's holder believes it alive until the time it asked plus the duration (by its own, honest,
clock: ``time.time()`` here, which no test moves); a TTL record may go at its registration plus the
TTL minus ``--max-clock-skew``. A deletion is observed from outside by polling, which bounds it from
both sides: seen present at P means deleted after P, seen gone at G means deleted before G. So
"deleted too early" is shown by a G before the bound, and "kept long enough" by a P after it.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.clock import SkewedClock, skewed_env
from harness.cluster import Replica
from harness.coordinator import coordinator_config
from harness.process import wait_until
from robustness.checker import check
from robustness.history import History
from robustness.workload import Workload, final_reader
from snapcoord.client import (
    CoordinatorClient,
    Offset,
    RetryPolicy,
    SnapshotRef,
    TaskSnapshot,
)
from snapcoord.client import errors as client_errors
from snapcoord.coordinator.server.app import CoordinatorServer, build_server
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store

pytestmark = pytest.mark.process

#: The margin of the replicas started here: each replica's clock may be 2 s from ZooKeeper's.
MARGIN_S = 4.0
WITHIN_S = 1.5  # a skew the margin tolerates (and the check lets serve)
BEYOND_S = 3.0  # more than half the margin from ZooKeeper's clock: the check refuses
LEASE_MS = 3_000
TTL_MS = 6_000
FLAGS = (
    "--cleanup-interval", "1s",
    "--zk-session-timeout", "4s",
    "--max-clock-skew", f"{MARGIN_S:g}s",
    # Retention keeps everything by default (the workload's model assumes so); the apps of
    # within_margin set their own policy.
    "--retention-keep-last-completed", "1000000",
    "--shutdown-grace", "1s",
    "--log-level", "INFO",
)  # fmt: skip
_OFFSET_RE = re.compile(r"^snapcoord_clock_offset_seconds\s+(\S+)$", re.MULTILINE)


def no_retry(target: str) -> CoordinatorClient:
    return CoordinatorClient(target, timeout_s=20, retry=RetryPolicy(max_attempts=1))


def complete(client: CoordinatorClient, app: str, generation: int) -> None:
    snap = client.create_snapshot(app, ["t0"])
    assert snap.generation == generation
    client.report_task_snapshot(app, generation, TaskSnapshot("t0", (Offset("topic", 0, generation),), {}))


def pinned_pair(client: CoordinatorClient, app: str, lease_id: str, duration_ms: int) -> float:
    """Generation 1 of ``app`` COMPLETED and leased by ``lease_id``, then generation 2 COMPLETED, so
    that retention (keep the last one) wants 1 gone once unpinned; returns when the lease was asked."""
    client.set_retention_policy(app, keep_last_completed=1, completed_ttl_ms=0)
    complete(client, app, 1)
    asked = time.time()
    acquired = client.acquire_snapshots(lease_id, [SnapshotRef(app, 1)], duration_ms=duration_ms)
    assert acquired.unavailable == ()
    complete(client, app, 2)
    return asked


def exists(fn: Callable[[], object]) -> bool:
    try:
        fn()
    except client_errors.NotFound:
        return False
    return True


@dataclass(frozen=True)
class Watched:
    """When a thing was last seen present and first seen gone (honest wall time)."""

    last_present: float
    first_gone: float


def watch_until_gone(present: Callable[[], bool], *, timeout: float = 90.0) -> Watched:
    last = time.time()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = time.time()
        if not present():
            return Watched(last, time.time())
        last = before
    raise AssertionError(f"still present after {timeout:.0f}s")


def offset_s(replica: Replica) -> float | None:
    m = _OFFSET_RE.search(replica.metrics_text())
    return float(m.group(1)) if m else None


# --- beyond the margin, unprotected: the finding ----------------------------------------------------


class OffsetClock:
    """The real wall clock plus a fixed offset: a replica whose clock is off."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


@contextlib.contextmanager
def in_process(
    zk_uri: str, s3_uri: str, offset_ms: int, *, check_clock: bool
) -> Iterator[tuple[str, CoordinatorServer]]:
    """A coordinator in this process whose expiry clock is off by ``offset_ms``; janitor not started
    (the test runs its passes). Yields its target and its server."""
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(s3_uri)
    config = coordinator_config(max_clock_skew="1s", retention_keep_last_completed="1")
    server, port = build_server(
        config, Deps(metadata, blobs, OffsetClock(offset_ms)), check_clock=check_clock
    )
    server.start()
    try:
        yield f"127.0.0.1:{port}", server
    finally:
        server.shutdown(0)
        blobs.close()
        metadata.close()


SKEWS = {"janitor ahead": (6_000, 0), "lease server behind": (0, -6_000)}


@pytest.mark.parametrize("skewed", list(SKEWS))
def test_beyond_the_margin_without_the_check_a_pinned_snapshot_goes_while_its_lease_is_alive(
    zk_uri: str, s3_uri: str, skewed: str
) -> None:
    """The finding: a margin of 1 s and a replica 6 s off. Either its janitor (ahead) finds a lease
    expired that its holder was just told is alive for 4 s, or the leases it serves (behind) expire, by the
    honest janitor's clock, before the duration their holder was given: both times retention
    deletes the pinned snapshot while the lease's holder still counts on it."""
    janitor_offset, server_offset = SKEWS[skewed]
    with (
        in_process(zk_uri, s3_uri, server_offset, check_clock=False) as (serving, _),
        in_process(zk_uri, s3_uri, janitor_offset, check_clock=False) as (_, janitor),
    ):
        client = CoordinatorClient(serving, timeout_s=20)
        # 4 s: the skewed replica's view ends it at once (6 s off, 1 s margin), its holder's 4 s later.
        believed_until = pinned_pair(client, "app", "lease", 4_000) + 4.0

        def pass_and_check() -> bool:
            janitor.services.janitor.run_once()
            return not exists(lambda: client.get_snapshot("app", 1))

        wait_until(pass_and_check, timeout=60, interval=0.2, what="the janitor to delete generation 1")
        gone_by = time.time()
        assert gone_by < believed_until, "the lease outlived its duration: no finding to show"


@pytest.mark.parametrize("skewed", list(SKEWS))
def test_beyond_the_margin_the_check_refuses_what_would_lose_the_pin(
    zk_uri: str, s3_uri: str, skewed: str
) -> None:
    """The same two replicas with the check: the skewed one refuses to serve the lease (behind) or
    its janitor refuses to expire anything (ahead), so the pinned snapshot stays."""
    janitor_offset, server_offset = SKEWS[skewed]
    with (
        in_process(zk_uri, s3_uri, server_offset, check_clock=True) as (serving, _),
        in_process(zk_uri, s3_uri, janitor_offset, check_clock=True) as (janitor_target, janitor),
    ):
        client = no_retry(serving)
        if server_offset:
            complete(no_retry(janitor_target), "app", 1)  # through the honest one
            with pytest.raises(client_errors.Unavailable, match=r"clock skew.*behind ZooKeeper"):
                client.acquire_snapshots("lease", [SnapshotRef("app", 1)], duration_ms=10_000)
            return
        pinned_pair(client, "app", "lease", 10_000)
        for _ in range(3):
            done = janitor.services.janitor.run_once()
            assert "lease-expiry" not in done and "snapshot-retention" not in done, done
        assert exists(lambda: client.get_snapshot("app", 1))
        assert client.get_lease("lease").snapshots == (SnapshotRef("app", 1),)
        with pytest.raises(client_errors.Unavailable, match=r"clock skew.*ahead of ZooKeeper"):
            no_retry(janitor_target).get_lease("lease")


# --- replicas under libfaketime -----------------------------------------------------------------------


class SkewedPair:
    """An honest replica and one whose wall clock ``clock`` moves, on one ZooKeeper and one bucket."""

    def __init__(self, workdir: Path, zk_uri: str, s3_uri: str) -> None:
        self.workdir = workdir
        self.args = ["--metadata", zk_uri, "--blobs", s3_uri, *FLAGS]
        self.clock = SkewedClock(workdir / "faketime" / "offset")
        self._started = 0
        self.honest = self._new(skewed=False)
        self.skewed = self._new(skewed=True)

    def _new(self, *, skewed: bool, port: int | None = None) -> Replica:
        self._started += 1
        name = f"{'skewed' if skewed else 'honest'}-{self._started}"
        env = skewed_env(self.clock) if skewed else {}
        # The old port for a restart, so that a running workload finds the replica again.
        args = [*self.args, "--port", str(port)] if port else self.args
        return Replica(self.workdir / name, args=args, env=env, start_timeout_s=120)

    def lead_with(self, which: str) -> None:
        """Make ``which`` ("honest" or "skewed") the janitor leader: restart the other one while
        ``which`` runs, so the election passes to it."""
        leader, other = (self.honest, "skewed") if which == "honest" else (self.skewed, "honest")
        wait_until(lambda: self.honest.is_janitor_leader() or self.skewed.is_janitor_leader(), timeout=60)
        if leader.is_janitor_leader():
            return
        old = getattr(self, other)
        old.terminate()
        wait_until(leader.is_janitor_leader, timeout=60, what=f"the {which} replica to lead the janitor")
        setattr(self, other, self._new(skewed=other == "skewed", port=old.grpc_port))
        getattr(self, other).start()

    def stop(self) -> None:
        for r in (self.honest, self.skewed):
            with contextlib.suppress(Exception):
                r.kill()


def within_margin(pair: SkewedPair, via: Replica, name: str) -> None:
    """Leases acquired and renewed and a TTL record registered through ``via``, expired by whichever
    replica leads the janitor: the pinned snapshot outlives the lease's duration as its holder counts
    it, the TTL record outlives its TTL less the margin, and the lease renews no more once gone."""
    client = CoordinatorClient(via.target, timeout_s=20)
    readers = [CoordinatorClient(r.target, timeout_s=20) for r in (pair.honest, pair.skewed)]
    pinned_pair(client, name, name, LEASE_MS)
    for _ in range(2):
        asked = time.time()
        client.renew_lease(name, duration_ms=LEASE_MS)
    lease_until = asked + LEASE_MS / 1000
    registered = time.time()
    client.register_producer_offsets(name, [Offset("topic", 0, 1)], ttl_ms=TTL_MS)
    ttl_floor = registered + (TTL_MS / 1000 - MARGIN_S)

    snapshot = watch_until_gone(lambda: exists(lambda: readers[0].get_snapshot(name, 1)))
    assert snapshot.first_gone >= lease_until, (
        f"pin lost: generation 1 was deleted before {snapshot.first_gone:.3f}, while its lease was "
        f"alive until {lease_until:.3f} as its holder was told"
    )
    assert snapshot.last_present >= lease_until, (
        f"inconclusive: generation 1 last seen at {snapshot.last_present:.3f}, its lease ran until "
        f"{lease_until:.3f}: a poll gap hid when it went (machine overloaded?)"
    )
    with pytest.raises(client_errors.NotFound):
        client.renew_lease(name, duration_ms=LEASE_MS)  # the janitor deleted it: no new life

    record = watch_until_gone(
        lambda: all(exists(lambda r=r: r.get_producer_offsets(name)) for r in readers)  # type: ignore[misc]
    )
    assert record.first_gone >= ttl_floor, f"TTL record gone before {record.first_gone:.3f} < {ttl_floor:.3f}"
    assert record.last_present >= ttl_floor, "inconclusive: a poll gap hid when the TTL record went"


def refused_for_skew(client: CoordinatorClient) -> bool:
    try:
        client.renew_lease("probe", duration_ms=LEASE_MS)
    except client_errors.Unavailable as e:
        return "clock skew" in str(e)
    except client_errors.NotFound:
        return False
    return False


def test_a_skewed_replica_keeps_every_pin_within_the_margin_and_refuses_beyond_it(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> None:
    pair = SkewedPair(tmp_path, zk_uri, s3_uri)
    try:
        pair.clock.set(WITHIN_S)
        pair.skewed.start()  # first: it leads the janitor
        pair.honest.start()
        measured = wait_until(lambda: offset_s(pair.skewed), timeout=60, what="a clock reading")
        assert abs(measured + WITHIN_S) < 0.5, f"the skewed replica measured {measured}s, not {-WITHIN_S}s"
        assert abs(offset_s(pair.honest) or 0.0) < 0.5

        # A random workload over both replicas all along, checked against the model at the end;
        # its retention policy races its leases on its own apps.
        history = History()
        targets = [pair.honest.target, pair.skewed.target]
        workload = Workload(targets, history, threads=2, keys=2, seed=7, prefix="skew", retention=True)
        with workload:
            # Ahead, and its janitor expires what the honest replica leased and registered.
            pair.lead_with("skewed")
            within_margin(pair, pair.honest, "ahead")
            # Behind, serving the leases and the TTL record; the honest replica's janitor expires them.
            pair.clock.set(-WITHIN_S)
            pair.lead_with("honest")
            within_margin(pair, pair.skewed, "behind")
        assert not workload.errors, workload.errors
        report = check(history, final_reader([pair.honest.target, pair.skewed.target]), margin_s=MARGIN_S)
        history.dump(tmp_path / "history.jsonl")
        assert report.ok, f"{report}\n(history in {tmp_path / 'history.jsonl'}; logs under {tmp_path})"

        # Beyond half the margin from ZooKeeper's clock: refused, then served again once back.
        skewed = no_retry(pair.skewed.target)
        client = CoordinatorClient(pair.skewed.target, timeout_s=20)
        client.acquire_snapshots("probe", [], duration_ms=60_000)
        pair.clock.set(BEYOND_S)
        moved = time.monotonic()
        wait_until(lambda: refused_for_skew(skewed), timeout=60, what="the skewed replica to refuse")
        detected_s = time.monotonic() - moved
        with pytest.raises(client_errors.Unavailable, match=r"clock skew.*ahead of ZooKeeper.*NTP"):
            skewed.register_producer_offsets("beyond", [Offset("topic", 0, 1)], ttl_ms=TTL_MS)
        with pytest.raises(client_errors.Unavailable, match="clock skew"):
            skewed.acquire_snapshots("beyond", [], duration_ms=LEASE_MS)
        assert abs(offset_s(pair.skewed) + BEYOND_S) < 0.5  # type: ignore[operator]
        assert skewed.get_current_snapshot("ahead").generation == 2  # reads need no clock: served
        assert "clock skew: this replica's clock runs" in pair.skewed.stderr_text()
        CoordinatorClient(pair.honest.target, timeout_s=20).renew_lease(
            "probe", duration_ms=60_000
        )  # unaffected
        pair.clock.set(0)
        back = time.monotonic()
        wait_until(lambda: not refused_for_skew(skewed), timeout=60, what="the skewed replica to serve again")
        recovered_s = time.monotonic() - back
        assert "back within the margin" in pair.skewed.stderr_text()
        print(
            f"clock skew {BEYOND_S}s: refused after {detected_s:.2f}s, served again {recovered_s:.2f}s after"
        )
    finally:
        pair.stop()
