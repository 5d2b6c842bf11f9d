"""The two races of the exactly-once sink's commit, each one run on a fresh table of a store, and what a
plain reader of the table sees afterwards.

- ``zombie_vs_fence``: a writer of epoch 1 (a zombie driver) commits a batch at the number ``F`` it
  took before a newer run fences the table with epoch 2 (and the fence picks ``F`` as well);
- ``two_drivers``: two drivers of one run (both epoch 1) commit one batch at the same number.

Each writer's part file is written by the sink's own ``write`` (the part that Spark's executors do
is replaced by one small file written through the same storage, as one step); the commit, the
fence and their storage calls are the sink's real code on the store's real backend. After the run the
table is read as Spark reads it (``SparkSinkLog.files_at``: the newest compact file and the entries
after it, every file they list) through the store's reader, and every writer is classified:

- ``committed``: its write returned, and a reader sees its batch;
- ``refused``: its write raised, and a reader does not see its batch;
- ``exposed``: its write raised (never reported written: Spark re-runs the batch), yet a reader sees
  its batch, so the batch is read twice once the re-run commits. What issue #42 counts;
- ``exposed-missing-file``: as ``exposed``, but the file the log lists is gone (a rollback deleted
  the write directory before the entry appeared): every Spark read of the table fails;
- ``lost``: its write returned, yet a reader does not see its batch.

In ``zombie_vs_fence`` the newer run re-runs the zombie's batch, so the zombie's batch must be gone
whether or not its write returned: there it is ``exposed`` when visible, ``refused`` otherwise.

Each race runs with one of two commit points (``claims``): the store alone (``None``: the store-only
protocol, what the sink does where the store's create is atomic), or the coordinator's commit claims
(a client of a real coordinator: what the sink does where it is not). The coordinator's calls are
steps of the race too (``GatedClient``), so the scheduler interleaves them with the store's.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from harness.one_file_sink import OneFileSink, part_file_name
from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.sink.epochs import Fenced
from snapcoord.spark_connector.sink.spark_sink_log import SinkLogError, SparkSinkLog
from snapcoord.spark_connector.storage import Storage

from .gated import gated
from .scheduler import Gate, Run, Scenario

COMMITTED, REFUSED, EXPOSED, LOST = "committed", "refused", "exposed", "lost"
EXPOSED_MISSING = "exposed-missing-file"
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class Store:
    """A store races run on. ``storage_for(actor)`` is that actor's own ``Storage`` at the store's
    base directory (the same object for the same actor: one driver's connection), each run uses a
    fresh directory below it. ``reader`` is a plain reader's view of the base directory (the server's
    side of it where the test has one), which also sets each table up: fenced by epoch 1."""

    name: str
    storage_for: Callable[[str], Storage]
    reader: Storage

    @property
    def atomic_exclusive(self) -> bool:
        return self.storage_for("setup").atomic_exclusive


class GatedClient:
    """A coordinator client whose commit-claim calls are steps of ``gate``'s actor."""

    def __init__(self, inner: CoordinatorClient, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def fence_table(self, table_id: str, epoch: int, seq: int) -> Any:
        self._gate.step("coordinator.fence_table")
        return self._inner.fence_table(table_id, epoch, seq)

    def claim_commit(self, table_id: str, seq: int, epoch: int, attempt: str) -> Any:
        self._gate.step("coordinator.claim_commit")
        return self._inner.claim_commit(table_id, seq, epoch, attempt)


class RaceSink(OneFileSink):
    """``OneFileSink`` whose store calls (and coordinator calls) can become steps of a race. With
    ``claims`` (a client) its commit point is the coordinator's claims of ``table_id``, whatever the
    store; without, the store alone."""

    def __init__(
        self, storage: Storage, writer: str, claims: CoordinatorClient | None = None, table_id: str = ""
    ) -> None:
        self.gate: Gate | None = None
        self.claims = claims
        super().__init__(storage, writer, table_id=table_id or None)
        if claims is not None:
            self.use_coordinator(claims)

    def part_file_step(self) -> AbstractContextManager[None]:
        return self.gate.solo("part file") if self.gate is not None else contextlib.nullcontext()

    def needs_coordinator(self) -> bool:
        return self.claims is not None

    def race_on(self, gate: Gate) -> None:
        """From now on every store call of this sink, and every call to the coordinator, is a step of
        ``gate``'s actor."""
        self.gate = gate
        self._own_storage = gated(self._own_storage, gate)
        if self.claims is not None:
            self.use_coordinator(GatedClient(self.claims, gate))  # type: ignore[arg-type]


_tables = itertools.count()


def _fresh_table(store: Store, actor: str, table: str) -> Storage:
    return store.storage_for(actor).child(table)


def visible_writers(reader: Storage, writers: Sequence[str]) -> dict[str, bool]:
    """The writers whose part file the log lists to a Spark reader of the table at ``reader``, each
    with whether that file exists (a listed file that does not makes every Spark read fail)."""
    table = urlparse(reader.uri()).path.rstrip("/") + "/"
    listed = [urlparse(f.path).path for f in SparkSinkLog(reader).files_at()]
    seen: dict[str, bool] = {}
    for w in writers:
        mine = [p for p in listed if p.endswith("/" + part_file_name(w))]
        if mine:
            seen[w] = all(p.startswith(table) and reader.exists(p[len(table) :]) for p in mine)
    return seen


def classify(reported: bool, visible: bool, file_present: bool = True) -> str:
    if reported:
        return COMMITTED if visible else LOST
    if visible:
        return EXPOSED if file_present else EXPOSED_MISSING
    return REFUSED


def _outcome(
    store: Store, table: str, results: dict[str, Any], writers: Sequence[str], *, rerun: bool = False
) -> str:
    """Each writer's class (``classify``); with ``rerun``, the batch is re-run by a newer run, so a
    writer's batch still visible is exposed whether or not its write returned."""
    for actor, result in sorted(results.items()):
        if result.error is not None and not (actor in writers and _refusal(result.error)):
            return f"{actor}:error:{type(result.error).__name__}: {result.error}"
    try:
        seen = visible_writers(store.reader.child(table), writers)
    except SinkLogError as e:
        return f"{UNREADABLE}: {e}"
    return " ".join(
        f"{w}:{classify(results[w].error is None and not rerun, w in seen, seen.get(w, True))}"
        for w in writers
    )


def _refusal(error: BaseException) -> bool:
    """Whether a writer's error is the sink refusing the commit (``Fenced``, or the plain
    ``RuntimeError`` of another writer of its epoch holding the number), not a failure of the store
    (``StorageError`` is a ``RuntimeError`` too, so the class must be exactly that)."""
    return isinstance(error, Fenced) or type(error) is RuntimeError


def _write_batch(sink: RaceSink, batch_id: int) -> int:
    """``sink.write`` of one row naming its writer, as batch ``batch_id``."""
    return sink.write(f'{{"v": "{sink.writer}"}}\n'.encode(), batch_id)


def _recorded(tables: dict[str, str] | None, table: str, outcome: str) -> str:
    """``outcome``, after noting ``table`` in ``tables`` as its first example (for a reader to check)."""
    if tables is not None:
        tables.setdefault(outcome, table)
    return outcome


def zombie_vs_fence(
    store: Store, prefix: str, tables: dict[str, str] | None = None, claims: CoordinatorClient | None = None
) -> Scenario:
    """A zombie (epoch 1) commits batch 7 at the number it took before a newer run fences the table
    with epoch 2 and rolls back the zombie's attempt of batch 7 (what ``exactly_once`` does before
    re-running the batch the zombie did not finish). Whatever of the zombie's batch a reader still
    sees afterwards is read twice once the re-run commits."""

    def scenario(run: Run) -> str:
        table = f"{prefix}-{next(_tables)}"
        tid = f"races.{store.name}.{table}"
        RaceSink(store.reader.child(table), "setup", claims, tid).fence(1)
        zombie = RaceSink(_fresh_table(store, "zombie", table), "zombie", claims, tid)
        zombie.fence(1)  # joins epoch 1, fenced complete
        attempt = zombie.positions()  # the zombie takes its number (1) before the fence's listing
        newer = RaceSink(_fresh_table(store, "newer", table), "newer", claims, tid)
        zombie.race_on(run.gate("zombie"))
        newer.race_on(run.gate("newer"))

        def take_over() -> None:
            newer.fence(2)
            newer.rollback_to(attempt)

        results = run.run({"zombie": functools.partial(_write_batch, zombie, 7), "newer": take_over})
        return _recorded(tables, table, _outcome(store, table, results, ["zombie"], rerun=True))

    return scenario


def two_drivers(
    store: Store, prefix: str, tables: dict[str, str] | None = None, claims: CoordinatorClient | None = None
) -> Scenario:
    """Two drivers of one run (epoch 1) commit one batch at the same number."""

    def scenario(run: Run) -> str:
        table = f"{prefix}-{next(_tables)}"
        tid = f"races.{store.name}.{table}"
        RaceSink(store.reader.child(table), "setup", claims, tid).fence(1)
        sinks = {w: RaceSink(_fresh_table(store, w, table), w, claims, tid) for w in ("a", "b")}
        for sink in sinks.values():
            sink.fence(1)  # joins epoch 1, fenced complete
            sink.positions()  # both take number 1
        for w, sink in sinks.items():
            sink.race_on(run.gate(w))
        results = run.run({w: functools.partial(_write_batch, sink, 5) for w, sink in sinks.items()})
        return _recorded(tables, table, _outcome(store, table, results, ["a", "b"]))

    return scenario


def exposures(outcomes: dict[str, int] | Any) -> int:
    """How many runs left a batch visible that its writer did not report written."""
    return sum(n for outcome, n in outcomes.items() if f":{EXPOSED}" in outcome)


def losses(outcomes: dict[str, int] | Any) -> int:
    """How many runs hid a batch its writer reported written."""
    return sum(n for outcome, n in outcomes.items() if f":{LOST}" in outcome)
