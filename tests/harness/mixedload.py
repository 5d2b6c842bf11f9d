"""A steady mixed load on coordinator replicas from several client processes, and its history checks.

Each worker process loops over register / contended register / create+report / acquire+renew /
progress calls through one round-robin client and appends every call (acknowledged or failed) as a
JSON line to its own history file. ``check_history`` then proves, from the history and fresh reads:

- no acknowledged write is lost: every acknowledged registration, task report, lease and progress
  report is readable afterwards with (at least) its acknowledged value;
- no record points at a missing S3 object: every producer record and every snapshot the API lists
  reads in full, checkpoints included;
- every create-if-absent has exactly one winner: all acknowledged replies for one contended
  producer id carry the same stored value, at most one says ``registered``, and that value is stored.

Workers are separate processes (spawned, not forked: the parent holds gRPC channels), each bounded by
a call count and a deadline. Everything is on loopback.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapcoord.client import (
    CoordinatorClient,
    NotFound,
    Offset,
    SnapcoordError,
    SnapshotRef,
    SnapshotState,
    TaskSnapshot,
)
from snapcoord.client._retry import RetryPolicy

#: Codes a call may end with while a fault is on; anything in BAD_CODES is a bug.
BAD_CODES = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS"})
LEASE_MS = 600_000  # leases of the load outlive the run, so an acknowledged lease must still exist
CALL_TIMEOUT_S = 15.0
READ_THREADS = 8


@dataclass
class Row:
    worker: int
    op: str
    key: str
    ok: bool
    code: str
    start: float  # time.time() seconds
    end: float
    value: Any = None  # what the call wrote (or, for reads, returned)
    extra: dict[str, Any] = field(default_factory=dict)


def _run_worker(
    worker: int,
    target: str,
    history: str,
    deadline: float,
    max_calls: int,
    stop: Any,
    pause_s: float,
    prefix: str,
) -> None:
    """One load process: cycles through the operations until ``deadline``, ``max_calls`` or ``stop``."""
    client = CoordinatorClient(target, timeout_s=CALL_TIMEOUT_S, retry=RetryPolicy(max_backoff_s=1.0))
    calls = 0
    app = f"{prefix}w{worker}-app"
    job = f"{prefix}w{worker}-job"
    with open(history, "a", buffering=1) as out:

        def call(op: str, key: str, value: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            """``fn(*args, **kwargs)``, recorded; its result, True for a None result, None on failure."""
            nonlocal calls
            calls += 1
            start = time.time()
            try:
                result = fn(*args, **kwargs)
            except SnapcoordError as e:
                row = Row(worker, op, key, False, e.code, start, time.time(), value)
                row.extra = {"reason": e.reason, "details": e.details[:200], "metadata": dict(e.metadata)}
                out.write(json.dumps(row.__dict__) + "\n")
                return None
            row = Row(worker, op, key, True, "OK", start, time.time(), value)
            row.extra = _describe(op, result)
            out.write(json.dumps(row.__dict__) + "\n")
            return result if result is not None else True

        marked = False
        i = 0
        while time.time() < deadline and calls < max_calls and not stop.is_set():
            i += 1
            pid = f"{prefix}w{worker}-p{i}"
            call("register", pid, i, client.register_producer_offsets, pid, [Offset("s", worker, i)])
            # Every worker races for the same ids: create-if-absent must have exactly one winner.
            race = f"{prefix}race-{i // 3}"
            call("race", race, worker, client.register_producer_offsets, race, [Offset("r", 0, worker)])
            snap = call("create", app, None, client.create_snapshot, app, ["t0", "t1"])
            if snap not in (None, True):
                gen = snap.generation
                for task in ("t0", "t1"):
                    cp = f"{worker}/{i}/{task}"
                    report = TaskSnapshot(task, (Offset("s", worker, i),), {"cp": cp.encode()})
                    call("report", f"{app}/{gen}/{task}", cp, client.report_task_snapshot, app, gen, report)
                lease_id = f"{prefix}w{worker}-l{i}"
                refs = [SnapshotRef(app, gen)]
                if call(
                    "acquire",
                    lease_id,
                    [app, gen],
                    client.acquire_snapshots,
                    lease_id,
                    refs,
                    duration_ms=LEASE_MS,
                ):
                    call("renew", lease_id, None, client.renew_lease, lease_id, duration_ms=LEASE_MS)
            if not marked:
                marked = bool(call("mark", job, None, client.mark_backlog, job, [Offset("s", 0, 10**12)]))
            if marked:
                call("progress", job, i, client.report_progress, job, [Offset("s", 0, i)])
            if pause_s:
                time.sleep(pause_s)
    client.close()


def _describe(op: str, result: Any) -> dict[str, Any]:
    if op == "race":
        return {"registered": result.registered, "stored": [o.offset for o in result.snapshot.offsets]}
    if op == "create":
        return {"generation": result.generation}
    if op in ("acquire", "renew"):
        lease = result.lease if op == "acquire" else result
        return {"expires_at_ms": lease.expires_at_ms}
    return {}


class MixedLoad:
    """``workers`` processes of mixed load against ``target`` (several replicas: round robin)."""

    def __init__(
        self,
        target: str,
        workdir: Path,
        *,
        workers: int = 3,
        seconds: float = 60.0,
        max_calls: int = 20_000,
        pause_s: float = 0.05,
        prefix: str = "",
    ) -> None:
        self.target = target
        self.prefix = prefix  # keeps the ids of several runs on one cluster apart
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.seconds = seconds
        self.max_calls = max_calls
        self.pause_s = pause_s
        self._ctx = multiprocessing.get_context("spawn")
        self._stop = self._ctx.Event()
        self._procs: list[Any] = []

    def history_paths(self) -> list[Path]:
        return [self.workdir / f"history-{w}.jsonl" for w in range(self.workers)]

    def start(self) -> MixedLoad:
        deadline = time.time() + self.seconds
        for w, path in enumerate(self.history_paths()):
            p = self._ctx.Process(
                target=_run_worker,
                args=(
                    w,
                    self.target,
                    str(path),
                    deadline,
                    self.max_calls,
                    self._stop,
                    self.pause_s,
                    self.prefix,
                ),
                daemon=True,
            )
            p.start()
            self._procs.append(p)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Ask the workers to finish their current call and wait for them."""
        self._stop.set()
        for p in self._procs:
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join()

    def rows(self) -> list[Row]:
        rows = []
        for path in self.history_paths():
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.strip():
                        rows.append(Row(**json.loads(line)))
        return sorted(rows, key=lambda r: r.start)

    def __enter__(self) -> MixedLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Window:
    """Availability of the calls that started in [start, end)."""

    calls: int
    ok: int
    codes: dict[str, int]
    recover_s: float  # from the window's start to the end of its last failed call (0: none failed)

    @property
    def availability(self) -> float:
        return self.ok / self.calls if self.calls else 1.0

    def __str__(self) -> str:
        return (
            f"{self.ok}/{self.calls} calls ok ({100 * self.availability:.1f}%), recovered after "
            f"{self.recover_s:.1f}s, codes {dict(sorted(self.codes.items()))}"
        )


