"""Embedded metadata store: the ZooKeeper-shaped tree in a durable SQLite database.

The default backend of ``snapcoord serve`` without configuration, so that every RPC can be tried
without a ZooKeeper ensemble. It is a real implementation with the same semantics as the ZooKeeper
backend (checked by the same contract suite), for one process:

- the database lives in ``<dir>/metadata.sqlite3`` (WAL journal, ``synchronous=FULL``: a write
  that returned survives a crash or power loss);
- ``<dir>/LOCK`` is held with ``flock`` while the store is open, so a second process (or a second
  store in this process) opening the same directory fails at once instead of corrupting the
  in-process watches and the single-writer assumptions below;
- every operation runs under one lock on one connection, so each is atomic and serialised, like
  ZooKeeper's totally ordered writes;
- watches see the changes made through this store only (the lock guarantees there are no others)
  and their callbacks run on a background thread, never while the database lock is held;
- an election has no one to contend with but other elections of the same name on this store, so
  a lone contender leads at once and until it is cancelled or the store is closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from snapcoord.coordinator.errors import (
    BadVersionError,
    InvalidArgument,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    StoreUnavailable,
    TransactionFailed,
)
from snapcoord.coordinator.storage.election import Election, Leadership, call_lead, election_path, next_pause
from snapcoord.coordinator.storage.metadata import (
    MAX_NODE_BYTES,
    Check,
    Create,
    Delete,
    MetadataStore,
    Node,
    Op,
    SetData,
    StateListener,
    WatchCallback,
    check_size,
    check_writable,
    parent_of,
    validate_path,
)
from snapcoord.coordinator.storage.uris import directory_from_file_uri

log = logging.getLogger(__name__)

DB_FILE = "metadata.sqlite3"
LOCK_FILE = "LOCK"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path        TEXT    PRIMARY KEY,
    parent      TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    data        BLOB    NOT NULL,
    version     INTEGER NOT NULL,
    created_ms  INTEGER NOT NULL,
    modified_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes (parent, name);
"""


