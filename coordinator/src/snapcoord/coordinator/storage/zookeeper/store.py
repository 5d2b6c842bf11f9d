"""ZooKeeper metadata store (kazoo): the production commit point.

Three things kazoo leaves to its user, and how this module does them:

- **Retries.** kazoo does not retry by default. Every operation here runs through one
  ``KazooRetry`` policy that retries only connection loss, operation timeouts and session expiry
  (kazoo reconnects with a new session by itself), bounded by ``zk_retry_deadline_ms``; then
  ``StoreUnavailable``. Each attempt waits at most until that deadline too, and is not even sent
  while the client is disconnected: a request queued on a disconnected kazoo client waits for the
  reconnection, however long, so calls made while suspended would otherwise hang.
- **Lost replies.** A write whose reply was lost may have been applied, so a retry can fail
  because the first attempt succeeded: a create with ``NodeExists``, a set with ``BadVersion``, a
  delete with ``NoNode``. Such an attempt is "in doubt", and the retry's failure is checked
  against the node (our data at version 0; our data at ``version + 1``; gone). When the node does
  not prove it (ours may have landed and been changed since), and for a retried transaction, which
  cannot be checked that way, the write raises ``CommitOutcomeUnknown``, as does any write still
  in doubt at the deadline: the caller re-reads.
- **Watches across reconnects.** kazoo drops its client-side watchers when the connection is
  suspended (it does not re-register them), so this store keeps its own registry, re-arms every
  watched path after a reconnect or a new session, and calls every callback once then, since
  changes may have been missed. kazoo's ``DataWatch`` recipe is not used: its initial read and its
  re-reads retry without a deadline (blocking ``watch()`` and kazoo's callback thread while
  disconnected), and it does not call back on reconnect unless the node changed.

Watch callbacks and state listeners run on one thread of this store, never on kazoo's threads:
kazoo's listeners and watchers only put an event on a queue. Leader election (kazoo's recipe, made
to stop on SUSPENDED and step down on LOST) is in ``zk_election``.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol import serialization as wire
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.states import EventType, KazooState, KeeperState, WatchedEvent
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl

from snapcoord.coordinator.errors import (
    BadVersionError,
    CommitOutcomeUnknown,
    InvalidArgument,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Reason,
    SnapcoordError,
    StoreUnavailable,
    TransactionFailed,
)
from snapcoord.coordinator.storage.backends import MetadataOptions
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
    validate_path,
)
from snapcoord.coordinator.storage.uris import zk_chroot
from snapcoord.coordinator.storage.zookeeper import multiread
from snapcoord.coordinator.storage.zookeeper.auth import read_credentials
from snapcoord.coordinator.storage.zookeeper.combine import ReadCombiner, TransactionCombiner
from snapcoord.coordinator.storage.zookeeper.election import ZooKeeperElection
from snapcoord.coordinator.storage.zookeeper.handler import PollingHandler
from snapcoord.coordinator.storage.zookeeper.request_size import ZK_DEFAULT_MAX_REQUEST_BYTES, AclEntry
from snapcoord.coordinator.storage.zookeeper.request_size import request_bytes as zk_request_bytes

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Per-op results of a failed multi that are not the cause: ops before it were rolled back, ops
#: after it were never run.
_NOT_THE_CAUSE = (kz.RolledBackError, kz.RuntimeInconsistency)


@dataclass(frozen=True)
class _Watch:
    """One registered callback; compared by identity so that cancel removes exactly this one."""

    callback: WatchCallback


@dataclass(frozen=True)
class _StateChanged:
    state: str  # a KazooState value


@dataclass(frozen=True)
class _NodeChanged:
    path: str


_Event = _StateChanged | _NodeChanged | None


class _Attempts:
    """What the attempts of one operation share: the deadline and whether a write is in doubt."""

    def __init__(
        self, client: Any, deadline_s: float, cut_for_s: Callable[[], float], patience_s: float
    ) -> None:
        self._client = client
        self._stop_at = time.monotonic() + deadline_s
        self._cut_for_s = cut_for_s
        self._patience_s = patience_s
        #: True once a write was sent and its reply lost: it may have been applied.
        self.in_doubt = False

    def wait(self, start: Callable[[], Any], *, write: bool = False) -> Any:
        """Send one request (``start`` returns kazoo's async result) and wait for its reply."""
        if self._client.client_state == KeeperState.CLOSED:
            raise kz.ConnectionClosedError("the client was stopped")  # not retried
        self._not_connected()
        remaining = self._stop_at - time.monotonic()
        if remaining <= 0:
            raise kz.OperationTimeoutError("retry deadline reached")  # not sent either
        result = start()
        try:
            return result.get(timeout=remaining)
        except (kz.ConnectionLoss, kz.SessionExpiredError):
            self.in_doubt = self.in_doubt or write
            raise
        except KazooTimeoutError as e:
            # Still queued or in flight: it may yet be applied.
            self.in_doubt = self.in_doubt or write
            raise kz.OperationTimeoutError("no reply before the retry deadline") from e

    def _not_connected(self) -> None:
        """Raise unless connected: ``ConnectionLoss`` (retried) while the connection may come back
        soon, ``RetryFailedError`` (not retried) once it has been gone for the patience. A replica
        cut from ZooKeeper so answers UNAVAILABLE within its session timeout (kazoo notices a
        silent cut after two thirds of it), not after the whole retry deadline, and a call never
        waits out a retry deadline on a connection known to be gone."""
        if self._client.connected:
            return
        cut_for = self._cut_for_s()
        if cut_for >= self._patience_s:
            raise RetryFailedError(f"not connected to ZooKeeper for {cut_for:.1f} s")
        # Not sent, so not in doubt. kazoo would queue it until the reconnection.
        raise kz.ConnectionLoss("not connected to ZooKeeper")

    def wait_all(self, starts: Sequence[Callable[[], Any]], *, write: bool = False) -> list[Any]:
        """Send several requests at once and wait for every reply, in order. A ``NoNodeError`` is
        returned in its slot (a missing node is an answer); any other error is raised. ``write``:
        the first request writes, so a lost reply leaves the attempt in doubt."""
        if self._client.client_state == KeeperState.CLOSED:
            raise kz.ConnectionClosedError("the client was stopped")
        self._not_connected()
        pending = [start() for start in starts]
        replies: list[Any] = []
        for result in pending:
            remaining = self._stop_at - time.monotonic()
            try:
                replies.append(result.get(timeout=max(remaining, 0.001)))
            except kz.NoNodeError as e:
                replies.append(e)
            except (kz.ConnectionLoss, kz.SessionExpiredError):
                self.in_doubt = self.in_doubt or write
                raise
            except KazooTimeoutError as e:
                self.in_doubt = self.in_doubt or write
                raise kz.OperationTimeoutError("no reply before the retry deadline") from e
        return replies


def _node(data: bytes | None, stat: Any) -> Node:
    return Node(data=data or b"", version=stat.version, created_ms=stat.ctime, modified_ms=stat.mtime)


def _nodes(wanted: Sequence[str], replies: Sequence[Any]) -> dict[str, Node | None]:
    """The nodes of a multiRead's replies (one per path of ``wanted``): a missing node is None,
    any other error is raised."""
    nodes: dict[str, Node | None] = {}
    for path, reply in zip(wanted, replies, strict=True):
        if isinstance(reply, kz.NoNodeError):
            nodes[path] = None
        elif isinstance(reply, Exception):
            raise reply
        else:
            nodes[path] = _node(*reply)
    return nodes


def _translate(e: kz.KazooException, what: str) -> SnapcoordError:
    """A kazoo error as one of ours (the caller raises it ``from e``)."""
    if isinstance(e, kz.NoNodeError):
        return NoNodeError(f"{what}: no such node")
    if isinstance(e, kz.NodeExistsError):
        return NodeExistsError(f"{what}: node exists")
    if isinstance(e, kz.BadVersionError):
        return BadVersionError(f"{what}: version mismatch")
    if isinstance(e, kz.NotEmptyError):
        return NotEmptyError(f"{what}: node has children")
    if isinstance(e, kz.NoAuthError | kz.AuthFailedError):
        return StoreUnavailable(f"{what}: ZooKeeper refused access ({type(e).__name__}); check the ACLs")
    return StoreUnavailable(f"{what}: ZooKeeper error {type(e).__name__}: {e}")


def _digest_auth(path: str) -> tuple[list[tuple[str, str]] | None, list[ACL] | None]:
    """kazoo's ``auth_data`` and ``default_acl`` for the ``user:password`` in ``path`` ("" = none)."""
    if not path:
        return None, None
    try:
        user, password = read_credentials(path)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    return [("digest", f"{user}:{password}")], [make_digest_acl(user, password, all=True)]


def _acl_entries(acl: Sequence[ACL]) -> tuple[AclEntry, ...]:
    """kazoo's ACLs as ``zk_request_size`` counts them (that module stays free of kazoo, for config)."""
    return tuple(AclEntry(a.perms, a.id.scheme, a.id.id) for a in acl)


def _tls_kwargs(options: MetadataOptions) -> dict[str, Any]:
    """kazoo's TLS arguments: TLS to ZooKeeper's secure client port when a CA or a client
    certificate is set, always verifying the server's certificate."""
    if not (options.zk_tls_ca or options.zk_tls_cert):
        return {}
    for path in (options.zk_tls_ca, options.zk_tls_cert, options.zk_tls_key):
        if path and not Path(path).is_file():
            raise InvalidArgument(f"ZooKeeper TLS file {path} does not exist")
    return {
        "use_ssl": True,
        "verify_certs": True,
        "ca": options.zk_tls_ca or None,
        "certfile": options.zk_tls_cert or None,
        "keyfile": options.zk_tls_key or None,
    }


class ZooKeeperMetadataStore(MetadataStore):
    """The metadata tree in ZooKeeper under a chroot."""

    @classmethod
    def from_uri(cls, uri: str, options: MetadataOptions | None = None) -> ZooKeeperMetadataStore:
        """Connect to ``zk://host:port[,host:port...]/chroot``, creating the chroot if missing."""
        parts = urlsplit(uri)
        if parts.scheme != "zk" or not parts.netloc or "@" in parts.netloc:
            raise ValueError(f"expected zk://host:port[,host:port]/chroot, got {uri!r}")
        try:
            chroot = zk_chroot(uri)  # at most MAX_CHROOT_BYTES: the request-size budgets count it
        except ValueError as e:
            raise ValueError(f"invalid ZooKeeper URI {uri!r}: {e}") from None
        options = options or MetadataOptions()
        return cls(
            parts.netloc,
            chroot,
            options,
            uri=f"zk://{parts.netloc}{chroot or '/'}",
            max_request_bytes=options.zk_max_request_bytes,
        )

    def __init__(
        self,
        hosts: str,
        chroot: str,
        options: MetadataOptions,
        *,
        uri: str,
        max_request_bytes: int = ZK_DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self.uri = uri
        #: The server's jute.maxbuffer: set it when the ensemble runs with a non-default one.
        self._max_request_bytes = max_request_bytes
        self._hosts = hosts
        self._chroot = chroot
        self._deadline_s = options.zk_retry_deadline_ms / 1000
        self._session_timeout_s = options.zk_session_timeout_ms / 1000
        # The one retry policy: only ConnectionLoss, OperationTimeout and (ignore_expire) session
        # expiry are retried, with jittered backoff, until the deadline. Copied per call (kazoo's
        # own pattern) because a KazooRetry counts attempts.
        self._retry = KazooRetry(
            max_tries=-1, delay=0.05, backoff=2, max_jitter=0.4, max_delay=0.5, deadline=self._deadline_s
        )
        # Digest auth: every znode this store creates (records, the chroot, election nodes: kazoo
        # applies default_acl to all of them) is readable and writable by this user only.
        self._auth_data, self._acl = _digest_auth(options.zk_auth_file)
        self._tls = _tls_kwargs(options)
        self._client = KazooClient(
            hosts=hosts + chroot,
            handler=PollingHandler(),
            timeout=self._session_timeout_s,
            auth_data=self._auth_data,
            default_acl=self._acl,
            **self._tls,
            # Reconnect forever, but never wait more than a second between tries: kazoo's default
            # backoff grows to an hour, which would keep a replica down long after ZK is back.
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0),
        )
        #: The ACL every create sends (kazoo's ``default_acl``), and as ``transaction``'s size check
        #: counts it: a digest ACL is 24 bytes plus the user name's longer than the open one.
        self._wire_acl: list[ACL] = self._acl or OPEN_ACL_UNSAFE
        self._create_acl = _acl_entries(self._wire_acl)
        #: Concurrent transactions go out as one multi, under half the request limit (a proposal
        #: carries more than the request, and followers hold it to the same limit).
        self._combiner = TransactionCombiner(self._client, max_bytes=max_request_bytes // 2)
        #: Concurrent reads go out as one multiRead (a consistent read's sync in front of it).
        self._reads = ReadCombiner(self._client)
        #: Reads of several nodes go out as one ``multiRead``; cleared if the server lacks it.
        self._multi_read = True
        self._closed = False
        self._close_lock = threading.Lock()
        self._watch_lock = threading.Lock()  # guards the two collections below; never held in calls
        self._watches: dict[str, list[_Watch]] = {}
        self._listeners: list[StateListener] = []
        #: Told when the store closes, so that their run() returns (also under _watch_lock).
        self._elections: weakref.WeakSet[ZooKeeperElection] = weakref.WeakSet()
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        #: When kazoo last left CONNECTED (monotonic), None while connected; set by its listener.
        self._disconnected_at: float | None = None
        self._client.add_listener(self._on_kazoo_state)
        self._connect(options.zk_connect_timeout_ms / 1000)
        self._dispatcher = threading.Thread(target=self._dispatch, name=f"snapcoord-zk:{uri}", daemon=True)
        self._dispatcher.start()

    @property
    def kazoo(self) -> KazooClient:
        """The underlying client, for fault injection in tests; do not write through it."""
        return self._client

    # --- reads ----------------------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        path = validate_path(path)

        return self._run(lambda a: self._read(a, [path])[path], f"get {path}")

    def get_many(self, paths: Sequence[str]) -> dict[str, Node | None]:
        wanted = list(dict.fromkeys(validate_path(p) for p in paths))
        if not wanted:
            return {}
        # Every request is sent before the first reply is awaited: n reads cost one round trip.
        return self._run(lambda a: self._read(a, wanted), f"get {len(wanted)} nodes ({wanted[0]}...)")

    def _read(
        self, a: _Attempts, wanted: Sequence[str], sync_path: str | None = None
    ) -> dict[str, Node | None]:
        """Read ``wanted`` (behind a sync of ``sync_path``) in one round trip: up to ``MAX_PATHS``
        nodes in the request other calls' concurrent reads share (``zk_combine.ReadCombiner``),
        more in ``multiRead``s of their own, one get each on a server without ``multiRead``."""
        if self._multi_read and 0 < len(wanted) <= multiread.MAX_PATHS:
            chroot = self._client.chroot
            paths = [_prefix_root(chroot, p) for p in wanted]
            sync = None if sync_path is None else _prefix_root(chroot, sync_path)
            try:
                replies = a.wait(functools.partial(self._reads.submit, paths, sync))
            except kz.UnimplementedError:
                self._lacks_multi_read()
            else:
                return _nodes(wanted, replies)
        before = [] if sync_path is None else [functools.partial(self._sync_async, sync_path)]
        return self._read_nodes(a, wanted, before)[1]

    def _lacks_multi_read(self) -> None:
        log.warning("ZooKeeper does not know multiRead (3.6+): reading nodes one get each")
        self._multi_read = False

    def _read_nodes(
        self,
        a: _Attempts,
        wanted: Sequence[str],
        before: Sequence[Callable[[], Any]] = (),
        *,
        write: bool = False,
    ) -> tuple[list[Any], dict[str, Node | None]]:
        """Send ``before`` (a sync, or a create: then ``write``), then read ``wanted``, all at once,
        and wait for every reply; returns ``before``'s replies and the nodes. Several nodes go out
        as ``multiRead``s (one request per ``MAX_PATHS``); one node, or a server without
        ``multiRead``, as pipelined gets: either way one round trip, since ZooKeeper answers a
        session's requests in order."""
        if self._multi_read and len(wanted) > 1:
            step = multiread.MAX_PATHS
            chunks = [wanted[i : i + step] for i in range(0, len(wanted), step)]
            starts = [functools.partial(multiread.multi_read_async, self._client, c) for c in chunks]
            try:
                replies = a.wait_all([*before, *starts], write=write)
            except kz.UnimplementedError:
                # A create in ``before`` landed: sent again below it meets NodeExists, which the
                # caller then checks like a create whose reply was lost (our data: ours).
                a.in_doubt = a.in_doubt or write
                self._lacks_multi_read()
            else:
                flat = [reply for chunk in replies[len(before) :] for reply in chunk]
                return replies[: len(before)], _nodes(wanted, flat)
        gets = [functools.partial(self._client.get_async, p) for p in wanted]
        results = a.wait_all([*before, *gets], write=write)
        return results[: len(before)], {
            path: None if isinstance(result, kz.NoNodeError) else _node(*result)
            for path, result in zip(wanted, results[len(before) :], strict=True)
        }

    def children(self, path: str) -> list[str]:
        path = validate_path(path)

        def attempt(a: _Attempts) -> list[str]:
            try:
                names = a.wait(lambda: self._client.get_children_async(path))
            except kz.NoNodeError:
                return []
            return sorted(names)

        return self._run(attempt, f"children of {path}")

    def sync(self, path: str = "/") -> None:
        path = validate_path(path)
        self._run(lambda a: a.wait(lambda: self._sync_async(path)), f"sync {path}")

    def synced_get_many(self, sync_path: str, paths: Sequence[str]) -> dict[str, Node | None]:
        sync_path = validate_path(sync_path)
        wanted = list(dict.fromkeys(validate_path(p) for p in paths))

        def attempt(a: _Attempts) -> dict[str, Node | None]:
            # One round trip instead of two: ZooKeeper serves a session's requests in order, so
            # the reads sent right behind the sync wait for it and see what it made visible.
            return self._read(a, wanted, sync_path)

        return self._run(attempt, f"sync {sync_path} and get {len(wanted)} nodes")

    def _sync_async(self, path: str) -> Any:
        """kazoo's ``sync_async`` without its extra hop: kazoo hands the sync's reply to a second
        result on its completion thread (one more thread wake-up and GIL handover per call). The
        reads sent behind a sync need its ordering and its success, not the path it returns."""
        result = self._client.handler.async_result()
        self._client._call(wire.Sync(_prefix_root(self._client.chroot, path)), result)
        return result

    def _create_async(self, path: str, data: bytes, *, include_data: bool = False) -> Any:
        """kazoo's ``create_async`` (no parents made) without its extra hop, as ``_sync_async``:
        kazoo hands every create's reply to a second result on its completion thread. Its reply
        is the created path (chrooted), with the node's stat when ``include_data``."""
        result = self._client.handler.async_result()
        request = (wire.Create2 if include_data else wire.Create)(
            _prefix_root(self._client.chroot, path), data, self._wire_acl, 0
        )
        self._client._call(request, result)
        return result

    # --- writes ---------------------------------------------------------------------------------

    def create(self, path: str, data: bytes, *, make_parents: bool = False) -> Node:
        path = check_writable(path)
        check_size(data)

        def attempt(a: _Attempts) -> Node:
            try:
                # kazoo's own create only to make parents (rare): it costs the extra hop.
                start = (
                    functools.partial(self._client.create_async, path, data, makepath=True, include_data=True)
                    if make_parents
                    else functools.partial(self._create_async, path, data, include_data=True)
                )
                _, stat = a.wait(start, write=True)
                return _node(data, stat)
            except kz.NodeExistsError:
                return self._created_before(a, path, data)

        return self._run(attempt, f"create {path}")

    def create_and_get_many(self, path: str, data: bytes, paths: Sequence[str]) -> dict[str, Node | None]:
        path = check_writable(path)
        check_size(data)
        wanted = list(dict.fromkeys(validate_path(p) for p in paths))

        def attempt(a: _Attempts) -> dict[str, Node | None]:
            # One pipeline: the create is sent first and the reads right behind it, and every
            # reply (the create's ack included) is awaited before this returns.
            create = functools.partial(self._create_async, path, data)
            try:
                (created,), nodes = self._read_nodes(a, wanted, [create], write=True)
            except kz.NodeExistsError:
                self._created_before(a, path, data)
                return self._read_nodes(a, wanted)[1]
            if isinstance(created, kz.NoNodeError):
                raise created  # the parent is missing: nothing was created
            return nodes

        return self._run(attempt, f"create {path} and get {len(wanted)} nodes")

    def set(self, path: str, data: bytes, *, version: int) -> Node:
        path = check_writable(path)
        check_size(data)

        def attempt(a: _Attempts) -> Node:
            try:
                stat = a.wait(lambda: self._client.set_async(path, data, version), write=True)
                return _node(data, stat)
            except kz.BadVersionError:
                if a.in_doubt:
                    # Our earlier attempt moved it from `version` to `version + 1` with our data?
                    node = self._get_in(a, path)
                    if node is not None and node.version == version + 1 and node.data == data:
                        return node
                    raise CommitOutcomeUnknown(
                        f"set {path} on {self.uri}: retried after a lost reply and met another version; "
                        "the first attempt may have been applied: re-read"
                    ) from None
                raise

        return self._run(attempt, f"set {path}")

    def delete(self, path: str, *, version: int | None = None) -> None:
        path = check_writable(path)

        def attempt(a: _Attempts) -> None:
            try:
                a.wait(
                    lambda: self._client.delete_async(path, -1 if version is None else version), write=True
                )
            except kz.NoNodeError:
                if a.in_doubt:
                    return  # our earlier attempt deleted it
                raise

        self._run(attempt, f"delete {path}")

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
        if total > MAX_NODE_BYTES:  # the contract every backend keeps (storage.metadata)
            raise InvalidArgument(f"transaction data of {total} bytes exceeds the limit of {MAX_NODE_BYTES}")
        if not ops:
            return
        # The server refuses any request above jute.maxbuffer by dropping the connection; kazoo
        # would then resend it on every reconnect until the deadline, flapping the session. The
        # limit bounds the whole multi, paths, per-op overhead and each create's ACL included, so
        # count the exact request and refuse it here, before anything is sent.
        size = zk_request_bytes(ops, chroot=self._chroot, acl=self._create_acl)
        if size > self._max_request_bytes:
            raise InvalidArgument(
                f"transaction of {len(ops)} operations is a {size}-byte ZooKeeper request; the limit "
                f"is {self._max_request_bytes} bytes (ZooKeeper's jute.maxbuffer)",
                reason=Reason.TOO_LARGE,
                metadata={"field": "zookeeper_request", "limit": self._max_request_bytes, "size": size},
            )

        chroot, acl = self._client.chroot, self._wire_acl
        request: list[Any] = []
        for op in ops:
            path = _prefix_root(chroot, op.path)
            if isinstance(op, Create):
                request.append(wire.Create(path, op.data, acl, 0))
            elif isinstance(op, SetData):
                request.append(wire.SetData(path, op.data, op.version))
            elif isinstance(op, Delete):
                request.append(wire.Delete(path, -1 if op.version is None else op.version))
            else:
                request.append(wire.CheckVersion(path, op.version))

        def attempt(a: _Attempts) -> None:
            # A first attempt may share one multi with other calls' (zk_combine); a retry after a
            # lost reply goes alone, so that its expected failure fails no one else.
            start = (
                functools.partial(self._combiner.send_alone, request)
                if a.in_doubt
                else functools.partial(self._combiner.submit, request, size)
            )
            results = a.wait(start, write=True)
            for index, result in enumerate(results):
                if isinstance(result, kz.KazooException) and not isinstance(result, _NOT_THE_CAUSE):
                    if a.in_doubt:
                        # The failure may be the trace of our own lost first commit (a Create now
                        # meets NodeExists, a SetData BadVersion): nothing to tell them apart.
                        raise CommitOutcomeUnknown(
                            f"transaction on {self.uri}: retried after a lost reply and failed at op {index} "
                            f"({type(result).__name__}); the first attempt may have been applied: re-read"
                        )
                    cause = _translate(result, f"op {index} {type(ops[index]).__name__} {ops[index].path}")
                    raise TransactionFailed(
                        f"transaction failed at op {index}: {cause}", index=index, cause=cause
                    ) from result

        self._run(attempt, "transaction")

    # --- watches and state ----------------------------------------------------------------------

    def watch(self, path: str, callback: WatchCallback) -> Callable[[], None]:
        path = validate_path(path)
        cancel = self._register(path, callback)
        try:
            # Armed before returning, so that any change made after watch() returns is seen.
            self._arm(path)
        except BaseException:
            cancel()
            raise
        return cancel

    def watch_and_get_many(
        self, watches: Sequence[tuple[str, WatchCallback]], paths: Sequence[str]
    ) -> tuple[list[Callable[[], None]], dict[str, Node | None]]:
        watched = [validate_path(p) for p, _ in watches]
        wanted = list(dict.fromkeys(validate_path(p) for p in paths))
        cancels = [
            self._register(path, callback) for path, (_, callback) in zip(watched, watches, strict=True)
        ]

        def attempt(a: _Attempts) -> dict[str, Node | None]:
            # One pipeline: ZooKeeper serves a session's requests in order, so every exists watch
            # is armed before any read behind it is served.
            starts = [
                functools.partial(self._client.exists_async, p, watch=self._on_zk_watch) for p in watched
            ]
            starts += [functools.partial(self._client.get_async, p) for p in wanted]
            results = a.wait_all(starts)[len(watched) :]
            return {
                path: None if isinstance(result, kz.NoNodeError) else _node(*result)
                for path, result in zip(wanted, results, strict=True)
            }

        try:
            return cancels, self._run(attempt, f"watch {len(watched)} and get {len(wanted)} nodes")
        except BaseException:
            for cancel in cancels:
                cancel()
            raise

    def _register(self, path: str, callback: WatchCallback) -> Callable[[], None]:
        """Add ``callback`` to ``path``'s watch registry (not armed yet); returns its cancel."""
        entry = _Watch(callback)
        with self._watch_lock:
            self._watches.setdefault(path, []).append(entry)

        def cancel() -> None:
            with self._watch_lock:
                remaining = [w for w in self._watches.get(path, []) if w is not entry]
                if remaining:
                    self._watches[path] = remaining
                else:
                    self._watches.pop(path, None)
            # The server-side watch stays armed until it fires once; the dispatcher then finds no
            # callback and does not re-arm it.

        return cancel

    def is_usable(self) -> bool:
        return not self._closed and self._client.state == KazooState.CONNECTED

    def add_state_listener(self, listener: StateListener) -> None:
        with self._watch_lock:
            self._listeners.append(listener)

    def election(self, name: str, identifier: str) -> ZooKeeperElection:
        election = ZooKeeperElection(self._client, name, identifier, handover_timeout_s=self._deadline_s)
        with self._watch_lock:
            self._elections.add(election)
            closed = self._closed
        # close() sets _closed before it collects the elections under the same lock, so an
        # election added concurrently is either collected there or sees _closed here.
        if closed:
            election.store_closed()
        return election

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._watch_lock:
            elections = list(self._elections)
        for election in elections:
            # Before stopping the client: run() returns instead of retrying against a closed one.
            election.store_closed()
        try:
            # stop() returns after kazoo reported LOST to our listener, so listeners hear False
            # before the dispatcher sees the end of its queue.
            self._client.stop()
        finally:
            self._client.close()
            self._events.put(None)
        if threading.current_thread() is not self._dispatcher:
            self._dispatcher.join()

    # --- internals ------------------------------------------------------------------------------

    def _connect(self, timeout_s: float) -> None:
        connected = self._client.start_async()
        connected.wait(timeout_s)
        if not self._client.connected:
            self._client.stop()
            self._client.close()
            raise StoreUnavailable(f"cannot connect to ZooKeeper at {self._hosts} within {timeout_s:g} s")
        try:
            if (
                self._chroot
                and self._run(lambda a: a.wait(lambda: self._client.exists_async("/")), "chroot") is None
            ):
                self._create_chroot(timeout_s)
        except BaseException:
            self._client.stop()
            self._client.close()
            raise

    def _create_chroot(self, timeout_s: float) -> None:
        """Create the chroot and its ancestors, which the chrooted client cannot address."""
        bootstrap = KazooClient(
            hosts=self._hosts,
            timeout=self._session_timeout_s,
            auth_data=self._auth_data,
            default_acl=self._acl,
            **self._tls,
        )
        try:
            bootstrap.start(timeout=timeout_s)
            bootstrap.ensure_path(self._chroot)
        except (kz.KazooException, KazooTimeoutError) as e:
            raise StoreUnavailable(
                f"cannot create the chroot {self._chroot} on ZooKeeper {self._hosts}: {e}"
            ) from e
        finally:
            bootstrap.stop()
            bootstrap.close()

    def _run(self, attempt: Callable[[_Attempts], T], what: str) -> T:
        """Run ``attempt`` under the retry policy and translate kazoo's errors at this edge."""
        if self._closed:
            raise StoreUnavailable(f"{what}: metadata store {self.uri} is closed")
        attempts = _Attempts(self._client, self._deadline_s, self._cut_for_s, self._session_timeout_s / 4)
        try:
            result: T = self._retry.copy()(attempt, attempts)
            return result
        except RetryFailedError as e:
            budget = f"{self._deadline_s * 1000:.0f} ms"
            if attempts.in_doubt:
                raise CommitOutcomeUnknown(
                    f"{what}: connection to ZooKeeper {self._hosts} lost with the write in flight and not "
                    f"back within {budget}; it may or may not have been applied: re-read"
                ) from e
            raise StoreUnavailable(f"{what}: ZooKeeper {self._hosts} not reachable within {budget}") from e
        except kz.ConnectionClosedError as e:
            raise StoreUnavailable(f"{what}: metadata store {self.uri} is closed") from e
        except kz.KazooException as e:
            raise _translate(e, what) from e

    def _created_before(self, a: _Attempts, path: str, data: bytes) -> Node:
        """A create met ``NodeExists``: raise it, unless an earlier attempt whose reply was lost
        may have made the node; then the node proves it (our data, unchanged since), or the
        outcome is unknown."""
        if not a.in_doubt:
            raise kz.NodeExistsError()
        # (If another writer created the same bytes, the outcome is the same to us.)
        node = self._get_in(a, path)
        if node is not None and node.version == 0 and node.data == data:
            return node
        # Ours may have landed and been changed since: nothing tells them apart.
        raise CommitOutcomeUnknown(
            f"create {path} on {self.uri}: retried after a lost reply and found the node "
            "already there; the first attempt may have created it: re-read"
        ) from None

    def _get_in(self, a: _Attempts, path: str) -> Node | None:
        try:
            data, stat = a.wait(lambda: self._client.get_async(path))
        except kz.NoNodeError:
            return None
        return _node(data, stat)

    def _arm(self, path: str) -> None:
        """Set (or keep) the server-side watch: an exists watch fires on create, set and delete."""
        self._run(
            lambda a: a.wait(lambda: self._client.exists_async(path, watch=self._on_zk_watch)),
            f"watch {path}",
        )

    def _on_kazoo_state(self, state: str) -> None:
        """kazoo's connection thread: must not block, so only note the time and queue the change."""
        if state == KazooState.CONNECTED:
            self._disconnected_at = None
        elif self._disconnected_at is None:
            self._disconnected_at = time.monotonic()
        self._events.put(_StateChanged(state))

    def _cut_for_s(self) -> float:
        """Seconds since the connection went (SUSPENDED or LOST), 0 while connected."""
        since = self._disconnected_at
        return 0.0 if since is None else time.monotonic() - since

    def _on_zk_watch(self, event: WatchedEvent) -> None:
        """kazoo's callback thread: only queue the change."""
        if event.type == EventType.NONE:
            # kazoo clearing its watchers on a suspended or lost connection; the reconnection
            # re-arms every path and calls every callback.
            return
        self._events.put(_NodeChanged(event.path))

    def _callbacks(self, path: str) -> list[WatchCallback]:
        with self._watch_lock:
            return [w.callback for w in self._watches.get(path, [])]

    def _dispatch(self) -> None:
        """The store's event thread: state listeners, re-arming and watch callbacks, in order."""
        usable = True  # we are connected when this thread starts
        while True:
            event = self._events.get()
            if event is None:
                return
            if isinstance(event, _NodeChanged):
                if not self._callbacks(event.path):
                    continue  # cancelled: let the fired server watch lapse
                # Re-arm before calling back, so a change made after the callback's re-read fires
                # again. If re-arming fails the connection is going, and reconnecting re-arms.
                self._try_arm(event.path)
                self._call_all(event.path, self._callbacks(event.path))
                continue
            now_usable = event.state == KazooState.CONNECTED and not self._closed
            if now_usable == usable:
                continue
            usable = now_usable
            with self._watch_lock:
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener(usable)
                except Exception:
                    log.exception("metadata state listener raised")
            if usable:
                # Back after a suspension or with a new session: kazoo dropped every watcher and
                # changes may have been missed. Re-arm, then have everyone re-read.
                with self._watch_lock:
                    paths = list(self._watches)
                for path in paths:
                    self._try_arm(path)
                for path in paths:
                    self._call_all(path, self._callbacks(path))

    def _try_arm(self, path: str) -> None:
        if not self._client.connected:
            # Its reconnection is still ahead in the queue and re-arms every path; retrying here
            # would only hold up the events behind this one.
            return
        try:
            self._arm(path)
        except StoreUnavailable:
            log.info("could not re-arm the watch on %s; it will be on the next reconnection", path)

    @staticmethod
    def _call_all(path: str, callbacks: list[WatchCallback]) -> None:
        for callback in callbacks:
            try:
                callback(path)
            except Exception:
                log.exception("metadata watch callback for %s raised", path)
