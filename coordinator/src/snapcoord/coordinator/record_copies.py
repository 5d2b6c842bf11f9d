"""A process's copies of metadata records it last committed or read, so that a call on one of them
can skip reading it first: the copy goes to the commit kernel as ``assume``, a guess that the
commit's version check verifies. Used for lease records (``leases.cache`` says why a stale copy
is harmless there) and for snapshot apps' pointers (``SnapshotRegistry.create``).
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
    """Record path -> the node this process last committed (or read) there (thread-safe, bounded)."""

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
        if node is None:
            self.forget(path)
        else:
            self.remember(path, node)

    def remember(self, path: str, node: Node) -> None:
        """Keep ``node`` as the copy of ``path`` (as committed, or as read)."""
        with self._lock:
            # Two calls on one record may finish out of order, leaving the older copy here:
            # harmless (its commit fails, and the call reads), only one round trip more.
            self._nodes[path] = node
            self._nodes.move_to_end(path)
            while len(self._nodes) > self._capacity:
                self._nodes.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)