@dataclass(frozen=True)
class _Watch:
    """One registered callback; compared by identity so that cancel removes exactly this one.
    ``armed_after`` is the number of the last change queued when it was registered: it fires for
    later changes only, as a ZooKeeper watch does, even when an earlier change's event is
    dispatched after the registration."""

    callback: WatchCallback
    armed_after: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Elections:
    """The elections of one store: one condition for all of them, and who leads each name."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.closed = False  # guarded by cond, as is leaders
        self.leaders: dict[str, EmbeddedElection] = {}

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class EmbeddedElection(Election):
    """Leads whenever no other election of the same name on this store does; alone, at once.

    The directory lock keeps other processes out, so there are no other replicas to elect among;
    the per-name exclusion only keeps two elections in this process from leading together.
    """

    def __init__(self, elections: _Elections, name: str, identifier: str) -> None:
        election_path(name)  # the same names as on ZooKeeper
        self._elections = elections
        self._cond = elections.cond
        self._name = name
        self._what = f"election {name} ({identifier})"
        self._cancelled = False  # guarded by _cond, as are the two below
        self._running = False
        self._leadership: _EmbeddedLeadership | None = None

    def run(self, lead: Callable[[Leadership], None]) -> None:
        with self._cond:
            if self._running:
                raise RuntimeError(f"election {self._name} is already running")
            self._running = True
        try:
            pause, failures = 0.0, 0
            while (leadership := self._claim(pause)) is not None:
                log.info("%s: leading", self._what)
                try:
                    ok = call_lead(lead, leadership, self._what)
                finally:
                    with self._cond:
                        leadership.ended = True
                        self._leadership = None
                        del self._elections.leaders[self._name]
                        self._cond.notify_all()  # the next contender of this name
                pause, failures = next_pause(ok, failures)
        finally:
            with self._cond:
                self._running = False

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def is_leader(self) -> bool:
        with self._cond:
            return self._leadership is not None and not self._leadership.is_lost()

    def _stopping(self) -> bool:
        return self._cancelled or self._elections.closed

    def _claim(self, pause_s: float) -> _EmbeddedLeadership | None:
        """After ``pause_s``, take the lead once the name is free; None once stopping."""
        resume_at = time.monotonic() + pause_s
        with self._cond:
            while not self._stopping():
                wait_s = resume_at - time.monotonic()
                if wait_s <= 0 and self._name not in self._elections.leaders:
                    self._elections.leaders[self._name] = self
                    self._leadership = _EmbeddedLeadership(self)
                    return self._leadership
                # Every change that matters (a step-down, cancel, close) notifies this condition.
                self._cond.wait(wait_s if wait_s > 0 else None)
            return None

    def _wait_lost(self, leadership: _EmbeddedLeadership, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(leadership.is_lost, timeout_s)


class _EmbeddedLeadership(Leadership):
    def __init__(self, election: EmbeddedElection) -> None:
        self._election = election
        self.ended = False  # set (under the condition) when the term ends

    def may_act(self) -> bool:
        return not self.is_lost()  # no connection to lose: usable until closed

    def is_lost(self) -> bool:
        return self.ended or self._election._stopping()

    def wait(self, timeout_s: float) -> bool:
        return self._election._wait_lost(self, timeout_s)


class EmbeddedMetadataStore(MetadataStore):
    """A versioned tree in SQLite with ZooKeeper's semantics, for a single process."""

    @classmethod
    def from_uri(cls, uri: str) -> EmbeddedMetadataStore:
        """Open (creating if needed) the store in the directory of ``file:///dir`` or ``file:dir``."""
        return cls(directory_from_file_uri(uri), uri=uri)

    def __init__(self, directory: Path, *, uri: str | None = None) -> None:
        self.uri = uri or directory.resolve().as_uri()
        self._directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = self._take_directory_lock(directory)
        except OSError as e:
            raise StoreUnavailable(f"cannot open the metadata directory {directory}: {e}") from e
        try:
            self._db = self._open_database(directory / DB_FILE)
        except BaseException:
            os.close(self._lock_fd)
            raise
        # One lock serialises every statement on the one connection: each operation is atomic
        # and writes are totally ordered, as in ZooKeeper.
        self._db_lock = threading.Lock()
        self._closed = False
        # Watches and listeners have their own lock, never held while calling them.
        self._watch_lock = threading.Lock()
        self._watches: dict[str, list[_Watch]] = {}
        self._listeners: list[StateListener] = []
        # Work for the dispatcher thread, in commit order: a changed path, a state change to
        # announce, or None to stop.
        # A change's event is (its number, the path); True/False a state change; None the end.
        self._events: queue.SimpleQueue[tuple[int, str] | bool | None] = queue.SimpleQueue()
        self._changes = 0  # changes queued so far; written under the database lock
        self._elections = _Elections()
        self._dispatcher = threading.Thread(
            target=self._dispatch, name=f"snapcoord-embedded-watch:{directory}", daemon=True
        )
        self._dispatcher.start()

    @staticmethod
    def _take_directory_lock(directory: Path) -> int:
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock locks belong to the open file description: a second open of the same file, in
            # this process or another, conflicts; the kernel drops the lock when the holder dies.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreUnavailable(
                f"metadata directory {directory} is already in use by another snapcoord store "
                f"(pid {holder}); the embedded backend serves one process: stop the other one, "
                "or use ZooKeeper (zk://...) to run several replicas"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        return fd

    @staticmethod
    def _open_database(db_path: Path) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN/COMMIT ourselves; check_same_thread=False because
        # the connection is shared by all threads under self._db_lock.
        db = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            now = _now_ms()
            db.execute(
                "INSERT OR IGNORE INTO nodes VALUES ('/', '', '', x'', 0, ?, ?)",
                (now, now),
            )
        except sqlite3.Error as e:
            db.close()
            raise StoreUnavailable(f"cannot open the embedded metadata database {db_path}: {e}") from e
        return db

    # --- reads ----------------------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        path = validate_path(path)
        with self._locked() as db:
            return self._read(db, path)

    def get_many(self, paths: Sequence[str]) -> dict[str, Node | None]:
        wanted = [validate_path(p) for p in paths]
        with self._locked() as db:  # one lock: the reads see one state, which is allowed
            return {path: self._read(db, path) for path in wanted}

    def children(self, path: str) -> list[str]:
        path = validate_path(path)
        with self._locked() as db:
            rows = db.execute("SELECT name FROM nodes WHERE parent = ? ORDER BY name", (path,)).fetchall()
        # SQLite's BINARY collation compares UTF-8 bytes, which orders like Python's str order.
        return [str(name) for (name,) in rows]

    def sync(self, path: str = "/") -> None:
        """Nothing to do: every read goes to the one database that every write went to."""
        validate_path(path)
        with self._locked():
            pass

    # --- writes ---------------------------------------------------------------------------------

    def create(self, path: str, data: bytes, *, make_parents: bool = False) -> Node:
        path = check_writable(path)
        check_size(data)
        with self._write() as (db, changed):
            if make_parents:
                self._make_ancestors(db, path, changed)
            return self._create(db, path, data, changed)

    def create_and_get_many(self, path: str, data: bytes, paths: Sequence[str]) -> dict[str, Node | None]:
        path = check_writable(path)
        check_size(data)
        wanted = [validate_path(p) for p in paths]
        with self._write() as (db, changed):  # the create fails first, or the reads follow it
            self._create(db, path, data, changed)
            return {p: self._read(db, p) for p in wanted}

    def set(self, path: str, data: bytes, *, version: int) -> Node:
        path = check_writable(path)
        check_size(data)
        with self._write() as (db, changed):
            return self._set(db, path, data, version, changed)

    def delete(self, path: str, *, version: int | None = None) -> None:
        path = check_writable(path)
        with self._write() as (db, changed):
            self._delete(db, path, version, changed)

    def transaction(self, ops: Sequence[Op]) -> None:
        ops = list(ops)
        total = 0
        for op in ops:
            if isinstance(op, Check):
                validate_path(op.path)
            else:
                check_writable(op.path)
            if isinstance(op, Create | SetData):
                total += len(op.data)
        # ZooKeeper bounds a whole multi request by the same buffer size as one node.
        if total > MAX_NODE_BYTES:
            raise InvalidArgument(f"transaction data of {total} bytes exceeds the limit of {MAX_NODE_BYTES}")
        with self._write() as (db, changed):
            for index, op in enumerate(ops):
                try:
                    self._apply(db, op, changed)
                except (NodeExistsError, NoNodeError, BadVersionError, NotEmptyError) as e:
                    # Leaving the `with` by an exception rolls back the earlier ops.
                    raise TransactionFailed(
                        f"transaction op {index} ({type(op).__name__} {op.path}) failed: {e}",
                        index=index,
                        cause=e,
                    ) from e

    # --- watches and state ----------------------------------------------------------------------

    def watch(self, path: str, callback: WatchCallback) -> Callable[[], None]:
        path = validate_path(path)
        entry = _Watch(callback, armed_after=self._changes)
        with self._watch_lock:
            self._watches.setdefault(path, []).append(entry)

        def cancel() -> None:
            with self._watch_lock:
                entries = self._watches.get(path, [])
                # Remove this entry (by identity), not an equal one registered separately.
                remaining = [w for w in entries if w is not entry]
                if remaining:
                    self._watches[path] = remaining
                else:
                    self._watches.pop(path, None)

        return cancel

    def is_usable(self) -> bool:
        return not self._closed

    def add_state_listener(self, listener: StateListener) -> None:
        with self._watch_lock:
            self._listeners.append(listener)

    def election(self, name: str, identifier: str) -> EmbeddedElection:
        return EmbeddedElection(self._elections, name, identifier)

    def close(self) -> None:
        with self._db_lock:
            if self._closed:
                return
            self._closed = True
            self._db.close()
        self._elections.close()  # every election's run() returns; one made later does at once
        os.close(self._lock_fd)
        # Listeners hear False before the dispatcher stops; the queue keeps the order.
        self._events.put(False)
        self._events.put(None)
        if threading.current_thread() is not self._dispatcher:
            self._dispatcher.join()

    # --- internals ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        with self._db_lock:
            if self._closed:
                raise StoreUnavailable(f"metadata store {self.uri} is closed")
            try:
                yield self._db
            except sqlite3.Error as e:
                raise StoreUnavailable(f"embedded metadata database in {self._directory}: {e}") from e

    @contextlib.contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Connection, list[str]]]:
        """One all-or-nothing SQL transaction; on success, queue watch events for changed paths."""
        changed: list[str] = []
        with self._locked() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db, changed
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # not after a COMMIT that failed and already rolled back
                    db.execute("ROLLBACK")
                raise
            # Queued under the lock so that callbacks see changes in commit order; they run on
            # the dispatcher thread after the lock is released.
            for path in changed:
                self._changes += 1
                self._events.put((self._changes, path))

    @staticmethod
    def _read(db: sqlite3.Connection, path: str) -> Node | None:
        row = db.execute(
            "SELECT data, version, created_ms, modified_ms FROM nodes WHERE path = ?", (path,)
        ).fetchone()
        if row is None:
            return None
        return Node(data=bytes(row[0]), version=row[1], created_ms=row[2], modified_ms=row[3])

    def _apply(self, db: sqlite3.Connection, op: Op, changed: list[str]) -> None:
        if isinstance(op, Create):
            self._create(db, op.path, op.data, changed)
        elif isinstance(op, SetData):
            self._set(db, op.path, op.data, op.version, changed)
        elif isinstance(op, Delete):
            self._delete(db, op.path, op.version, changed)
        else:
            node = self._read(db, op.path)
            if node is None:
                raise NoNodeError(f"no node at {op.path}")
            if node.version != op.version:
                raise BadVersionError(f"{op.path} is at version {node.version}, not {op.version}")

    def _make_ancestors(self, db: sqlite3.Connection, path: str, changed: list[str]) -> None:
        parts = path.split("/")[1:-1]
        for depth in range(1, len(parts) + 1):
            ancestor = "/" + "/".join(parts[:depth])
            if self._read(db, ancestor) is None:
                self._create(db, ancestor, b"", changed)

    def _create(self, db: sqlite3.Connection, path: str, data: bytes, changed: list[str]) -> Node:
        parent = parent_of(path)
        if self._read(db, parent) is None:
            raise NoNodeError(f"cannot create {path}: parent {parent} does not exist")
        if self._read(db, path) is not None:
            raise NodeExistsError(f"node {path} exists")
        now = _now_ms()
        db.execute(
            "INSERT INTO nodes VALUES (?, ?, ?, ?, 0, ?, ?)",
            (path, parent, path.rsplit("/", 1)[1], data, now, now),
        )
        changed.append(path)
        return Node(data=data, version=0, created_ms=now, modified_ms=now)

    def _set(self, db: sqlite3.Connection, path: str, data: bytes, version: int, changed: list[str]) -> Node:
        node = self._read(db, path)
        if node is None:
            raise NoNodeError(f"no node at {path}")
        if node.version != version:
            raise BadVersionError(f"{path} is at version {node.version}, not {version}")
        now = _now_ms()
        db.execute(
            "UPDATE nodes SET data = ?, version = ?, modified_ms = ? WHERE path = ?",
            (data, version + 1, now, path),
        )
        changed.append(path)
        return Node(data=data, version=version + 1, created_ms=node.created_ms, modified_ms=now)

    def _delete(self, db: sqlite3.Connection, path: str, version: int | None, changed: list[str]) -> None:
        # Same order of checks as ZooKeeper: existence, version, children.
        node = self._read(db, path)
        if node is None:
            raise NoNodeError(f"no node at {path}")
        if version is not None and node.version != version:
            raise BadVersionError(f"{path} is at version {node.version}, not {version}")
        if db.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,)).fetchone() is not None:
            raise NotEmptyError(f"{path} has children")
        db.execute("DELETE FROM nodes WHERE path = ?", (path,))
        changed.append(path)

    def _dispatch(self) -> None:
        """Run watch callbacks and state listeners outside every lock, in the order queued."""
        while True:
            event = self._events.get()
            if event is None:
                return
            with self._watch_lock:
                # Looked up at dispatch time: a watch cancelled before now is not called.
                if isinstance(event, bool):
                    listeners = list(self._listeners)
                    callbacks = []
                else:
                    listeners = []
                    number, path = event
                    callbacks = [w.callback for w in self._watches.get(path, []) if w.armed_after < number]
            for listener in listeners:
                try:
                    listener(bool(event))
                except Exception:
                    log.exception("metadata state listener raised")
            for callback in callbacks:
                try:
                    callback(path)
                except Exception:
                    log.exception("metadata watch callback for %s raised", path)
