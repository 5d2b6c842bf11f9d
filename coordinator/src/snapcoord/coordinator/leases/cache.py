"""This process's copy of the lease records it last wrote, so that a renew needs no read first.

A lease holder renews again and again through the same connection (so, with ``--processes N``,
the same process). After a commit that wrote a lease record, its data and new version are known
without a read: ``Create`` gives version 0, ``SetData`` at v gives v + 1. The next call on that
lease hands the copy to the commit kernel as ``assume`` (a guess the transaction verifies), so a
RenewLease of a lease without snapshots is one ZooKeeper transaction.

Why a stale copy is harmless: every rewrite of a record is version-checked and checks the
record's incarnation child (``decide.record_ops``). If anyone else wrote the record since (another
process, the janitor), or dropped it and acquired it again (versions restart at 0, the incarnation
does not come back), the transaction fails and the kernel reads and decides again. Only a copy
that is exactly the stored record commits. A copy never answers a refusal on its own: the
registry uses it only where ``decide`` refuses nothing on it (see ``LeaseRegistry._assumed``).

Pin indexes are not cached: one is shared by every lease holding its snapshot, and it is deleted
when empty and created again, so its version alone could match another life of it. They are read
(together, in one round) on every call that changes them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from snapcoord.coordinator.commit import Commit
from snapcoord.coordinator.storage.metadata import Create, Delete, Node, Op, SetData

#: Records kept (least recently used go first): a few hundred bytes each.
DEFAULT_CAPACITY = 65_536


def written(path: str, ops: Sequence[Op]) -> Node | None:
    """The node at ``path`` as ``ops`` leave it, when they leave a known version (None: unknown or
    deleted). Timestamps are not known without a read; lease decisions do not use them."""
    node: Node | None = None
    for op in ops:
        if op.path != path:
            continue
        if isinstance(op, Create):
            node = Node(op.data, 0, 0, 0)
        elif isinstance(op, SetData):
            node = Node(op.data, op.version + 1, 0, 0)
        elif isinstance(op, Delete):
            node = None
    return node


class RecordCache:
    """Lease record path -> the node this process last committed there (thread-safe, bounded)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._nodes: OrderedDict[str, Node] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str) -> Node | None:
        with self._lock:
            node = self._nodes.get(path)
            if node is not None:
                self._nodes.move_to_end(path)
            return node

    def forget(self, path: str) -> None:
        with self._lock:
            self._nodes.pop(path, None)

    def committed(self, path: str, decision: object) -> None:
        """Remember what the landed ``decision`` wrote at ``path``; forget the path when it was
        not a commit of ours (``Done``: e.g. a commit in doubt found landed, whose version is
        not ours to guess) or when it deleted the record."""
        node = written(path, decision.ops) if isinstance(decision, Commit) else None
        with self._lock:
            if node is None:
                self._nodes.pop(path, None)
                return
            # Two calls on one lease may finish out of order, leaving the older copy here: harmless
            # (its commit fails, and the call reads), only one round trip more.
            self._nodes[path] = node
            self._nodes.move_to_end(path)
            while len(self._nodes) > self._capacity:
                self._nodes.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)
