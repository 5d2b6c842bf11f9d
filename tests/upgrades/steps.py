"""What the clients of a recorded workload saw during each step of a rolling upgrade: calls made,
errors by status code, and the longest time a client thread went without a successful call.

``step_stats(history, marks)`` cuts the history at the marks (``(name, monotonic_ns)``, in order:
the step's name and when it began) and counts each operation in the step during which it was
invoked.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from robustness.history import History, Op

#: Codes a rolling upgrade must never produce: a bug, or a record one version cannot read.
FORBIDDEN_CODES = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS"})
#: Reasons of a record one version cannot read (whatever the code: releases answer it differently).
UNREADABLE_REASONS = frozenset({"CORRUPT_RECORD", "NEWER_FORMAT"})


@dataclass(frozen=True)
class StepStats:
    name: str
    calls: int
    #: Status code -> how many calls of the step ended with it (successful calls left out).
    errors: dict[str, int] = field(default_factory=dict)
    #: Longest stretch any client thread went without a successful call, in seconds.
    longest_gap_s: float = 0.0
    #: Calls refused for a stored record the answering replica could not read.
    unreadable: int = 0

    def line(self) -> str:
        errors = ", ".join(f"{code} {n}" for code, n in sorted(self.errors.items())) or "none"
        return (
            f"{self.name}: {self.calls} calls, errors {errors}, unreadable records {self.unreadable}, "
            f"longest gap {self.longest_gap_s:.1f}s"
        )

    def problems(self) -> list[str]:
        """What a compatible step must not show: forbidden codes, unreadable records."""
        found = [
            f"{self.name}: {n} calls ended {code}"
            for code, n in self.errors.items()
            if code in FORBIDDEN_CODES
        ]
        if self.unreadable:
            found.append(f"{self.name}: {self.unreadable} calls met a record the replica could not read")
        return found


def code_of(op: Op) -> str | None:
    """The status code an operation ended with; None for a success."""
    if op.outcome == "ok":
        return None
    if isinstance(op.result, dict) and "code" in op.result:
        return str(op.result["code"])
    return "NO_STATUS"  # an exception that was not the client's (the history keeps its text)


def step_stats(history: History, marks: Sequence[tuple[str, int]], end_ns: int) -> list[StepStats]:
    """One ``StepStats`` per mark, each over the operations invoked from its mark to the next
    (the last to ``end_ns``)."""
    bounds = [*(ns for _, ns in marks), end_ns]
    stats = []
    ops = history.snapshot()
    for k, (name, start) in enumerate(marks):
        stop = bounds[k + 1]
        window = [o for o in ops if start <= o.invoke_ns < stop]
        errors = Counter(code for o in window if (code := code_of(o)) is not None)
        unreadable = sum(
            1 for o in window if isinstance(o.result, dict) and o.result.get("reason") in UNREADABLE_REASONS
        )
        successes: dict[str, list[int]] = defaultdict(list)
        for o in window:
            if o.outcome == "ok":
                successes[o.process].append(o.return_ns)
        gap = 0
        for process in {o.process for o in window}:
            times = sorted([start, *successes[process], stop])
            gap = max(gap, *(b - a for a, b in itertools.pairwise(times)))
        stats.append(StepStats(name, len(window), dict(errors), gap / 1e9, unreadable))
    return stats


def balanced_seed(base: int, threads: int, replicas: int) -> int:
    """The first seed from ``base`` whose ``Workload`` threads spread evenly over ``replicas``
    targets (each thread keeps the target it draws at start, as ``Workload.start`` draws it), so
    that every replica of a mixed deployment carries load and reads what the others wrote."""
    for seed in itertools.count(base):
        master = random.Random(seed)
        drawn = Counter(random.Random(master.getrandbits(64)).randrange(replicas) for _ in range(threads))
        if len(drawn) == replicas and max(drawn.values()) - min(drawn.values()) <= 1:
            return seed
    raise AssertionError("unreachable")
