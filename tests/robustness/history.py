"""A thread-safe record of client operations: what was called, when, and how it ended.

Every operation is recorded with its invoke and return times (``time.monotonic_ns``, one clock for
every process on the machine, so histories written by several processes merge onto one time line),
its outcome and its result:

- ``ok``: the call returned; ``result`` is what it returned, as plain JSON values;
- ``fail``: the coordinator refused it precisely (a status that means "not applied": NOT_FOUND,
  FAILED_PRECONDITION and its reasons, INVALID_ARGUMENT, ABORTED...); ``result`` holds the code,
  reason and metadata, because a refusal is an answer the model checks like any other;
- ``info``: the outcome is unknown (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, INTERNAL, or a
  refusal that came after a retry, whose first attempt may have been applied): the operation may
  have taken effect at any time after its invoke, or never.

Histories are dumped as JSON lines, one operation per line, and loaded back, so a workload run in a
subprocess (in a network namespace, under faketime) hands its history to the checker.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from snapcoord.client import SnapcoordError

Outcome = Literal["ok", "fail", "info"]

#: Status codes after which the call may or may not have been applied.
UNKNOWN_CODES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "INTERNAL", "UNKNOWN", "DATA_LOSS"}
)


def outcome_of(error: SnapcoordError) -> Outcome:
    """``fail`` when ``error`` proves the call was not applied, ``info`` when it may have been.

    A precise refusal after more than one attempt is ``info``: an earlier attempt that ended with
    UNAVAILABLE may have been applied before the refusal (a renewal applied, then EXPIRED).
    """
    if error.code in UNKNOWN_CODES or error.attempts > 1:
        return "info"
    return "fail"


def error_result(error: SnapcoordError) -> dict[str, Any]:
    """What a refused call answered: code, reason and metadata (the model reads them)."""
    return {"code": error.code, "reason": error.reason or error.code, "metadata": dict(error.metadata)}


@dataclass(frozen=True)
class Op:
    """One client operation. ``key`` names the record it works on (``kind/id``, e.g.
    ``producer/p1``); ``args`` and ``result`` are plain JSON values."""

    index: int
    process: str
    op: str
    key: str
    args: dict[str, Any]
    invoke_ns: int
    return_ns: int
    outcome: Outcome
    result: Any = None
    #: Wall clock (ms since the epoch) at invoke and return, to compare with server times.
    invoke_ms: int = 0
    return_ms: int = 0
    error: str = ""
    attempts: int = 1

    @property
    def kind(self) -> str:
        """The record kind: the part of ``key`` before the first ``/``."""
        return self.key.split("/", 1)[0]

    def describe(self) -> str:
        """One printable line: who did what to which key, when, and how it ended."""
        span = f"[{self.invoke_ns / 1e9:.3f}s..{self.return_ns / 1e9:.3f}s]"
        return (
            f"#{self.index} {self.process} {self.op}({self.key}, {json.dumps(self.args, sort_keys=True)}) "
            f"{span} -> {self.outcome} {json.dumps(self.result, sort_keys=True)}"
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> Op:
        return Op(**json.loads(line))


@dataclass
class History:
    """Operations recorded by many threads; ``call`` is the one way to record one."""

    ops: list[Op] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def call(self, process: str | int, op: str, key: str, args: dict[str, Any], fn: Callable[[], Any]) -> Any:
        """Run ``fn`` and record it; return its result, or re-raise what it raised.

        ``fn`` returns the result to record as plain JSON values (convert the client's dataclasses
        inside it). A ``SnapcoordError`` is recorded as ``fail`` or ``info`` (``outcome_of``) and
        raised again; any other exception is recorded as ``info`` (nobody knows what the call did)
        and raised again.
        """
        invoke_ms, invoke_ns = int(time.time() * 1000), time.monotonic_ns()
        outcome: Outcome = "ok"
        result: Any = None
        error = ""
        attempts = 1
        try:
            result = fn()
            return result
        except SnapcoordError as e:
            outcome, result, error, attempts = outcome_of(e), error_result(e), str(e)[:300], e.attempts
            raise
        except BaseException as e:
            outcome, error = "info", f"{type(e).__name__}: {e}"[:300]
            raise
        finally:
            return_ns, return_ms = time.monotonic_ns(), int(time.time() * 1000)
            with self._lock:
                self.ops.append(
                    Op(
                        len(self.ops),
                        str(process),
                        op,
                        key,
                        args,
                        invoke_ns,
                        return_ns,
                        outcome,
                        result,
                        invoke_ms,
                        return_ms,
                        error,
                        attempts,
                    )
                )

    def snapshot(self) -> list[Op]:
        """A copy of the operations recorded so far."""
        with self._lock:
            return list(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self.ops)

    def by_key(self) -> dict[str, list[Op]]:
        """Operations grouped by key, each group in invoke order."""
        groups: dict[str, list[Op]] = {}
        for o in sorted(self.snapshot(), key=lambda o: o.invoke_ns):
            groups.setdefault(o.key, []).append(o)
        return groups

    def dump(self, path: Path | str) -> None:
        """Write every operation as one JSON line (replacing ``path``)."""
        Path(path).write_text("".join(o.to_json() + "\n" for o in self.snapshot()))

    @staticmethod
    def load(path: Path | str) -> History:
        """The history ``dump`` wrote (blank lines are skipped)."""
        lines = Path(path).read_text().splitlines()
        return History([Op.from_json(line) for line in lines if line.strip()])

    @staticmethod
    def merge(histories: Iterable[History]) -> History:
        """One history of several (from several processes), renumbered in invoke order.

        Process names must already be distinct (give each subprocess its own prefix).
        """
        ops = sorted((o for h in histories for o in h.snapshot()), key=lambda o: (o.invoke_ns, o.process))
        return History([replace(o, index=i) for i, o in enumerate(ops)])
