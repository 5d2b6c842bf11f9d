"""The metadata store interface: a small ZooKeeper-shaped tree with versioned nodes.

Semantics every implementation keeps (the contract suite in tests/ checks them on each backend):

- Paths are absolute, ``/``-separated, relative to the store's root (a ZooKeeper chroot, or the
  embedded database); the root ``/`` always exists and cannot be written or deleted.
- A node has ``data`` (bytes, at most ``MAX_NODE_BYTES``) and a ``version`` that starts at 0 on
  create and grows by 1 on each set. Creating needs the parent to exist (unless
  ``make_parents``); deleting needs the node to have no children.
- Larger data raises ``InvalidArgument``; so does a transaction whose data add up to more than
  ``MAX_NODE_BYTES``, since ZooKeeper bounds a whole request, not each node in it.
- Every conditional write is a compare-and-set on the version; ``transaction`` applies a list of
  operations all-or-nothing.
- When the backend cannot be reached, operations raise ``StoreUnavailable`` (never a silent
  success); when a write's outcome cannot be told after a connection loss they raise
  ``CommitOutcomeUnknown`` and the caller re-reads.
- ``election(name, ...)`` contenders of one name lead one at a time among all the store's
  clients (``storage.election``); closing the store ends their ``run``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from snapcoord.coordinator.storage.election import Election

#: ZooKeeper's default jute.maxbuffer is 1 MiB per node; stay clearly below it.
MAX_NODE_BYTES = 1_000_000


@dataclass(frozen=True)
class Node:
    """A node's data and the version to pass to a compare-and-set."""

    data: bytes
    version: int
    created_ms: int
    modified_ms: int


@dataclass(frozen=True)
class Create:
    """Create ``path`` with ``data``; fails with ``NodeExistsError`` if it exists."""

    path: str
    data: bytes


@dataclass(frozen=True)
class SetData:
    """Replace the data of ``path`` if its version is still ``version``."""

    path: str
    data: bytes
    version: int


@dataclass(frozen=True)
class Delete:
    """Delete ``path`` if its version is still ``version`` (``None``: any version)."""

    path: str
    version: int | None


@dataclass(frozen=True)
class Check:
    """Fail the transaction unless ``path`` exists at ``version``."""

    path: str
    version: int


Op = Create | SetData | Delete | Check

#: Called with the path whose data changed, was created or deleted, or with the watched path when
#: events may have been missed (after a reconnect): treat every call as "re-read this".
WatchCallback = Callable[[str], None]

#: Called with True when the store becomes usable and False when it stops being usable.
StateListener = Callable[[bool], None]


