"""What the clients of a recorded workload saw during each step of a rolling upgrade: calls made,
errors by status code, and the longest time a client thread went without a successful call.

``step_stats(history, marks)`` cuts the history at the marks (``(name, monotonic_ns)``, in order:
the step's name and when it began) and counts each operation in the step during which it was
invoked.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from robustness.history import History, Op

#: Codes a rolling upgrade must never produce: a bug, or a record one version cannot read.
FORBIDDEN_CODES = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS"})


@dataclass(frozen=True)
class StepStats:
    name: str
    calls: int
    #: Status code -> how many calls of the step ended with it (successful calls left out).
    errors: dict[str, int] = field(default_factory=dict)
    #: Longest stretch any client thread went without a successful call, in seconds.
    longest_gap_s: float = 0.0

    def line(self) -> str:
        errors = ", ".join(f"{code} {n}" for code, n in sorted(self.errors.items())) or "none"
        return f"{self.name}: {self.calls} calls, errors {errors}, longest gap {self.longest_gap_s:.1f}s"


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
        successes: dict[str, list[int]] = defaultdict(list)
        for o in window:
            if o.outcome == "ok":
                successes[o.process].append(o.return_ns)
        gap = 0
        for process in {o.process for o in window}:
            times = sorted([start, *successes[process], stop])
            gap = max(gap, *(b - a for a, b in itertools.pairwise(times)))
        stats.append(StepStats(name, len(window), dict(errors), gap / 1e9))
    return stats