def window(rows: Iterable[Row], start: float | None = None, end: float = float("inf")) -> Window:
    """Calls that started in [start, end); ``start`` None: from the first call."""
    rows = list(rows)
    if start is None:
        start = min((r.start for r in rows), default=0.0)
    inside = [r for r in rows if start <= r.start < end]
    failed = [r for r in inside if not r.ok]
    recover = max((r.end for r in failed), default=start) - start
    return Window(len(inside), len(inside) - len(failed), dict(Counter(r.code for r in inside)), recover)


@dataclass(frozen=True)
class Verdict:
    acknowledged: int
    lost: list[str]
    dangling: list[str]
    race_violations: list[str]
    bad_codes: dict[str, int]
    #: Refusals that contradict an earlier acknowledgement (a renew answered NOT_FOUND after the
    #: lease's acquire was acknowledged, a report SNAPSHOT_FENCED for the generation the worker's
    #: own create returned): a replica acted on a view older than another replica's write. Not
    #: data loss (nothing acknowledged is missing), so reported rather than part of ``ok``.
    stale_refusals: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.dangling or self.race_violations or self.bad_codes)

    def __str__(self) -> str:
        return (
            f"{self.acknowledged} acknowledged writes: {len(self.lost)} lost, {len(self.dangling)} dangling, "
            f"{len(self.race_violations)} create-if-absent violations, bad codes {self.bad_codes}"
            + "".join(f"\n  lost: {x}" for x in self.lost[:10])
            + "".join(f"\n  dangling: {x}" for x in self.dangling[:10])
            + "".join(f"\n  race: {x}" for x in self.race_violations[:10])
            + f"; {len(self.stale_refusals)} stale refusals"
            + "".join(f"\n  stale: {x}" for x in self.stale_refusals[:5])
        )