class MetadataStore(abc.ABC):
    """A versioned tree of small nodes: the coordinator's commit point."""

    #: The URI the store was opened with, without credentials; safe to log.
    uri: str

    @abc.abstractmethod
    def get(self, path: str) -> Node | None:
        """The node at ``path``, or None when there is none."""

    def get_many(self, paths: Sequence[str]) -> dict[str, Node | None]:
        """``get`` of every path in ``paths``, issued together (one round trip's latency on
        ZooKeeper, not one per path); each read is consistent on its own, not as a set.

        This default reads one after another; the backends override it.
        """
        return {path: self.get(path) for path in paths}

    def synced_get_many(self, sync_path: str, paths: Sequence[str]) -> dict[str, Node | None]:
        """``sync(sync_path)``, then ``get_many(paths)``: reads that see every write committed
        before this call. This default does one after the other; ZooKeeper sends them together.
        """
        self.sync(sync_path)
        return self.get_many(paths)

    def watch_and_get_many(
        self, watches: Sequence[tuple[str, WatchCallback]], paths: Sequence[str]
    ) -> tuple[list[Callable[[], None]], dict[str, Node | None]]:
        """``watch`` each (path, callback), then ``get_many(paths)``: the watches are armed before
        the reads, so a change after a read is never missed. Returns the cancel functions (in
        ``watches`` order) and the nodes. This default does one after the other; ZooKeeper sends
        every request together (one round trip), in the order that keeps that promise.
        """
        cancels: list[Callable[[], None]] = []
        try:
            for path, callback in watches:
                cancels.append(self.watch(path, callback))
            return cancels, self.get_many(paths)
        except BaseException:
            for cancel in cancels:
                cancel()
            raise

    def create_and_get_many(self, path: str, data: bytes, paths: Sequence[str]) -> dict[str, Node | None]:
        """``create(path, data)``, then ``get_many(paths)``, in one round trip on ZooKeeper (the
        create is sent first, the reads right behind it). Returns only once the create is
        acknowledged; raises as ``create`` does (then nothing was created, and no reads are
        returned). For a call that must announce something before its next step and has reads
        to make anyway (an upload intent, created before any of its objects is put).

        This default does one after the other; ZooKeeper pipelines them.
        """
        self.create(path, data)
        return self.get_many(paths)

    @abc.abstractmethod
    def create(self, path: str, data: bytes, *, make_parents: bool = False) -> Node:
        """Create ``path``; ``NodeExistsError`` if it exists, ``NoNodeError`` if the parent does not
        (unless ``make_parents``, which creates missing ancestors with empty data)."""

    @abc.abstractmethod
    def set(self, path: str, data: bytes, *, version: int) -> Node:
        """Compare-and-set: ``BadVersionError`` unless ``path`` is at ``version``; ``NoNodeError``
        if it is gone. Returns the node as written."""

    @abc.abstractmethod
    def delete(self, path: str, *, version: int | None = None) -> None:
        """Delete ``path`` (at ``version``, if given); ``NoNodeError`` if it is gone,
        ``BadVersionError`` on a version mismatch, ``NotEmptyError`` if it has children."""

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """Names (not paths) of the children of ``path``, sorted; empty when ``path`` is absent."""

    @abc.abstractmethod
    def transaction(self, ops: Sequence[Op]) -> None:
        """Apply ``ops`` in order, all or nothing; ``TransactionFailed`` names the first failing op.

        Unlike ``create``, a ``Create`` here never makes parents: put them earlier in ``ops``.
        """

    @abc.abstractmethod
    def sync(self, path: str = "/") -> None:
        """Make the next reads on this store see every write committed before this call."""

    @abc.abstractmethod
    def watch(self, path: str, callback: WatchCallback) -> Callable[[], None]:
        """Call ``callback`` from a background thread whenever ``path`` changes; returns a function
        that cancels the watch. Callbacks must be quick and must not raise."""

    @abc.abstractmethod
    def is_usable(self) -> bool:
        """True while operations can be expected to succeed (connected, session valid)."""

    @abc.abstractmethod
    def add_state_listener(self, listener: StateListener) -> None:
        """Call ``listener(usable)`` on every change of ``is_usable()``."""

    @abc.abstractmethod
    def election(self, name: str, identifier: str) -> Election:
        """A new contender in election ``name`` (one short word, e.g. ``"janitor"``).

        ``identifier`` says who this replica is (e.g. ``"host:pid"``); ZooKeeper stores it in the
        contender's node so that operators can see who leads. Closing the store ends every
        election's ``run``. ``ValueError`` for a malformed name.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection or files; the store is unusable afterwards. Idempotent."""

    def ensure_path(self, path: str) -> None:
        """Create ``path`` and its ancestors with empty data where they are missing."""
        if self.get(path) is not None:
            return
        try:
            self.create(path, b"", make_parents=True)
        except Exception as e:
            from snapcoord.coordinator.errors import NodeExistsError

            if not isinstance(e, NodeExistsError):
                raise


def parent_of(path: str) -> str:
    """The parent path of ``path`` (``/`` for a top-level node)."""
    head = path.rstrip("/").rsplit("/", 1)[0]
    return head or "/"


def validate_path(path: str) -> str:
    """Return ``path`` normalised, or raise ``ValueError`` for a malformed one.

    This guards programming errors, not user input: identifiers are validated in the domain.
    """
    if not path.startswith("/"):
        raise ValueError(f"metadata path must be absolute: {path!r}")
    if path != "/" and path.endswith("/"):
        path = path.rstrip("/")
    parts = path.split("/")[1:]
    if path != "/" and any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"malformed metadata path: {path!r}")
    return path


def check_size(data: bytes) -> None:
    """Raise ``InvalidArgument`` for node data over ``MAX_NODE_BYTES`` (ZooKeeper would refuse it)."""
    from snapcoord.coordinator.errors import InvalidArgument

    if len(data) > MAX_NODE_BYTES:
        raise InvalidArgument(f"node data of {len(data)} bytes exceeds the limit of {MAX_NODE_BYTES}")


def check_writable(path: str) -> str:
    """``validate_path`` for writes: the root node is never written or deleted."""
    path = validate_path(path)
    if path == "/":
        raise ValueError("the root node cannot be written or deleted")
    return path
