"""Small pure models of each record kind's contract, one step function per kind.

``step(state, op)`` returns the states the record may be in after ``op`` took effect with the
outcome and result the history recorded; an empty list means the op could not have answered that
way in ``state``. States are hashable (the search memoizes them). For an ``info`` op (outcome
unknown) ``step`` returns the states after it was applied, whatever it answered; the search also
considers it never applied. A ``fail`` op changes nothing, and its refusal must be one the contract
allows in ``state``.

The contracts (docs/api.md) as checked here:

- producer ``producer/<id>``: create-if-absent. A register on an absent record stores its value
  and answers ``registered=True`` (or ``False`` with its own value: the documented answer of a
  retry whose first attempt stored it); on a present record it answers ``registered=False`` and
  the stored value. Get answers the stored value or NOT_FOUND when absent. Delete answers
  ``deleted=True`` only for a present record (``False`` may be a retry of the caller's own delete).
  Advance registers like a register; on its previous id (``advance_prev``) it deletes.
- snapshot table ``snapshot/<app>``: generations only grow and never repeat; create returns the
  current CREATED snapshot unchanged or starts top+1; a report is accepted for the current CREATED
  generation (or again, unchanged, wherever its task already reported the same value), completes
  the snapshot when every task reported, and is otherwise refused as SNAPSHOT_FENCED,
  SNAPSHOT_NOT_CREATED or REPORT_CONFLICT; reads return exactly the stored reports; abort
  CREATED -> ABORTED; delete only ended snapshots. With a retention policy recorded for the app
  (op ``retention``), an ended snapshot other than the newest completed one may disappear at any
  time (the janitor), and stays possibly gone even once it is the newest completed again: a read
  that finds it gone removes it from the state.
- lease ``lease/<id>``: time-dependent. An acquire or renew linearized in [invoke, return] with
  duration d leaves the lease certainly alive until ``invoke + d - margin`` and possibly alive
  until ``return + d + margin`` (``margin`` is the cluster's ``--max-clock-skew``, for the
  replicas' clocks); an info one may have been applied any time after its invoke, so it is
  possibly alive for ever. Renew, release and get succeed only while possibly alive and answer the
  pinned set; they fail NOT_FOUND/EXPIRED only when possibly dead. An acquire on a possibly dead
  lease may start a new term that holds only its own snapshots.
- backlog job ``backlog/<job>``: the first mark wins and every later one answers it; positions only
  move forward; a partition is finished once its position reaches its boundary, and exactly one
  report (the one that moved it there) lists it in ``newly_finished``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from robustness.history import Op

State = Hashable
Step = Callable[[Any, Op], list[Any]]

FENCED_REASONS = frozenset({"SNAPSHOT_FENCED", "SNAPSHOT_NOT_CREATED", "REPORT_CONFLICT"})
GONE_REASONS = frozenset({"NOT_FOUND", "EXPIRED"})
#: Refusals any write may get without having changed anything (contention, overload).
HARMLESS_REASONS = frozenset({"CONTENDED", "ABORTED", "OVERLOADED", "RESOURCE_EXHAUSTED"})
READS = frozenset({"get", "current"})


@dataclass(frozen=True)
class KeyModel:
    init: Any
    step: Step


def reason(op: Op) -> str:
    return str(op.result.get("reason", "")) if isinstance(op.result, dict) else ""


def _harmless_fail(op: Op) -> bool:
    return op.outcome == "fail" and reason(op) in HARMLESS_REASONS


# -- producers ---------------------------------------------------------------------------------------


def producer_step(state: str | None, op: Op) -> list[str | None]:
    """``state``: the stored value, None when absent."""
    if _harmless_fail(op):
        return [state]
    if op.op in ("register", "advance"):
        value = op.args["value"]
        after = value if state is None else state
        if op.outcome == "info":
            return [after]
        if op.outcome == "fail":
            return []
        r = op.result
        if state is None:
            return [after] if r["value"] == value else []
        return [state] if not r["registered"] and r["value"] == state else []
    if op.op == "get":
        if op.outcome == "fail":
            return [state] if state is None and reason(op) in GONE_REASONS else []
        return [state] if state is not None and op.result["value"] == state else []
    if op.op in ("delete", "advance_prev"):
        if op.outcome == "info":
            return [None]
        if op.outcome == "fail":
            return []
        deleted = op.result["deleted"]
        return [None] if not deleted or state is not None else []
    raise ValueError(f"no producer operation {op.op!r}")


# -- snapshots ---------------------------------------------------------------------------------------

#: One generation: (generation, state, ((task, value), ...) sorted).
Gen = tuple[int, str, tuple[tuple[str, str], ...]]
#: (top generation ever created, live generations, retention on, task set, generations the
#: janitor may have deleted: once deletable, a generation may be gone for good).
SnapState = tuple[int, tuple[Gen, ...], bool, tuple[str, ...], frozenset[int]]

SNAP_INIT: SnapState = (0, (), False, (), frozenset())
DELETING = "DELETING"


def _gens(state: SnapState) -> dict[int, Gen]:
    return {g[0]: g for g in state[1]}


def _with(state: SnapState, gens: dict[int, Gen], top: int | None = None) -> SnapState:
    return (state[0] if top is None else top, tuple(sorted(gens.values())), state[2], state[3], state[4])


def _deletable(state: SnapState, gen: int) -> bool:
    """May the janitor have deleted ``gen`` (retention on, ended, not the newest completed)?"""
    gens = _gens(state)
    if not state[2] or gen not in gens or gens[gen][1] == "CREATED":
        return False
    if gen in state[4]:
        return True
    newest = max((g for g, s, _ in state[1] if s == "COMPLETED"), default=0)
    return gen != newest


def _doom(state: SnapState) -> SnapState:
    """``state`` with every generation deletable now remembered as possibly deleted: the janitor
    may delete it now, and a later change (the newer completed one deleted) does not undo that."""
    if not state[2]:
        return state
    doomed = frozenset(g for g, _, _ in state[1] if _deletable(state, g))
    return state if doomed <= state[4] else (*state[:4], state[4] | doomed)


def _forget(state: SnapState, gen: int) -> SnapState:
    """``gen`` marked DELETING: it reads as gone, and a DeleteSnapshot may still finish it (and
    answer ``deleted=True``) or find it finished (``False``)."""
    gens = _gens(state)
    if gen in gens:
        gens[gen] = (gen, DELETING, ())
    return _with(state, gens)


def _live(state: SnapState, gen: int) -> Gen | None:
    g = _gens(state).get(gen)
    return None if g is None or g[1] == DELETING else g


def _result_matches(result: dict[str, Any], g: Gen, *, with_tasks: bool) -> bool:
    if result["generation"] != g[0] or result["state"] != g[1]:
        return False
    return not with_tasks or tuple(sorted(result["tasks"].items())) == g[2]


def snapshot_step(state: SnapState, op: Op) -> list[SnapState]:
    """The app's snapshot table (see the module docstring)."""
    return [_doom(after) for after in _snapshot_step(state, op)]


