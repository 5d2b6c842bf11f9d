"""This process's copies of open snapshots' headers and report counters, for ReportTaskSnapshot.

A report reads the snapshot's header (its state and task set) and its report counter, then commits
the task's node with the counter bumped and the header checked, both by version. When this process
created the snapshot or committed its last report, it knows both nodes as they are now; the report
then decides on those copies (the commit kernel's ``assume``) and skips the read: one ZooKeeper
request fewer, none at all besides the commit for an inline checkpoint, and the intent of a
payload bound for the blob store made in the request the read used to share.

A stale copy is harmless: whatever changed the header (a completion, an abort, a timeout, a
deletion) or the counter (a report through another process) changes its version, so the commit
fails and the kernel reads and decides again. Such a loss costs a round trip, so a snapshot whose
copy went stale once (reports to it arrive through several processes) is read first from then on.
Only a CREATED header is kept: a report to an ended snapshot needs the task's node and the app's
pointer, which copies do not hold.
"""

from __future__ import annotations

from collections.abc import Sequence

from snapcoord.coordinator.domain.lru import Lru
from snapcoord.coordinator.kernel.decision import Commit, Reads
from snapcoord.coordinator.kernel.record_copies import written
from snapcoord.coordinator.snapshots.layout import gen_path, tasks_path
from snapcoord.coordinator.storage.metadata import Check, Node, Op

#: Bytes of copies kept (headers weigh their task sets; least recently used go first).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Snapshots remembered as reported to through other processes too.
SHARED_MAX = 65_536
#: What an entry weighs beyond its nodes' bytes (paths, tuples, the nodes themselves).
ENTRY_OVERHEAD_BYTES = 200


class ReportCopies:
    """Header path -> (header node, counter node) as this process last committed them (thread-safe)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._copies: Lru[str, tuple[Node, Node]] = Lru(max_bytes)
        self._shared: Lru[str, bool] = Lru(SHARED_MAX)

    def assumed(self, app_id: str, generation: int) -> Reads | None:
        """The copies as the reads of a report's first round, or None: none kept, or shared."""
        header = gen_path(app_id, generation)
        pair = None if self._shared.get(header) else self._copies.get(header)
        if pair is None:
            return None
        return Reads({header: pair[0], tasks_path(app_id, generation): pair[1]})

    def created(self, app_id: str, generation: int, ops: Sequence[Op]) -> None:
        """A CreateSnapshot of this process landed ``ops``: keep the header and counter it made."""
        header, counter = gen_path(app_id, generation), tasks_path(app_id, generation)
        self._keep(header, written(header, ops), written(counter, ops))

    def reported(
        self, app_id: str, generation: int, reads: Reads, decision: object, copies: Reads | None
    ) -> None:
        """A report of this process returned after deciding ``decision`` on ``reads`` (its last
        round; ``copies``: what ``assumed`` gave its first). A copy that a later round read
        otherwise did not hold (the snapshot is reported to elsewhere too, or changed): forget it,
        and read first from now on."""
        header, counter = gen_path(app_id, generation), tasks_path(app_id, generation)
        if copies is not None and any(_version(reads, p) != _version(copies, p) for p in (header, counter)):
            self._shared.put(header, True)
            self._copies.pop(header)
            return
        if not isinstance(decision, Commit) or header not in reads.nodes:
            self._copies.pop(header)
            return
        # The header is checked (kept as read) unless the report completed the snapshot.
        checked = any(isinstance(op, Check) and op.path == header for op in decision.ops)
        self._keep(header, reads.node(header) if checked else None, written(counter, decision.ops))

    def forget(self, app_id: str, generation: int) -> None:
        self._copies.pop(gen_path(app_id, generation))

    def _keep(self, header: str, header_node: Node | None, counter_node: Node | None) -> None:
        if header_node is None or counter_node is None:
            self._copies.pop(header)
            return
        weight = len(header_node.data) + len(counter_node.data) + ENTRY_OVERHEAD_BYTES
        self._copies.put(header, (header_node, counter_node), weight)


def _version(reads: Reads, path: str) -> int | None:
    node = reads.nodes.get(path)
    return node.version if node is not None else None
