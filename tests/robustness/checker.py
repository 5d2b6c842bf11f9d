"""Check a recorded history: direct invariants plus (per key) a search for a linearization.

``check(history, final_state_reader)`` returns a ``Report``; ``Report.ok`` is False when any
anomaly was found or a key's search hit its limit (reported as ``unknown``, never as a pass).
Each ``Anomaly`` names its key, its kind and the operations involved.

``final_state_reader`` (optional) is called with the run's history after the run and returns a
history of reads of the final state (recorded with ``History.call`` like any operation); those
reads start after every operation of the run returned, so a write acknowledged in the run that
they do not see is a lost acknowledged write.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from robustness.history import History, Op
from robustness.model import INF, READS, KeyModel, models

FinalStateReader = Callable[[History], History]

#: Anomaly kinds.
NOT_LINEARIZABLE = "not-linearizable"
LOST_WRITE = "lost-acknowledged-write"
DOUBLE_WINNER = "double-winner"
RESURRECTED_LEASE = "resurrected-lease"
DELETED_WHILE_LEASED = "snapshot-deleted-while-leased"
STALE_READ = "stale-read"
UNKNOWN = "unknown-search-limit"
BAD_CODE = "bad-code"
BAD = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS"})

KINDS = (
    NOT_LINEARIZABLE,
    LOST_WRITE,
    DOUBLE_WINNER,
    RESURRECTED_LEASE,
    DELETED_WHILE_LEASED,
    STALE_READ,
    UNKNOWN,
    BAD_CODE,
)


@dataclass(frozen=True)
class Anomaly:
    key: str
    kind: str
    message: str
    ops: tuple[Op, ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.kind} on {self.key}: {self.message}"]
        lines += [f"    {o.describe()}" for o in self.ops[:12]]
        if len(self.ops) > 12:
            lines.append(f"    ... and {len(self.ops) - 12} more operations")
        return "\n".join(lines)


@dataclass(frozen=True)
class Report:
    ops: int
    keys: int
    anomalies: tuple[Anomaly, ...] = ()
    #: Per anomaly kind, how many.
    counts: dict[str, int] = field(default_factory=dict, hash=False)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def kinds(self) -> set[str]:
        return {a.kind for a in self.anomalies}

    def __str__(self) -> str:
        head = f"{self.ops} operations on {self.keys} keys: "
        if self.ok:
            return head + "no anomaly"
        return (
            head
            + f"{len(self.anomalies)} anomalies {self.counts}\n"
            + "\n".join(str(a) for a in self.anomalies[:20])
        )


#: Most search steps per key before the key is reported as ``unknown`` (never as a pass).
SEARCH_LIMIT = 2_000_000


def check(
    history: History,
    final_state_reader: FinalStateReader | None = None,
    *,
    margin_s: float = 1.0,
    search_limit: int = SEARCH_LIMIT,
) -> Report:
    """Every anomaly of ``history`` (and of the final reads, when a reader is given).

    ``margin_s`` is the cluster's ``--max-clock-skew``: the slack of every lease expiry bound.
    """
    run = expand(history.snapshot())
    final = expand(final_state_reader(history).snapshot()) if final_state_reader is not None else []
    everything = run + final
    kinds = models(margin_s)
    anomalies: list[Anomaly] = []
    anomalies += bad_codes(everything)
    anomalies += double_winners(everything)
    anomalies += resurrected_leases(everything, int(margin_s * 1e9))
    anomalies += deleted_while_leased(everything, int(margin_s * 1e9))
    anomalies += stale_generations(everything)
    run_by_key = group(run)
    final_by_key = group(final)
    for key in sorted(set(run_by_key) | set(final_by_key)):
        model = kinds.get(key.split("/", 1)[0])
        if model is None:
            raise ValueError(f"no model for key {key!r}")
        ops = run_by_key.get(key, [])
        verdict = linearize(ops, model, search_limit)
        if verdict.ok and key in final_by_key:
            with_final = linearize(ops + final_by_key[key], model, search_limit)
            if with_final.ok is False:
                anomalies.append(
                    Anomaly(
                        key,
                        LOST_WRITE,
                        "the final read contradicts every linearization of the run",
                        with_final.ops,
                    )
                )
            elif with_final.ok is None:
                anomalies.append(Anomaly(key, UNKNOWN, with_final.message, with_final.ops))
        elif verdict.ok is None:
            anomalies.append(Anomaly(key, UNKNOWN, verdict.message, verdict.ops))
        elif not verdict.ok:
            blocked = verdict.ops[0]
            kind = STALE_READ if blocked.op in READS and blocked.outcome == "ok" else NOT_LINEARIZABLE
            anomalies.append(Anomaly(key, kind, verdict.message, verdict.ops))
    counts: dict[str, int] = {}
    for a in anomalies:
        counts[a.kind] = counts.get(a.kind, 0) + 1
    return Report(len(everything), len({o.key for o in everything}), tuple(anomalies), counts)


def expand(ops: Sequence[Op]) -> list[Op]:
    """``ops`` with each advance also recorded on its previous id (as ``advance_prev``), so that
    the per-key checks see the delete it makes there."""
    out: list[Op] = []
    for o in ops:
        out.append(o)
        if o.op == "advance" and o.outcome != "fail":
            result = {"deleted": o.result["previous_deleted"]} if o.outcome == "ok" else o.result
            out.append(replace(o, op="advance_prev", key=o.args["previous"], result=result))
    return out


def group(ops: Sequence[Op]) -> dict[str, list[Op]]:
    by_key: dict[str, list[Op]] = {}
    for o in sorted(ops, key=lambda o: o.invoke_ns):
        by_key.setdefault(o.key, []).append(o)
    return by_key


@dataclass(frozen=True)
class Verdict:
    ok: bool | None  # None: the search hit its limit
    message: str = ""
    ops: tuple[Op, ...] = ()


@dataclass
class _Entry:
    op: int
    call: bool
    prev: _Entry | None = None
    next: _Entry | None = None
    match: _Entry | None = None  # a call's return entry


def linearize(ops: Sequence[Op], model: KeyModel, limit: int = SEARCH_LIMIT) -> Verdict:
    """Search for a linearization of one key's ``ops`` (Wing & Gong, with Lowe's memoization of
    (linearized set, state set)); the model's nondeterminism is handled by carrying the set of
    states it may be in. Info ops never return (they may take effect at any time after their
    invoke, or never) and info reads are left out (they constrain nothing)."""
    ops = [o for o in ops if not (o.outcome == "info" and o.op in READS)]
    if not ops:
        return Verdict(True)
    events: list[tuple[int, int, int]] = []
    for i, o in enumerate(ops):
        events.append((o.invoke_ns, 0, i))
        events.append((INF if o.outcome == "info" else o.return_ns, 1, i))
    events.sort()
    head = _Entry(-1, True)  # sentinel
    calls: dict[int, _Entry] = {}
    last = head
    for _, kind, i in events:
        e = _Entry(i, kind == 0, prev=last)
        last.next = e
        last = e
        if kind == 0:
            calls[i] = e
        else:
            calls[i].match = e
    states: frozenset[Any] = frozenset([model.init])
    linearized = 0
    cache: set[tuple[int, frozenset[Any]]] = set()
    stack: list[tuple[_Entry, frozenset[Any], int]] = []
    deepest: tuple[int, int] = (-1, -1)
    steps = 0
    entry = head.next
    while head.next is not None:
        steps += 1
        if steps > limit:
            return Verdict(None, f"search limit of {limit} steps reached over {len(ops)} operations", ())
        assert entry is not None
        o = ops[entry.op]
        if entry.call:
            after = frozenset(s for state in states for s in model.step(state, o))
            lin = linearized | (1 << entry.op)
            if after and (lin, after) not in cache:
                cache.add((lin, after))
                stack.append((entry, states, linearized))
                states, linearized = after, lin
                _lift(entry)
                entry = head.next
                continue
            entry = entry.next
            continue
        if o.outcome == "info":
            return Verdict(True)  # every op that returned is linearized; the rest may never happen
        depth = len(stack)
        if depth > deepest[0]:
            deepest = (depth, entry.op)
        if not stack:
            break
        entry, states, linearized = stack.pop()
        _unlift(entry)
        entry = entry.next
    if head.next is None:
        return Verdict(True)
    blocked = ops[deepest[1]]
    concurrent = [
        o
        for o in ops
        if o is not blocked and o.invoke_ns <= blocked.return_ns and o.return_ns >= blocked.invoke_ns
    ]
    before = [o for o in ops if o.return_ns < blocked.invoke_ns][-6:]
    return Verdict(
        False,
        f"no linearization: {blocked.op} #{blocked.index} cannot be placed (then: operations that "
        "precede it, and concurrent ones)",
        (blocked, *before, *concurrent[:10]),
    )


def _lift(e: _Entry) -> None:
    for x in (e, e.match):
        assert x is not None and x.prev is not None
        x.prev.next = x.next
        if x.next is not None:
            x.next.prev = x.prev


def _unlift(e: _Entry) -> None:
    for x in (e.match, e):
        assert x is not None and x.prev is not None
        x.prev.next = x
        if x.next is not None:
            x.next.prev = x


def bad_codes(ops: Sequence[Op]) -> list[Anomaly]:
    """Calls that ended INTERNAL (or UNKNOWN, DATA_LOSS): a bug or corrupted data on the server."""
    bad = [
        o for o in ops if o.outcome == "info" and isinstance(o.result, dict) and o.result.get("code") in BAD
    ]
    found: dict[str, list[Op]] = {}
    for o in bad:
        found.setdefault(o.key, []).append(o)
    return [
        Anomaly(key, BAD_CODE, f"{len(g)} calls ended {g[0].result['code']}", tuple(g))
        for key, g in found.items()
    ]


def _overlaps(o: Op, start_ns: int, end_ns: int) -> bool:
    """Whether ``o`` may have taken effect within [start_ns, end_ns] (info: any time after invoke)."""
    if o.outcome == "info":
        return o.invoke_ns <= end_ns
    return o.invoke_ns <= end_ns and o.return_ns >= start_ns


def double_winners(ops: Sequence[Op]) -> list[Anomaly]:
    """Two acknowledged winners of one create-if-absent with nothing that could have removed the
    first in between; two reports that both finished one backlog partition."""
    found: list[Anomaly] = []
    by_key: dict[str, list[Op]] = {}
    for o in sorted(ops, key=lambda o: o.invoke_ns):
        by_key.setdefault(o.key, []).append(o)
    for key, group in by_key.items():
        if key.startswith("producer/"):
            winners = [
                o
                for o in group
                if o.op in ("register", "advance") and o.outcome == "ok" and o.result["registered"]
            ]
            removers = [o for o in ops if _may_remove_producer(o, key)]
            for first, second in itertools.pairwise(winners):
                # Ordered by invoke, the pair may still take effect the other way round (the first
                # can be the longer one): a remover anywhere within either's span can separate them.
                end = max(first.return_ns, second.return_ns)
                between = [r for r in removers if _overlaps(r, first.invoke_ns, end)]
                if not between:
                    found.append(
                        Anomaly(
                            key,
                            DOUBLE_WINNER,
                            "two registrations both won with no delete between",
                            (first, second),
                        )
                    )
        elif key.startswith("backlog/"):
            finished: dict[tuple[str, int], list[Op]] = {}
            for o in group:
                if o.op == "progress" and o.outcome == "ok":
                    for stream, partition, _ in o.result["newly_finished"]:
                        finished.setdefault((stream, partition), []).append(o)
            for (stream, partition), winners in sorted(finished.items()):
                if len(winners) > 1:
                    found.append(
                        Anomaly(
                            key,
                            DOUBLE_WINNER,
                            f"partition {stream}/{partition} finished by {len(winners)} reports",
                            tuple(winners),
                        )
                    )
    return found


def _may_remove_producer(o: Op, key: str) -> bool:
    if o.outcome == "fail":
        return False
    if o.key == key and o.op == "delete":
        return o.outcome == "info" or bool(o.result["deleted"])
    if o.key == key and o.op == "advance_prev":
        return o.outcome == "info" or bool(o.result["deleted"])
    return False


def _duration_ns(o: Op) -> int:
    return int(o.args["duration_ms"]) * 1_000_000


def _hi(o: Op, margin_ns: int) -> int:
    """The latest time a lease acquired or renewed by ``o`` may be alive (info: for ever)."""
    return INF if o.outcome == "info" else o.return_ns + _duration_ns(o) + margin_ns


def _supports(p: Op, o: Op, drops: Sequence[Op], margin_ns: int) -> bool:
    """May the acquire or renewal ``p`` have kept the lease alive for ``o``?"""
    if p is o or p.invoke_ns >= o.return_ns or _hi(p, margin_ns) < o.invoke_ns:
        return False
    return not any(p.return_ns < d.invoke_ns and d.return_ns < o.invoke_ns for d in drops)


def resurrected_leases(ops: Sequence[Op], margin_ns: int) -> list[Anomaly]:
    """A renew, read or release that succeeded on a lease every acquire or renewal before it had
    certainly let expire (or that an acknowledged drop had ended)."""
    found: list[Anomaly] = []
    for key, group_ in group([o for o in ops if o.kind == "lease"]).items():
        writes = [o for o in group_ if o.op in ("acquire", "renew") and o.outcome != "fail"]
        drops = [o for o in group_ if o.op == "drop" and o.outcome == "ok"]
        for o in group_:
            if o.op not in ("renew", "get", "release") or o.outcome != "ok":
                continue

            if not any(_supports(p, o, drops, margin_ns) for p in writes):
                earlier = [p for p in writes if p.invoke_ns < o.return_ns][-2:]
                ended = [d for d in drops if d.return_ns < o.invoke_ns][-1:]
                found.append(
                    Anomaly(
                        key,
                        RESURRECTED_LEASE,
                        f"{o.op} succeeded after the lease had certainly expired or been dropped",
                        (o, *earlier, *ended),
                    )
                )
    return found


def _snapshot_ref(o: Op) -> tuple[str, int]:
    return o.key.split("/", 1)[1], int(
        o.args.get("generation", o.result.get("generation", 0) if o.result else 0)
    )


def deleted_while_leased(ops: Sequence[Op], margin_ns: int) -> list[Anomaly]:
    """A snapshot deleted (by DeleteSnapshot, or found gone by a read after it was seen) while an
    acknowledged acquire or renewal certainly kept it pinned, with no release or drop of it in between."""
    present: dict[tuple[str, int], list[Op]] = {}
    deletions: list[tuple[tuple[str, int], int, int, Op]] = []  # (ref, after ns, before ns, evidence)
    snaps = sorted((o for o in ops if o.kind == "snapshot"), key=lambda o: o.invoke_ns)
    for o in snaps:
        if o.outcome == "ok" and o.op in ("get", "create", "report", "abort"):
            present.setdefault((o.key.split("/", 1)[1], int(o.result["generation"])), []).append(o)
    for o in snaps:
        ref = _snapshot_ref(o)
        if o.op == "delete" and o.outcome == "ok" and o.result["deleted"]:
            deletions.append((ref, o.invoke_ns, o.return_ns, o))
        elif o.op == "get" and o.outcome == "fail" and o.result.get("reason") == "NOT_FOUND":
            seen = [p.invoke_ns for p in present.get(ref, []) if p.invoke_ns < o.return_ns]
            if seen:
                deletions.append((ref, max(seen), o.return_ns, o))
    found: list[Anomaly] = []
    leases = group([o for o in ops if o.kind == "lease"])
    for ref, after, before, evidence in deletions:
        for key, group_ in leases.items():
            for a in group_:
                if a.op not in ("acquire", "renew") or a.outcome != "ok":
                    continue
                if [ref[0], ref[1]] not in a.result["snapshots"]:
                    continue
                if not (after >= a.return_ns and before <= a.invoke_ns + _duration_ns(a) - margin_ns):
                    continue
                unpinned = [
                    u
                    for u in group_
                    if u.outcome != "fail"
                    and (u.op == "drop" or (u.op == "release" and [ref[0], ref[1]] in u.args["snapshots"]))
                    and u.invoke_ns < before
                    and (u.outcome == "info" or u.return_ns > a.invoke_ns)
                ]
                if not unpinned:
                    found.append(
                        Anomaly(
                            f"snapshot/{ref[0]}",
                            DELETED_WHILE_LEASED,
                            f"generation {ref[1]} deleted while {key} certainly pinned it",
                            (evidence, a),
                        )
                    )
                    break
    return found


def stale_generations(ops: Sequence[Op]) -> list[Anomaly]:
    """A consistent GetCurrentSnapshot that answered a generation older than one a create or
    another current read had already answered before it was invoked (generations only grow)."""
    found: list[Anomaly] = []
    for key, group_ in group([o for o in ops if o.kind == "snapshot"]).items():
        seen = [o for o in group_ if o.outcome == "ok" and o.op in ("create", "current")]
        for o in seen:
            if o.op != "current":
                continue
            newer = [
                x
                for x in seen
                if x.return_ns < o.invoke_ns and x.result["generation"] > o.result["generation"]
            ]
            if newer:
                found.append(
                    Anomaly(
                        key,
                        STALE_READ,
                        f"current generation {o.result['generation']} read after generation "
                        f"{newer[-1].result['generation']} was answered",
                        (o, newer[-1]),
                    )
                )
    return found
