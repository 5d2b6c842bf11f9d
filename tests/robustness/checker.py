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
from dataclasses import dataclass, field

from robustness.history import History, Op

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


def check(history: History, final_state_reader: FinalStateReader | None = None) -> Report:
    """Every anomaly of ``history`` (and of the final reads, when a reader is given)."""
    ops = history.snapshot()
    if final_state_reader is not None:
        ops = History.merge([history, final_state_reader(history)]).snapshot()
    anomalies: list[Anomaly] = []
    anomalies += double_winners(ops)
    counts: dict[str, int] = {}
    for a in anomalies:
        counts[a.kind] = counts.get(a.kind, 0) + 1
    return Report(len(ops), len({o.key for o in ops}), tuple(anomalies), counts)


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
                between = [r for r in removers if _overlaps(r, first.invoke_ns, second.return_ns)]
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
    if o.op == "advance" and o.args.get("previous") == key:
        return o.outcome == "info" or bool(o.result["previous_deleted"])
    return False
