"""What a registry operation tells the commit kernel, as plain data: the pure half of the kernel.

A registry operation names what to read (``ReadNode``, ``ReadChildren``) and supplies
``decide(reads, pending) -> Done | Commit | More``:

- ``Done(result)``: nothing to write (the answer is already stored, or the request is refused by
  raising a ``SnapcoordError`` from ``decide``);
- ``Commit(ops, result)``: one all-or-nothing transaction, with the payload objects to upload
  first (``uploads``), the objects it unreferences (``cleanup``), the expiry-index buckets and
  layout paths its creates need;
- ``More(reads)``: reads that depend on what was read (a lease's pins), issued together.

These types live apart from ``commit`` (the loop, its thread pool, its metrics) so that the
aggregates' ``decide`` modules, and their tests, load only data types and the store's operations.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from snapcoord.coordinator.storage.metadata import Node, Op

R = TypeVar("R")


@dataclass(frozen=True)
class ReadNode:
    """Read the node at ``path`` (None when absent)."""

    path: str


@dataclass(frozen=True)
class ReadChildren:
    """List the children of ``path`` (empty when absent)."""

    path: str


Read = ReadNode | ReadChildren


@dataclass(frozen=True)
class Reads:
    """What the kernel read for one decision. Asking for something not read is a bug (KeyError)."""

    nodes: Mapping[str, Node | None] = field(default_factory=dict)
    lists: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def node(self, path: str) -> Node | None:
        return self.nodes[path]

    def children(self, path: str) -> tuple[str, ...]:
        return self.lists[path]

    def has(self, read: Read) -> bool:
        return read.path in (self.nodes if isinstance(read, ReadNode) else self.lists)

    def merged(self, other: Reads) -> Reads:
        return Reads({**self.nodes, **other.nodes}, {**self.lists, **other.lists})


@dataclass(frozen=True)
class Done(Generic[R]):
    """Nothing to write. ``keep``: uploaded objects the stored state references (an earlier commit
    of this call landed); ``cleanup``: objects to delete now (what that commit unreferenced), and
    ``withdraw`` the intents that commit made for them."""

    result: R
    keep: Collection[str] = frozenset()
    cleanup: Sequence[str] = ()
    withdraw: Sequence[str] = ()


@dataclass(frozen=True)
class Commit(Generic[R]):
    """One transaction and what it needs around it.

    ``uploads`` are put before the commit (payload first: once the record commits, its object
    exists); an upload of an earlier round is not put again. ``cleanup`` names objects the commit
    unreferences, deleted once it landed; ``withdraw``, the intents ``ops`` make for them
    (``intents.doom``), removed once every one of them is deleted. ``buckets`` are ``(index root,
    due_ms)`` pairs whose bucket a ``Create`` in ``ops`` needs; ``ensure`` are parent paths it
    needs (made once).
    """

    ops: Sequence[Op]
    result: R
    uploads: Mapping[str, bytes] = field(default_factory=dict)
    cleanup: Sequence[str] = ()
    withdraw: Sequence[str] = ()
    buckets: Sequence[tuple[str, int]] = ()
    ensure: Sequence[str] = ()


@dataclass(frozen=True)
class More:
    """Read these as well (together), then decide again with everything read so far."""

    reads: Sequence[Read]


Decision = Done[R] | Commit[R] | More
#: ``decide(reads, pending)``; ``pending`` is this call's last commit when its outcome is unknown.
Decide = Callable[[Reads, "Commit[R] | None"], Decision[R]]


def landed(pending: Commit[R]) -> Done[R]:
    """The answer when the reads show that ``pending`` (a commit in doubt) was applied."""
    return Done(
        pending.result, keep=frozenset(pending.uploads), cleanup=pending.cleanup, withdraw=pending.withdraw
    )
