"""Keeping this process's copies of producer records true to the calls it makes on them.

An advance whose previous record this process committed (or read) last commits without reading it
first (``ProducerRegistry.advance`` says why that is safe): that needs, after every call on a
record, the record as the call left it, or no copy at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

from snapcoord.coordinator.kernel.decision import Commit, Decide, Decision, Reads
from snapcoord.coordinator.kernel.record_copies import RecordCache

R = TypeVar("R")


class CallCopies:
    """One kernel call on ``paths``: ``track`` wraps its ``decide`` to note the last decision and
    the reads it was made on. On a normal exit each path's copy becomes what that decision left
    there: what its commit wrote (none if it deleted the record), else the node as read. On an
    error every copy of ``paths`` is dropped (a commit may have landed unseen).

    ``assume`` is what the call's first round took as read: it is never kept as read (only a
    landed commit verifies it, and then what the commit wrote is kept). A node read from a
    ZooKeeper server behind the leader may be stale; that is harmless, as every use of a copy goes
    into a commit that verifies it.
    """

    def __init__(self, cache: RecordCache, paths: Sequence[str], assume: Reads | None) -> None:
        self._cache = cache
        self._paths = paths
        self._assume = assume
        self._last: tuple[Decision[Any], Reads] | None = None

    def track(self, decide: Decide[R]) -> Decide[R]:
        def tracked(reads: Reads, pending: Commit[R] | None) -> Decision[R]:
            decision = decide(reads, pending)
            self._last = (decision, reads)
            return decision

        return tracked

    def __enter__(self) -> CallCopies:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        last, self._last = self._last, None
        if kind is not None or last is None:
            for path in self._paths:
                self._cache.forget(path)
            return
        decision, reads = last
        written = {op.path for op in decision.ops} if isinstance(decision, Commit) else set()
        for path in self._paths:
            node = reads.node(path)
            if path in written:
                self._cache.committed(path, decision)
            elif node is not None and reads is not self._assume:
                self._cache.remember(path, node)
            else:
                self._cache.forget(path)