def _snapshot_step(state: SnapState, op: Op) -> list[SnapState]:
    if _harmless_fail(op):
        return [state]
    top, _, retention, tasks, doomed = state
    gens = _gens(state)
    gen = int(op.args.get("generation", 0))
    if op.op == "retention":
        return [(top, state[1], True, tasks, doomed)] if op.outcome != "fail" else [state]
    if op.op == "create":
        current = _live(state, top)
        if current is not None and current[1] == "CREATED":
            after = state
            made = current
        else:
            made = (top + 1, "CREATED", ())
            after = _with(
                (top, state[1], retention, tuple(op.args["task_ids"]), doomed),
                {**gens, top + 1: made},
                top + 1,
            )
        if op.outcome == "info":
            return [after]
        if op.outcome == "fail":
            return []
        return [after] if _result_matches(op.result, made, with_tasks=False) else []
    if op.op == "report":
        return _report(state, op, gen)
    if op.op == "get":
        g = _live(state, gen)
        if op.outcome == "fail":
            if reason(op) != "NOT_FOUND":
                return []
            if g is None:
                return [state]
            return [_forget(state, gen)] if _deletable(state, gen) else []
        return [state] if g is not None and _result_matches(op.result, g, with_tasks=True) else []
    if op.op == "current":
        if op.outcome == "fail":
            return []
        r = op.result
        if top == 0:
            return [state] if r["generation"] == 0 and r["state"] == "EMPTY" else []
        g = _live(state, top)
        if g is None or _deletable(state, top):
            return [state] if r["generation"] <= top else []  # the header of a deleted top: not modelled
        return [state] if _result_matches(r, g, with_tasks=False) else []
    if op.op == "abort":
        g = _live(state, gen)
        gone = [_forget(state, gen)] if _deletable(state, gen) else []
        if op.outcome == "info":
            if g is not None and g[1] == "CREATED":
                return [_with(state, {**gens, gen: (gen, "ABORTED", g[2])})]
            return [state]
        if op.outcome == "fail":
            if reason(op) == "NOT_FOUND":
                return [state] if g is None else gone
            return [state] if g is not None and g[1] == "COMPLETED" and reason(op) in FENCED_REASONS else []
        if g is None or g[1] == "COMPLETED":
            return []
        aborted = (gen, "ABORTED", g[2])
        return (
            [_with(state, {**gens, gen: aborted})]
            if _result_matches(op.result, aborted, with_tasks=False)
            else []
        )
    if op.op == "delete":
        if gen in gens and gens[gen][1] == DELETING:
            return [state] if op.outcome != "fail" else []
        g = gens.get(gen)
        if op.outcome == "info":
            return [_forget(state, gen)] if g is not None and g[1] != "CREATED" else [state]
        if op.outcome == "fail":
            why = reason(op)
            if why == "SNAPSHOT_IN_PROGRESS":
                return [state] if g is not None and g[1] == "CREATED" else []
            if why == "LEASE_HELD":  # pins live on the lease keys: the direct checks look at them
                return [state] if g is not None and g[1] != "CREATED" else []
            return []
        if op.result["deleted"]:
            return [_forget(state, gen)] if g is not None and g[1] != "CREATED" else []
        # Nothing to delete: never there, deleted before, or (a retry) deleted by this call's first attempt.
        return [_forget(state, gen)] if g is None or g[1] != "CREATED" else []
    raise ValueError(f"no snapshot operation {op.op!r}")