def check_history(rows: Sequence[Row], client: CoordinatorClient) -> Verdict:
    """Read back everything the history says was acknowledged (see the module docstring)."""
    lost: list[str] = []
    dangling: list[str] = []
    races: list[str] = []
    acked = [r for r in rows if r.ok]
    bad = dict(Counter(r.code for r in rows if r.code in BAD_CODES))

    def read(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NotFound:
            lost.append(f"{what}: NOT_FOUND")
        except SnapcoordError as e:
            dangling.append(f"{what}: {e.code} {e.details}")
        return None

    def check_one(r: Row) -> None:
        if r.op == "register":
            got = read(r.key, client.get_producer_offsets, r.key)
            if got is not None and [o.offset for o in got.offsets] != [r.value]:
                lost.append(f"{r.key}: stored {got.offsets}, acknowledged {r.value}")
        elif r.op == "acquire" or r.op == "renew":
            expires_ms = r.extra["expires_at_ms"]
            if expires_ms <= time.time() * 1000:
                return  # past its acknowledged expiry: the janitor may rightly have removed it
            try:
                got = client.get_lease(r.key)
            except NotFound:
                # The lease may have expired between the check above and this read (a long check
                # runs into the expiry of leases acquired near its start): lost only if it is gone
                # before its acknowledged expiry.
                if time.time() * 1000 < expires_ms:
                    lost.append(f"lease {r.key}: NOT_FOUND before its acknowledged expiry {expires_ms}")
                return
            except SnapcoordError as e:
                dangling.append(f"lease {r.key}: {e.code} {e.details}")
                return
            if got.expires_at_ms < expires_ms:
                lost.append(f"lease {r.key}: expires {got.expires_at_ms} < acknowledged {r.extra}")

    # Thousands of reads: a few threads (list.append is atomic, so the lists need no lock).
    with ThreadPoolExecutor(READ_THREADS) as pool:
        list(pool.map(check_one, acked))
    # Task reports: the acknowledged checkpoint is in the snapshot (this also reads the S3 objects).
    reports = [r for r in acked if r.op == "report"]
    by_gen: dict[str, list[Row]] = defaultdict(list)
    for r in reports:
        by_gen[r.key.rsplit("/", 1)[0]].append(r)

    def check_gen(app_gen: str) -> None:
        app, gen = app_gen.rsplit("/", 1)
        snap = read(app_gen, client.get_snapshot, app, int(gen), include_checkpoints=True)
        if snap is None:
            return
        stored = {t.task_id: t.checkpoints.get("cp", b"").decode() for t in snap.tasks}
        for r in by_gen[app_gen]:
            if stored.get(r.key.rsplit("/", 1)[1]) != r.value:
                lost.append(f"report {r.key}: stored {stored}, acknowledged {r.value}")

    with ThreadPoolExecutor(READ_THREADS) as pool:
        list(pool.map(check_gen, sorted(by_gen)))
    # Progress: the stored position is at least the highest acknowledged one.
    progress: dict[str, int] = defaultdict(int)
    for r in acked:
        if r.op == "progress":
            progress[r.key] = max(progress[r.key], r.value)
    for job, position in progress.items():
        status = read(job, client.get_backlog_status, job)
        if status is not None and max((p.position for p in status.partitions), default=-1) < position:
            lost.append(f"progress {job}: stored {status.partitions}, acknowledged {position}")
    # Create-if-absent: one stored value per contended id, the one every acknowledged reply reported.
    by_race: dict[str, list[Row]] = defaultdict(list)
    for r in acked:
        if r.op == "race":
            by_race[r.key].append(r)
    for key, replies in by_race.items():
        values = {tuple(r.extra["stored"]) for r in replies}
        winners = [r for r in replies if r.extra["registered"]]
        got = read(key, client.get_producer_offsets, key)
        kept = tuple(o.offset for o in got.offsets) if got is not None else None
        if len(values) != 1 or len(winners) > 1 or (got is not None and {kept} != values):
            races.append(f"{key}: replies {values}, {len(winners)} said registered, stored {kept}")
        if winners and winners[0].extra["stored"] != [winners[0].value]:
            races.append(f"{key}: winner {winners[0].worker} was told {winners[0].extra['stored']}")
    dangling.extend(scan_for_dangling(client, {r.key.rsplit("/", 2)[0] for r in reports}))
    return Verdict(len(acked), lost, dangling, races, bad, stale_refusals(rows))


def stale_refusals(rows: Sequence[Row]) -> list[str]:
    """Refusals that an acknowledgement earlier in the same worker's history contradicts."""
    acquired: dict[str, float] = {}
    created: dict[tuple[str, int], float] = {}
    for r in rows:  # the first acknowledgement of each lease and generation
        if r.ok and r.op == "acquire":
            acquired[r.key] = min(acquired.get(r.key, r.end), r.end)
        elif r.ok and r.op == "create":
            key = (r.key, r.extra["generation"])
            created[key] = min(created.get(key, r.end), r.end)
    found = []
    for r in rows:
        if r.ok:
            continue
        if r.op == "renew" and r.code == "NOT_FOUND" and acquired.get(r.key, r.start) < r.start:
            found.append(f"renew {r.key}: NOT_FOUND {r.start - acquired[r.key]:.3f}s after its acquire")
        if r.op == "report" and r.extra.get("reason") == "SNAPSHOT_FENCED":
            # Fenced means a newer generation exists; the worker never creates one while reporting.
            app, gen, _ = r.key.rsplit("/", 2)
            current = int(r.extra.get("metadata", {}).get("current_generation", "-1"))
            if created.get((app, int(gen)), r.start) < r.start and current <= int(gen):
                found.append(f"report {r.key}: {r.extra['details']}")
    return found


def scan_for_dangling(client: CoordinatorClient, apps: Iterable[str]) -> list[str]:
    """Read every listed producer record and every snapshot of ``apps`` in full (payloads from S3)."""
    problems: list[str] = []

    def read_producer(producer_id: str) -> None:
        try:
            client.get_producer_offsets(producer_id)
        except NotFound:
            pass  # expired by the janitor between the listing and the read
        except SnapcoordError as e:
            problems.append(f"producer {producer_id}: {e.code} {e.details}")

    token = ""
    with ThreadPoolExecutor(READ_THREADS) as pool:
        while True:
            page = client.list_producer_offsets(page_size=500, page_token=token)
            list(pool.map(read_producer, [item.producer_id for item in page.items]))
            token = page.next_page_token
            if not token:
                break

    def read_snapshot(app: str, generation: int) -> None:
        try:
            full = client.get_snapshot(app, generation, include_checkpoints=True)
        except NotFound:
            return  # deleted by retention between the listing and the read
        except SnapcoordError as e:
            problems.append(f"snapshot {app}/{generation}: {e.code} {e.details}")
            return
        if full.state is SnapshotState.COMPLETED and len(full.tasks) != len(full.task_ids):
            problems.append(f"snapshot {app}/{generation}: COMPLETED with {len(full.tasks)} tasks")

    with ThreadPoolExecutor(READ_THREADS) as pool:
        for app in sorted(apps):
            token = ""
            while True:
                snaps = client.list_snapshots(app, page_size=500, page_token=token)
                list(pool.map(lambda s: read_snapshot(app, s.generation), snaps.items))  # noqa: B023
                token = snaps.next_page_token
                if not token:
                    break
    return problems
