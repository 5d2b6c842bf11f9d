"""Fault injection against real servers: ZooKeeper connection loss, session expiry, network cuts.

The ZooKeeper helpers follow kazoo's own test harness. ``drop_zk_connection`` uses kazoo's testing hook
(the connection thread raises ConnectionDropped as if the socket broke, closes it and reconnects), and
``expire_zk_session`` uses the classic server-side technique: a second client attaches to the same session
with its id and password (the server closes the first client's connection) and then closes the session, so
the original client learns on reconnect that its session is gone, exactly as after a real expiry.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.protocol.connection import _CONNECTION_DROP

from harness.ports import LOOPBACK

T = TypeVar("T")


class _StateWatch:
    """Records ``client``'s state changes; ``seen`` is set on state ``first``, ``back`` on a later CONNECTED
    that ``then_ok`` accepts.

    kazoo calls listeners from its connection thread, so the listener only records and sets events.
    """

    def __init__(self, client: KazooClient, first: str, then_ok: Callable[[], bool]) -> None:
        self.client = client
        self.first = first
        self.then_ok = then_ok
        self.states: list[str] = []
        self.seen = threading.Event()
        self.back = threading.Event()
        client.add_listener(self._listener)

    def _listener(self, state: str) -> None:
        self.states.append(state)
        if state == self.first:
            self.seen.set()
        elif self.seen.is_set() and state == KazooState.CONNECTED and self.then_ok():
            self.back.set()

    def close(self) -> None:
        self.client.remove_listener(self._listener)


def drop_zk_connection(client: KazooClient, *, timeout: float = 30.0, wait_reconnect: bool = True) -> None:
    """Break ``client``'s TCP connection: it goes SUSPENDED, reconnects and keeps its session.

    Returns once the client is CONNECTED again (or right after SUSPENDED with ``wait_reconnect=False``).
    The session id is unchanged afterwards; ephemeral nodes and watches survive.
    """
    if not client.connected or client.client_id is None:
        raise RuntimeError("drop_zk_connection needs a connected client")
    session_id = client.client_id[0]
    watch = _StateWatch(
        client,
        KazooState.SUSPENDED,
        lambda: client.client_id is not None and client.client_id[0] == session_id,
    )
    try:
        # The request is queued like any other; the connection thread raises ConnectionDropped when it
        # picks it up and closes the socket, which is the code path of a connection that broke under it.
        client._call(_CONNECTION_DROP, None)
        if not watch.seen.wait(timeout):
            raise TimeoutError(f"client did not go SUSPENDED within {timeout}s (states: {watch.states})")
        if wait_reconnect and not watch.back.wait(timeout):
            raise TimeoutError(
                f"client did not reconnect to its session within {timeout}s (states: {watch.states})"
            )
    finally:
        watch.close()


def expire_zk_session(client: KazooClient, *, timeout: float = 30.0, wait_reconnect: bool = True) -> int:
    """Make ZooKeeper expire ``client``'s session; wait until the client sees LOST.

    Ephemeral nodes of the old session are gone once this returns. With ``wait_reconnect`` (the default)
    it also waits until kazoo has established its new session. Returns the old session id.
    """
    if not client.connected or client.client_id is None:
        raise RuntimeError("expire_zk_session needs a connected client")
    session_id, password = client.client_id
    watch = _StateWatch(
        client, KazooState.LOST, lambda: client.client_id is not None and client.client_id[0] != session_id
    )
    hosts = ",".join(f"{host}:{port}" for host, port in client.hosts)
    deadline = time.monotonic() + timeout
    try:
        while not watch.seen.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"client did not see its session LOST within {timeout}s ({watch.states})")
            # Attaching to the session makes the server close the original client's connection; closing
            # the intruder then closes the session itself, so the original client's reconnect is told
            # "expired". If the original client reconnects (after kazoo's ~0.1 s backoff) before the
            # intruder's close gets through, it takes the session back and nothing expires: try again.
            intruder = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=10)
            try:
                intruder.start(timeout=max(1.0, remaining))
                intruder.stop()
            except Exception:
                pass  # e.g. the session is already gone and the server refused it: the watch decides
            finally:
                intruder.close()
            watch.seen.wait(min(5.0, max(0.0, deadline - time.monotonic())))
        if wait_reconnect and not watch.back.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"client did not get a new session within {timeout}s ({watch.states})")
    finally:
        watch.close()
    return int(session_id)


class _Command:
    """A request from a test thread to the loop thread; ``done`` is set when it was carried out."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = threading.Event()
        self.error: OSError | None = None