def _report(state: SnapState, op: Op, gen: int) -> list[SnapState]:
    top, _, _, tasks, _ = state
    gens = _gens(state)
    task, value = op.args["task"], op.args["value"]
    g = _live(state, gen)
    reports = dict(g[2]) if g is not None else {}
    duplicate = reports.get(task) == value
    accepted = g is not None and gen == top and g[1] == "CREATED" and task not in reports
    after = state
    if accepted and g is not None:
        reports[task] = value
        done = set(reports) >= set(tasks)
        new: Gen = (gen, "COMPLETED" if done else "CREATED", tuple(sorted(reports.items())))
        after = _with(state, {**gens, gen: new})
    if op.outcome == "info":
        return [after]
    if op.outcome == "fail":
        if accepted or duplicate or reason(op) not in FENCED_REASONS:
            return []
        return [state]
    if duplicate:
        return [state] if op.result["generation"] == gen else []
    if not accepted:
        return []
    return [after] if _result_matches(op.result, _gens(after)[gen], with_tasks=False) else []


# -- leases ------------------------------------------------------------------------------------------

INF = 1 << 62
#: None (no lease) or (certainly alive until ns, possibly alive until ns, pinned snapshots).
LeaseState = tuple[int, int, frozenset[tuple[str, int]]] | None


def _refs(items: Sequence[Sequence[Any]]) -> frozenset[tuple[str, int]]:
    return frozenset((str(a), int(g)) for a, g in items)


