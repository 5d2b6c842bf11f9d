"""Random operations from many client threads on a few hot keys of each kind, all recorded.

``Workload(targets, history, threads=..., keys=..., seed=...)`` starts ``threads`` threads; each
picks one replica from ``targets`` at random (its own ``CoordinatorClient``) and loops over random
operations until ``stop()``:

- producers ``producer/<id>``: register (create-if-absent), get, delete, advance (from another hot id);
- snapshots ``snapshot/<app>``: create, report (a task of a generation some thread saw), get
  (``GetSnapshot``), current (``GetCurrentSnapshot`` with ``consistent=True``), abort, delete;
- leases ``lease/<id>``: acquire (snapshots some thread saw complete), renew, release, get, drop;
- backlog ``backlog/<job>``: mark (first mark wins), progress (random positions), get.

Few keys and many threads make the operations collide, which is what the checker needs. Every
written value is unique (``<thread>.<n>``), so a read names the write it saw. With ``retention`` each
app gets a retention policy that deletes every ended snapshot but the newest completed one as soon
as it can, so the janitor races the leases; the policy call is recorded, and the checker lets such
an app's ended snapshots disappear.

``python -m robustness.workload --targets H:P,H:P --seconds N --out FILE --seed S`` runs one and
dumps its history (JSON lines) for a parent process to check.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from robustness.history import History
from snapcoord.client import (
    AcquireResult,
    BacklogStatus,
    CoordinatorClient,
    Lease,
    Offset,
    RetryPolicy,
    SnapcoordError,
    Snapshot,
    SnapshotRef,
    TaskSnapshot,
)

TASKS = ("t0", "t1")
#: Backlog partitions and their boundary; progress positions are drawn around it.
PARTITIONS = 3
BOUNDARY = 100
STREAM = "s"


@dataclass(frozen=True)
class WorkloadConfig:
    """What a workload does: how many threads, hot keys per kind, how long leases last."""

    threads: int = 6
    keys: int = 2
    seed: int = 0
    #: Prefix of every id, so that several runs on one cluster never share a key.
    prefix: str = "w"
    lease_min_ms: int = 1_000
    lease_max_ms: int = 6_000
    call_timeout_s: float = 5.0
    #: Pause after each operation (keeps the load a fair share of a small machine).
    pause_s: float = 0.01
    retention: bool = False
    #: Threads that keep a shortest lease of their own and let it expire (threads 1..N; none
    #: unless there are at least two more threads for the rest).
    slow_leases: int = 2


def offsets_value(offsets: Sequence[Offset]) -> str:
    """The unique value a producer write carries (its first offset's stream)."""
    return offsets[0].stream if offsets else ""


def snapshot_result(s: Snapshot) -> dict[str, Any]:
    tasks = {t.task_id: t.checkpoints.get("cp", b"").decode() for t in s.tasks}
    return {"generation": s.generation, "state": s.state.value, "task_ids": list(s.task_ids), "tasks": tasks}


def lease_result(lease: Lease) -> dict[str, Any]:
    return {
        "expires_at_ms": lease.expires_at_ms,
        "duration_ms": lease.duration_ms,
        "snapshots": sorted([r.app_id, r.generation] for r in lease.snapshots),
    }


def acquire_result(a: AcquireResult) -> dict[str, Any]:
    return {**lease_result(a.lease), "unavailable": sorted([r.app_id, r.generation] for r in a.unavailable)}


def backlog_result(b: BacklogStatus) -> dict[str, Any]:
    return {
        "processing_backlog": b.processing_backlog,
        "partitions": [[p.stream, p.partition, p.boundary, p.position, p.finished] for p in b.partitions],
    }


class _Knowledge:
    """What the threads have seen (generations, completed snapshots), shared so they collide."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.generations: dict[str, int] = {}
        self.completed: set[tuple[str, int]] = set()

    def saw(self, app: str, result: dict[str, Any]) -> None:
        with self.lock:
            gen = int(result["generation"])
            self.generations[app] = max(self.generations.get(app, 0), gen)
            if result["state"] == "COMPLETED":
                self.completed.add((app, gen))

    def generation(self, app: str, rng: random.Random) -> int:
        with self.lock:
            top = self.generations.get(app, 0)
        # Mostly the newest seen, sometimes an older or a future one (fencing must refuse those).
        return max(1, top - rng.choice((0, 0, 0, 0, 1, 2)) + rng.choice((0, 0, 0, 0, 0, 0, 0, 0, 1)))

    def some_completed(self, rng: random.Random, n: int) -> list[tuple[str, int]]:
        """Up to ``n`` of the newest completed snapshots seen (three per app): the ones deletes
        and retention go for, so that leases and deletions meet."""
        with self.lock:
            pool = sorted(self.completed)
        newest = [
            ref for ref in pool if sum(1 for other in pool if other[0] == ref[0] and other[1] > ref[1]) < 3
        ]
        return rng.sample(newest, min(n, len(newest)))


class Workload:
    """``threads`` client threads doing random operations on ``keys`` hot keys of each kind."""

    def __init__(
        self,
        targets: Sequence[str],
        history: History,
        *,
        threads: int = 6,
        keys: int = 2,
        seed: int = 0,
        prefix: str = "w",
        retention: bool = False,
        slow_leases: int = 2,
        config: WorkloadConfig | None = None,
    ) -> None:
        if not targets:
            raise ValueError("a workload needs at least one target")
        self.targets = list(targets)
        self.history = history
        self.config = config or WorkloadConfig(
            threads=threads, keys=keys, seed=seed, prefix=prefix, retention=retention, slow_leases=slow_leases
        )
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._knowledge = _Knowledge()
        self.errors: list[BaseException] = []

    # -- ids ---------------------------------------------------------------------------------------
    def _ids(self, kind: str) -> list[str]:
        return [f"{self.config.prefix}-{kind}{i}" for i in range(self.config.keys)]

    @property
    def apps(self) -> list[str]:
        return self._ids("app")

    @property
    def producers(self) -> list[str]:
        return self._ids("p")

    @property
    def leases(self) -> list[str]:
        return self._ids("lease")

    @property
    def jobs(self) -> list[str]:
        return self._ids("job")

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Workload:
        master = random.Random(self.config.seed)
        for n in range(self.config.threads):
            rng = random.Random(master.getrandbits(64))
            target = rng.choice(self.targets)
            t = threading.Thread(target=self._run, args=(n, target, rng), name=f"workload-{n}", daemon=True)
            self._threads.append(t)
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Let each thread finish its current call, then wait for them (each call has a deadline)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"workload threads still running after {timeout}s: {stuck}")
        if self.errors:
            raise RuntimeError(f"workload threads failed: {self.errors[:3]}") from self.errors[0]

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop ----------------------------------------------------------------------------------
    def _run(self, n: int, target: str, rng: random.Random) -> None:
        process = f"{self.config.prefix}.{n}"
        client = CoordinatorClient(
            target, timeout_s=self.config.call_timeout_s, retry=RetryPolicy(max_backoff_s=0.5)
        )
        counter = 0
        try:
            if self.config.retention and n == 0:
                for app in self.apps:
                    fn = functools.partial(self._retention, client, app)
                    self._call(process, "retention", f"snapshot/{app}", {}, fn)
            while not self._stop.is_set():
                counter += 1
                value = f"{process}.{counter}"
                if n in self._slow_lease_threads():
                    self._slow_lease(client, process, rng, f"{self.config.prefix}-slow{n}")
                    continue
                kind = rng.choice(("producer", "snapshot", "snapshot", "lease", "backlog"))
                getattr(self, f"_{kind}_op")(client, process, rng, value)
                if self.config.pause_s:
                    self._stop.wait(self.config.pause_s)
        except BaseException as e:  # a bug in the workload itself: stop() reports it
            self.errors.append(e)
        finally:
            client.close()

    def _slow_lease_threads(self) -> range:
        """The threads that keep a lease of their own and let it expire (with 4 threads or more)."""
        n = self.config.slow_leases
        return range(1, 1 + n) if self.config.threads >= n + 2 else range(0)

    def _slow_lease(self, client: CoordinatorClient, process: str, rng: random.Random, lid: str) -> None:
        """Acquire ``lid`` for the shortest duration, wait around its expiry, then renew or read it:
        the answers near and past expiry are what the lease model's time bounds check."""
        duration = self.config.lease_min_ms
        key = f"lease/{lid}"
        refs = self._knowledge.some_completed(rng, 1)

        def acquire() -> dict[str, Any]:
            r = client.acquire_snapshots(lid, [SnapshotRef(a, g) for a, g in refs], duration_ms=duration)
            return acquire_result(r)

        args = {"duration_ms": duration, "snapshots": sorted([a, g] for a, g in refs)}
        self._call(process, "acquire", key, args, acquire)
        for _ in range(rng.choice((1, 1, 2))):
            # Before expiry, around it, and past expiry plus the margin but before the janitor's
            # pass removes the lease (about expiry + --max-clock-skew + one cleanup interval).
            if self._stop.wait(rng.choice((0.3, 1.1, 2.2, 2.4, 2.6)) * duration / 1000):
                return
            if rng.random() < 0.6:
                fn = functools.partial(_renew, client, lid, duration)
                self._call(process, "renew", key, {"duration_ms": duration}, fn)
            else:
                self._call(process, "get", key, {}, functools.partial(_FINAL_GETS["lease"], client, lid))

    def _call(self, process: str, op: str, key: str, args: dict[str, Any], fn: Callable[[], Any]) -> Any:
        """Record ``fn``; None when it raised a ``SnapcoordError`` (recorded as fail or info)."""
        try:
            return self.history.call(process, op, key, args, fn)
        except SnapcoordError:
            return None

    def _retention(self, client: CoordinatorClient, app: str) -> dict[str, Any]:
        p = client.set_retention_policy(app, keep_last_completed=1, completed_ttl_ms=1)
        return {"keep_last_completed": p.keep_last_completed, "completed_ttl_ms": p.completed_ttl_ms}

    def _producer_op(self, client: CoordinatorClient, process: str, rng: random.Random, value: str) -> None:
        pid = rng.choice(self.producers)
        key = f"producer/{pid}"
        what = rng.choices(("register", "get", "delete", "advance"), (4, 3, 2, 1))[0]
        if what == "register":
            self._call(
                process,
                "register",
                key,
                {"value": value},
                lambda: _registration(client.register_producer_offsets(pid, [Offset(value, 0, 0)])),
            )
        elif what == "get":
            self._call(
                process,
                "get",
                key,
                {},
                lambda: {"value": offsets_value(client.get_producer_offsets(pid).offsets)},
            )
        elif what == "delete":
            self._call(process, "delete", key, {}, lambda: {"deleted": client.delete_producer_offsets(pid)})
        else:
            previous = rng.choice([p for p in self.producers if p != pid] or [f"{pid}-prev"])

            def advance() -> dict[str, Any]:
                r = client.advance_producer_offsets(pid, [Offset(value, 0, 0)], previous_producer_id=previous)
                return {
                    "registered": r.registered,
                    "value": offsets_value(r.snapshot.offsets),
                    "previous_deleted": r.previous_deleted,
                }

            self._call(process, "advance", key, {"value": value, "previous": f"producer/{previous}"}, advance)

    def _snapshot_op(self, client: CoordinatorClient, process: str, rng: random.Random, value: str) -> None:
        app = rng.choice(self.apps)
        key = f"snapshot/{app}"
        known = self._knowledge
        what = rng.choices(("create", "report", "get", "current", "abort", "delete"), (3, 6, 2, 2, 1, 1))[0]
        result: dict[str, Any] | None
        if what == "create":
            result = self._call(
                process,
                "create",
                key,
                {"task_ids": list(TASKS)},
                lambda: snapshot_result(client.create_snapshot(app, TASKS)),
            )
        elif what == "report":
            gen, task = known.generation(app, rng), rng.choice(TASKS)
            report = TaskSnapshot(task, (Offset(STREAM, 0, 1),), {"cp": value.encode()})
            result = self._call(
                process,
                "report",
                key,
                {"generation": gen, "task": task, "value": value},
                lambda: snapshot_result(client.report_task_snapshot(app, gen, report)),
            )
        elif what == "get":
            gen = known.generation(app, rng)
            result = self._call(
                process,
                "get",
                key,
                {"generation": gen},
                lambda: snapshot_result(client.get_snapshot(app, gen, include_checkpoints=True)),
            )
        elif what == "current":
            result = self._call(
                process,
                "current",
                key,
                {"consistent": True},
                lambda: snapshot_result(client.get_current_snapshot(app, consistent=True)),
            )
        elif what == "abort":
            gen = known.generation(app, rng)
            result = self._call(
                process,
                "abort",
                key,
                {"generation": gen},
                lambda: snapshot_result(client.abort_snapshot(app, gen)),
            )
        else:
            gen = known.generation(app, rng) - rng.choice((0, 1, 2))
            self._call(
                process,
                "delete",
                key,
                {"generation": gen},
                lambda: {"deleted": client.delete_snapshot(app, gen)},
            )
            return
        if result is not None:
            known.saw(app, result)

    def _lease_op(self, client: CoordinatorClient, process: str, rng: random.Random, value: str) -> None:
        lid = rng.choice(self.leases)
        key = f"lease/{lid}"
        # Releases and drops are rare: the direct pin check cannot blame a deletion that one may
        # have preceded, so frequent ones would leave it nothing to look at.
        what = rng.choices(("acquire", "renew", "release", "get", "drop"), (4, 3, 0.5, 2, 0.25))[0]
        duration = rng.randint(self.config.lease_min_ms, self.config.lease_max_ms)
        if what == "acquire":
            refs = self._knowledge.some_completed(rng, rng.choice((1, 1, 2)))
            self._call(
                process,
                "acquire",
                key,
                {"duration_ms": duration, "snapshots": sorted([a, g] for a, g in refs)},
                lambda: acquire_result(
                    client.acquire_snapshots(lid, [SnapshotRef(a, g) for a, g in refs], duration_ms=duration)
                ),
            )
        elif what == "renew":
            self._call(
                process,
                "renew",
                key,
                {"duration_ms": duration},
                lambda: lease_result(client.renew_lease(lid, duration_ms=duration)),
            )
        elif what == "release":
            refs = self._knowledge.some_completed(rng, 1)
            self._call(
                process,
                "release",
                key,
                {"snapshots": sorted([a, g] for a, g in refs)},
                lambda: lease_result(client.release_snapshots(lid, [SnapshotRef(a, g) for a, g in refs])),
            )
        elif what == "get":
            self._call(process, "get", key, {}, lambda: lease_result(client.get_lease(lid)))
        else:
            self._call(process, "drop", key, {}, lambda: {"dropped": client.drop_lease(lid)})

    def _backlog_op(self, client: CoordinatorClient, process: str, rng: random.Random, value: str) -> None:
        job = rng.choice(self.jobs)
        key = f"backlog/{job}"
        what = rng.choices(("mark", "progress", "get"), (1, 5, 2))[0]
        if what == "mark":
            boundaries = [Offset(STREAM, p, BOUNDARY + rng.randint(0, 20)) for p in range(PARTITIONS)]
            self._call(
                process,
                "mark",
                key,
                {"boundaries": [[o.stream, o.partition, o.offset] for o in boundaries]},
                lambda: backlog_result(client.mark_backlog(job, boundaries)),
            )
        elif what == "progress":
            parts = rng.sample(range(PARTITIONS), rng.randint(1, PARTITIONS))
            positions = [Offset(STREAM, p, rng.randint(0, BOUNDARY + 40)) for p in sorted(parts)]

            def progress() -> dict[str, Any]:
                r = client.report_progress(job, positions, report_id=value)
                return {
                    "newly_finished": [[o.stream, o.partition, o.offset] for o in r.newly_finished],
                    "processing_backlog": r.status.processing_backlog,
                }

            self._call(
                process,
                "progress",
                key,
                {"positions": [[o.stream, o.partition, o.offset] for o in positions], "report_id": value},
                progress,
            )
        else:
            self._call(process, "get", key, {}, lambda: backlog_result(client.get_backlog_status(job)))


def final_reader(targets: Sequence[str], *, timeout_s: float = 30.0) -> Callable[[History], History]:
    """A ``final_state_reader`` for ``checker.check``: after the run, read every key of the history
    (producers, the current snapshot and every generation the run named, leases, backlog jobs)
    through ``targets``, recorded as process ``final``."""

    def read(history: History) -> History:
        final = History()
        keys = sorted({o.key for o in history})
        generations: dict[str, set[int]] = {}
        for o in history:
            if o.kind == "snapshot":
                gen = o.args.get("generation")
                if gen is None and o.outcome == "ok" and isinstance(o.result, dict):
                    gen = o.result.get("generation")
                if isinstance(gen, int) and gen > 0:
                    generations.setdefault(o.key, set()).add(gen)
        with CoordinatorClient(list(targets), timeout_s=timeout_s) as client:
            for key in keys:
                kind, name = key.split("/", 1)
                if kind == "snapshot":
                    _final_call(
                        final, "current", key, {"consistent": True}, functools.partial(_current, client, name)
                    )
                    for gen in sorted(generations.get(key, ())):
                        fn = functools.partial(_generation, client, name, gen)
                        _final_call(final, "get", key, {"generation": gen}, fn)
                else:
                    _final_call(final, "get", key, {}, functools.partial(_FINAL_GETS[kind], client, name))
        return final

    return read


def _final_call(final: History, op: str, key: str, args: dict[str, Any], fn: Callable[[], Any]) -> None:
    with contextlib.suppress(SnapcoordError):  # recorded: a NOT_FOUND is an answer the checker reads
        final.call("final", op, key, args, fn)


def _current(client: CoordinatorClient, app: str) -> dict[str, Any]:
    return snapshot_result(client.get_current_snapshot(app, consistent=True))


def _generation(client: CoordinatorClient, app: str, gen: int) -> dict[str, Any]:
    return snapshot_result(client.get_snapshot(app, gen, include_checkpoints=True))


_FINAL_GETS: dict[str, Callable[[CoordinatorClient, str], dict[str, Any]]] = {
    "producer": lambda c, n: {"value": offsets_value(c.get_producer_offsets(n).offsets)},
    "lease": lambda c, n: lease_result(c.get_lease(n)),
    "backlog": lambda c, n: backlog_result(c.get_backlog_status(n)),
}


def _renew(client: CoordinatorClient, lid: str, duration: int) -> dict[str, Any]:
    return lease_result(client.renew_lease(lid, duration_ms=duration))


def _registration(r: Any) -> dict[str, Any]:
    return {"registered": r.registered, "value": offsets_value(r.snapshot.offsets)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m robustness.workload", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--targets", required=True, help="comma-separated host:port of the replicas")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True, help="history file to write (JSON lines)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--keys", type=int, default=2)
    parser.add_argument("--prefix", default="w", help="id prefix and process name prefix (unique per run)")
    parser.add_argument("--retention", action="store_true", help="let the janitor delete ended snapshots")
    args = parser.parse_args(argv)
    history = History()
    workload = Workload(
        [t for t in args.targets.split(",") if t],
        history,
        threads=args.threads,
        keys=args.keys,
        seed=args.seed,
        prefix=args.prefix,
        retention=args.retention,
    )
    done = threading.Event()
    workload.start()
    try:
        done.wait(args.seconds)
    finally:
        workload.stop()
        history.dump(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