class _Pipe:
    """One proxied connection: the accepted client socket and the upstream socket, with send buffers."""

    __slots__ = ("down", "down_eof", "to_down", "to_up", "up", "up_eof")

    def __init__(self, down: socket.socket, up: socket.socket) -> None:
        self.down, self.up = down, up
        self.to_down = bytearray()  # bytes read from upstream, waiting to be written to the client
        self.to_up = bytearray()
        self.down_eof = False  # the client half-closed (its bytes are all in to_up)
        self.up_eof = False


_MAX_BUFFER = 1 << 20  # stop reading from a side while the other side has this much pending


class TcpProxy:
    """A loopback TCP proxy to ``target_host:target_port`` that tests can cut and restore.

    Point a client or a coordinator subprocess at ``listen_port`` instead of the real server. ``cut()``
    resets every open connection and refuses new ones (the listening socket is closed, so connects get
    ECONNREFUSED, like a server that is down); ``restore()`` listens on the same port again.

    One background thread runs a selector loop and owns every socket, so cut/restore/close never race
    with the data pumps: they post a command and wait for the loop to carry it out.
    """

    def __init__(
        self, target_host: str, target_port: int, *, listen_host: str = LOOPBACK, listen_port: int = 0
    ) -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._commands: list[_Command] = []
        self._cmd_lock = threading.Lock()
        self._pipes: dict[socket.socket, _Pipe] = {}
        self._listener: socket.socket | None = None
        self._closed = False
        self.accepted_total = 0
        self._listen(listen_port)
        self._thread = threading.Thread(target=self._run, name=f"TcpProxy:{self.listen_port}", daemon=True)
        self._thread.start()

    # -- public API --------------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def is_cut(self) -> bool:
        return self._listener is None

    @property
    def connection_count(self) -> int:
        return len(self._pipes)

    def cut(self) -> None:
        """Reset all open connections and refuse new ones until restore()."""
        self._command("cut")

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self._command("restore")

    def close(self) -> None:
        """Close everything and stop the thread. Idempotent."""
        if self._closed:
            return
        self._command("close")
        self._thread.join(timeout=10)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- loop-thread side --------------------------------------------------------------------------------
    def _command(self, name: str) -> None:
        if self._closed:
            raise RuntimeError("TcpProxy is closed")
        cmd = _Command(name)
        with self._cmd_lock:
            self._commands.append(cmd)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if not cmd.done.wait(10):
            raise TimeoutError(
                f"TcpProxy did not carry out {name!r} (loop thread alive: {self._thread.is_alive()})"
            )
        if cmd.error is not None:
            raise cmd.error

    def _listen(self, port: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((self.listen_host, port))
        except OSError:
            s.close()
            raise
        s.listen(128)
        s.setblocking(False)
        self.listen_port = int(s.getsockname()[1])
        self._listener = s
        self._sel.register(s, selectors.EVENT_READ, None)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._sel.unregister(self._listener)
            self._listener.close()
            self._listener = None

    def _run(self) -> None:
        while not self._closed:
            for key, events in self._sel.select(timeout=1.0):
                sock = key.fileobj
                if sock is self._wake_r:
                    self._handle_commands()
                elif sock is self._listener:
                    self._accept()
                else:
                    assert isinstance(sock, socket.socket)
                    pipe = self._pipes.get(sock)
                    if pipe is not None:  # may have been closed earlier in this round
                        self._service(pipe, sock, events)
            self._update_interest()

    def _handle_commands(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        with self._cmd_lock:
            commands, self._commands = self._commands, []
        for cmd in commands:
            name = cmd.name
            try:
                if name == "cut":
                    self._stop_listening()
                    for pipe in set(self._pipes.values()):
                        self._close_pipe(pipe, reset=True)
                elif name == "restore":
                    if self._listener is None:
                        self._listen(self.listen_port)
                elif name == "close":
                    self._stop_listening()
                    for pipe in set(self._pipes.values()):
                        self._close_pipe(pipe, reset=True)
                    self._closed = True
            except OSError as e:  # e.g. restore() finds the port taken: report it to the caller
                cmd.error = e
            finally:
                cmd.done.set()

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            down, _ = self._listener.accept()
        except OSError:  # EAGAIN, or a client that gave up while queued (ECONNABORTED)
            return
        self.accepted_total += 1
        try:
            # Loopback targets answer or refuse at once; the short timeout only bounds a pathological case.
            up = socket.create_connection(self.target, timeout=2)
        except OSError:
            _reset(down)  # the target is down: the client sees a reset, as if it had been refused
            return
        try:
            for s in (down, up):
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            _reset(down)
            _reset(up)
            return
        pipe = _Pipe(down, up)
        self._pipes[down] = pipe
        self._pipes[up] = pipe
        self._sel.register(down, selectors.EVENT_READ, None)
        self._sel.register(up, selectors.EVENT_READ, None)

    def _service(self, pipe: _Pipe, sock: socket.socket, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                self._flush(pipe)
            if events & selectors.EVENT_READ:
                data = sock.recv(65536)
                is_down = sock is pipe.down
                if data:
                    (pipe.to_up if is_down else pipe.to_down).extend(data)
                    self._flush(pipe)
                elif is_down:
                    pipe.down_eof = True
                else:
                    pipe.up_eof = True
            # Propagate half-closes once everything read before the EOF has been delivered.
            if pipe.down_eof and not pipe.to_up:
                _shutdown_write(pipe.up)
            if pipe.up_eof and not pipe.to_down:
                _shutdown_write(pipe.down)
            if pipe.down_eof and pipe.up_eof and not pipe.to_up and not pipe.to_down:
                self._close_pipe(pipe, reset=False)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            # A reset on one side: reset the other side too, as a real broken path would look.
            self._close_pipe(pipe, reset=True)

    def _flush(self, pipe: _Pipe) -> None:
        for buf, dst in ((pipe.to_up, pipe.up), (pipe.to_down, pipe.down)):
            if buf:
                try:
                    sent = dst.send(buf)
                except (BlockingIOError, InterruptedError):
                    continue
                del buf[:sent]

    def _update_interest(self) -> None:
        for pipe in set(self._pipes.values()):
            for sock, eof, pending_out, peer_pending in (
                (pipe.down, pipe.down_eof, pipe.to_down, pipe.to_up),
                (pipe.up, pipe.up_eof, pipe.to_up, pipe.to_down),
            ):
                events = 0
                if not eof and len(peer_pending) < _MAX_BUFFER:
                    events |= selectors.EVENT_READ
                if pending_out:
                    events |= selectors.EVENT_WRITE
                try:
                    if events:
                        self._sel.modify(sock, events, None)
                    else:
                        # Nothing to wait for on this socket right now (EOF seen, nothing to write).
                        self._sel.unregister(sock)
                except KeyError:
                    if events:
                        self._sel.register(sock, events, None)

    def _close_pipe(self, pipe: _Pipe, *, reset: bool) -> None:
        for sock in (pipe.down, pipe.up):
            self._pipes.pop(sock, None)
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            if reset:
                _reset(sock)
            else:
                sock.close()


def _shutdown_write(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0, so the peer gets a RST (an abrupt failure) instead of an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


__all__ = ["TcpProxy", "drop_zk_connection", "expire_zk_session"]


class SimulatedCrash(BaseException):
    """The process dies here: no cleanup code runs (BaseException skips ``except Exception``)."""


def call_while_blob_deletes_fail(blobs: Any, failure: str, call: Callable[[], T]) -> T | None:
    """Run ``call`` while ``blobs.delete`` fails, then make the deletes work again: as an S3
    outage does (``"unavailable"``: StoreUnavailable, which the call must survive; its result is
    returned), or as a process that dies there (``"crash"``: the call must end in
    ``SimulatedCrash``; None)."""
    import pytest

    from snapcoord.coordinator.errors import StoreUnavailable

    def failing(key: str) -> None:
        if failure == "crash":
            raise SimulatedCrash
        raise StoreUnavailable(f"blob store down (test): cannot delete {key}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blobs, "delete", failing)
        if failure != "crash":
            return call()
        with pytest.raises(SimulatedCrash):
            call()
        return None


class LaggingReads:
    """A metadata store whose ``get`` / ``get_many`` of the ``frozen`` paths answer the nodes given
    (what they held before) until a sync (``sync``, ``synced_get_many``): a ZooKeeper server that
    has not applied a write yet.
    Everything else goes to ``inner``."""

    def __init__(self, inner: Any, frozen: dict[str, Any]) -> None:
        self._inner = inner
        self.frozen = dict(frozen)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get(self, path: str) -> Any:
        return self.frozen[path] if path in self.frozen else self._inner.get(path)

    def get_many(self, paths: Any) -> dict[str, Any]:
        return {p: self.get(p) for p in paths}

    def sync(self, path: str = "/") -> None:
        self.frozen.clear()
        self._inner.sync(path)

    def synced_get_many(self, sync_path: str, paths: Any) -> dict[str, Any]:
        self.sync(sync_path)
        return self.get_many(paths)