def lease_model(margin_ns: int) -> KeyModel:
    """The lease model with the clock-skew ``margin_ns`` (see the module docstring)."""

    def bounds(op: Op) -> tuple[int, int]:
        d = int(op.args["duration_ms"]) * 1_000_000
        hi = INF if op.outcome == "info" else op.return_ns + d + margin_ns
        return op.invoke_ns + d - margin_ns, hi

    def step(state: LeaseState, op: Op) -> list[LeaseState]:
        if _harmless_fail(op):
            return [state]
        maybe_alive = state is not None and op.invoke_ns < state[1]
        maybe_dead = state is None or op.return_ns > state[0]
        held = state[2] if state is not None else frozenset()
        if op.op == "acquire":
            lo, hi = bounds(op)
            asked = _refs(op.args["snapshots"])
            terms: list[frozenset[tuple[str, int]]] = []
            if maybe_alive:
                terms.append(held)
            if maybe_dead:
                terms.append(frozenset())
            if op.outcome == "info":
                return [(lo, hi, old | asked) for old in terms]
            if op.outcome == "fail":
                return []
            got = _refs(op.result["snapshots"])
            missing = _refs(op.result["unavailable"])
            return [(lo, hi, got) for old in terms if got == (old | asked) - missing or got == old | asked]
        if op.op in ("renew", "get", "release"):
            if op.outcome == "fail":
                return [state] if maybe_dead and reason(op) in GONE_REASONS else []
            if state is None:  # nothing to renew, read or release: it must have been refused
                return [state] if op.outcome == "info" else []
            after = held - _refs(op.args["snapshots"]) if op.op == "release" else held
            lo, hi = bounds(op) if op.op == "renew" else (state[0], state[1])
            if op.outcome == "info":
                return [(lo, hi, after)] if maybe_alive else [state]
            if not maybe_alive or _refs(op.result["snapshots"]) != after:
                return []
            return [(lo, hi, after)]
        if op.op == "drop":
            if op.outcome == "info":
                return [None]
            if op.outcome == "fail":
                return []
            if op.result["dropped"]:
                return [None] if maybe_alive else []
            return [None] if maybe_dead else []
        raise ValueError(f"no lease operation {op.op!r}")

    return KeyModel(None, step)


# -- backlog -----------------------------------------------------------------------------------------

#: None (never marked) or ((stream, partition, boundary, position or -2 if never reported, finished), ...).
Part = tuple[str, int, int, int, bool]
BacklogState = tuple[Part, ...] | None
UNREPORTED = -2


def _status_matches(parts: tuple[Part, ...], reported: Sequence[Sequence[Any]]) -> bool:
    if len(reported) != len(parts):
        return False
    for (stream, partition, boundary, position, finished), r in zip(parts, reported, strict=True):
        if (r[0], r[1], r[2], r[4]) != (stream, partition, boundary, finished):
            return False
        if position != UNREPORTED and r[3] != position:
            return False
    return True


def backlog_step(state: BacklogState, op: Op) -> list[BacklogState]:
    """The job's marks and progress (see the module docstring)."""
    if _harmless_fail(op):
        return [state]
    if op.op == "mark":
        after = state
        if after is None:
            after = tuple(
                sorted((str(s), int(p), int(b), UNREPORTED, False) for s, p, b in op.args["boundaries"])
            )
        if op.outcome == "info":
            return [after]
        if op.outcome == "fail":
            return []
        return [after] if _status_matches(after, op.result["partitions"]) else []
    if op.op == "get":
        if op.outcome == "fail":
            return [state] if state is None and reason(op) == "NOT_FOUND" else []
        return [state] if state is not None and _status_matches(state, op.result["partitions"]) else []
    if op.op == "progress":
        if state is None:  # never marked: refused with NOT_FOUND
            return [state] if op.outcome == "info" or reason(op) == "NOT_FOUND" else []
        if op.outcome == "fail":
            return []
        positions = {(str(s), int(p)): int(o) for s, p, o in op.args["positions"]}
        parts: list[Part] = []
        finished: list[list[Any]] = []
        for stream, partition, boundary, position, done in state:
            at = positions.get((stream, partition))
            if at is not None:
                position = max(position, at)
                if not done and position >= boundary:
                    done = True
                    finished.append([stream, partition, at])
            parts.append((stream, partition, boundary, position, done))
        after = tuple(parts)
        if op.outcome == "info":
            return [after]
        newly = sorted([str(s), int(p), int(o)] for s, p, o in op.result["newly_finished"])
        if [f[:2] for f in newly] != [f[:2] for f in sorted(finished)]:
            return []
        processing = not all(p[4] for p in after)
        return [after] if op.result["processing_backlog"] == processing else []
    raise ValueError(f"no backlog operation {op.op!r}")


def models(margin_s: float) -> dict[str, KeyModel]:
    """The model of each key kind; ``margin_s`` is the cluster's ``--max-clock-skew``."""
    return {
        "producer": KeyModel(None, producer_step),
        "snapshot": KeyModel(SNAP_INIT, snapshot_step),
        "lease": lease_model(int(margin_s * 1e9)),
        "backlog": KeyModel(None, backlog_step),
    }
