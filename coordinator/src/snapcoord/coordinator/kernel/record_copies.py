"""A process's copies of metadata records it last committed or read, so that a call on one of them
can skip reading it first: the copy goes to the commit kernel as ``assume``, a guess that the
commit's version check verifies. Used for lease records (``leases.cache`` says why a stale copy
is harmless there) and for snapshot apps' pointers (``SnapshotRegistry.create``).
"""

from __future__ import annotations

from collections.abc import Sequence

from snapcoord.coordinator.domain.lru import Lru
from snapcoord.coordinator.kernel.decision import Commit
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
        self._nodes: Lru[str, Node] = Lru(capacity)

    def get(self, path: str) -> Node | None:
        return self._nodes.get(path)

    def forget(self, path: str) -> None:
        self._nodes.pop(path)

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
        # Two calls on one record may finish out of order, leaving the older copy here: harmless
        # (its commit fails, and the call reads), only one round trip more.
        self._nodes.put(path, node)

    def __len__(self) -> int:
        return len(self._nodes)
