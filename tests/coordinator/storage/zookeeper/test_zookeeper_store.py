"""ZooKeeper-specific behaviour: connection loss, session expiry, outages and lost replies.

The lost-reply tests wrap one kazoo call of the store's client so that the request reaches the
server (or not) while the reply is replaced by ConnectionLoss: exactly what a connection that breaks
after the server applied a write looks like to the client.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol import serialization as wire

from harness.faults import drop_zk_connection, expire_zk_session
from harness.isolation import chroot_of
from harness.zk_requests import fail_requests
from harness.zookeeper import ZooKeeperServer
from snapcoord.coordinator.errors import (
    CommitOutcomeUnknown,
    StoreUnavailable,
)
from snapcoord.coordinator.storage.backends import MetadataOptions, open_metadata_store
from snapcoord.coordinator.storage.metadata import Create, SetData
from snapcoord.coordinator.storage.zookeeper.request_size import MAX_CHROOT_BYTES
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

WAIT_S = 30.0
#: A short retry deadline for the tests that exhaust it.
SHORT = MetadataOptions(zk_retry_deadline_ms=1_000)


class Recorder:
    """Collects callback arguments from any thread; tests wait for a count, never for a time."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._cond = threading.Condition()

    def __call__(self, arg: Any) -> None:
        with self._cond:
            self.calls.append(arg)
            self._cond.notify_all()

    def wait_for(self, count: int) -> list[Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.calls) >= count, timeout=WAIT_S):
                raise AssertionError(f"expected {count} calls, got {self.calls}")
            return list(self.calls)


@pytest.fixture
def store(zk_uri: str) -> Iterator[ZooKeeperMetadataStore]:
    s = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield s
    s.close()


def test_uri_and_chroot(zk_uri: str, zk_hosts: str) -> None:
    chroot = zk_uri.removeprefix(f"zk://{zk_hosts}")
    assert chroot.count("/") >= 2  # nested: its parents do not exist either
    store = ZooKeeperMetadataStore.from_uri(zk_uri + "/")
    try:
        assert store.uri == zk_uri
        store.create("/inside", b"x")
        raw = KazooClient(hosts=zk_hosts)
        raw.start()
        try:
            assert raw.get(f"{chroot}/inside")[0] == b"x"
        finally:
            raw.stop()
            raw.close()
        with pytest.raises(AttributeError):
            store.kazoo = None  # type: ignore[misc]
    finally:
        store.close()


@pytest.mark.parametrize(
    "uri", ["zk://", "zk:///chroot", "zk://u:p@h:2181/c", "zk://h:2181/a//b", "file:///x"]
)
def test_malformed_uris_are_rejected(uri: str) -> None:
    with pytest.raises(ValueError):
        ZooKeeperMetadataStore.from_uri(uri)


def test_a_chroot_may_be_as_long_as_the_request_budgets_assume_and_no_longer(
    zk_uri: str, zk_hosts: str
) -> None:
    """The store (opened by URI in tests and benchmarks too, without config's check) keeps the
    limit config keeps: under a longer chroot its requests could exceed the sizes zk_budget
    computed, and a legal call be refused as too large. The refusal comes before connecting."""
    at_limit = chroot_of(zk_uri) + "/"  # below the test's own chroot, which is removed after it
    at_limit += "é" * ((MAX_CHROOT_BYTES - len(at_limit)) // 2)  # counted in UTF-8 bytes
    at_limit += "c" * (MAX_CHROOT_BYTES - len(at_limit.encode()))
    assert len(at_limit.encode()) == MAX_CHROOT_BYTES and "é" in at_limit
    store = open_metadata_store(f"zk://{zk_hosts}{at_limit}")
    try:
        store.transaction([Create("/inside", b"x")])
        node = store.get("/inside")
        assert node is not None and node.data == b"x"
    finally:
        store.close()
    with pytest.raises(ValueError, match=rf"chroot is {MAX_CHROOT_BYTES + 1} bytes long .* at most"):
        open_metadata_store(
            f"zk://127.0.0.1:1{at_limit}c", options=MetadataOptions(zk_connect_timeout_ms=500)
        )


def test_open_fails_when_no_server_answers(private_zk_server: ZooKeeperServer) -> None:
    private_zk_server.stop()
    with pytest.raises(StoreUnavailable, match="cannot connect"):
        ZooKeeperMetadataStore.from_uri(
            f"zk://{private_zk_server.hosts}/c", MetadataOptions(zk_connect_timeout_ms=500)
        )


# --- connection loss and session expiry ------------------------------------------------------------


def test_dropped_connection(store: ZooKeeperMetadataStore) -> None:
    states, watched = Recorder(), Recorder()
    store.add_state_listener(states)
    store.create("/w", b"0")
    store.watch("/w", watched)

    drop_zk_connection(store.kazoo)

    assert states.wait_for(2) == [False, True]
    # Events may have been missed while disconnected: every watch is called once to re-read.
    assert watched.wait_for(1) == ["/w"]
    assert store.is_usable()
    assert store.set("/w", b"1", version=0).version == 1
    # And the watch was re-armed: later changes are seen again.
    assert watched.wait_for(2) == ["/w", "/w"]


def test_session_expiry(store: ZooKeeperMetadataStore) -> None:
    states, watched, absent = Recorder(), Recorder(), Recorder()
    store.add_state_listener(states)
    store.create("/w", b"0")
    store.watch("/w", watched)
    store.watch("/later", absent)
    old_session = store.kazoo.client_id[0]

    expire_zk_session(store.kazoo)

    assert store.kazoo.client_id[0] != old_session
    assert states.wait_for(2) == [False, True]
    assert watched.wait_for(1) == ["/w"]
    assert absent.wait_for(1) == ["/later"]
    # The new session has the watches too, including on a node that did not exist.
    store.set("/w", b"1", version=0)
    assert watched.wait_for(2) == ["/w", "/w"]
    store.create("/later", b"")
    assert absent.wait_for(2) == ["/later", "/later"]
    assert store.get("/w") is not None and store.is_usable()


def test_calls_while_the_server_is_down(private_zk_server: ZooKeeperServer) -> None:
    store = ZooKeeperMetadataStore.from_uri(f"zk://{private_zk_server.hosts}/outage", SHORT)
    try:
        states, watched = Recorder(), Recorder()
        store.add_state_listener(states)
        store.create("/n", b"before")
        store.watch("/n", watched)

        private_zk_server.stop()
        assert states.wait_for(1) == [False]
        assert not store.is_usable()
        reads: list[Callable[[], object]] = [
            lambda: store.get("/n"),
            lambda: store.children("/"),
            lambda: store.sync(),
        ]
        writes: list[Callable[[], object]] = [
            lambda: store.set("/n", b"during", version=0),
            lambda: store.create("/m", b"during"),
            lambda: store.delete("/n"),
            lambda: store.transaction([SetData("/n", b"during", 0)]),
        ]
        for call in reads + writes:
            with pytest.raises(StoreUnavailable) as info:
                call()
            # Never sent while disconnected, so not in doubt: plainly unavailable.
            assert type(info.value) is StoreUnavailable
            assert private_zk_server.hosts in str(info.value)
        with pytest.raises(StoreUnavailable):
            store.watch("/other", Recorder())

        private_zk_server.start()
        assert states.wait_for(2) == [False, True]
        assert watched.wait_for(1) == ["/n"]
        # None of the refused writes happened later behind our back.
        node = store.get("/n")
        assert node is not None and node.data == b"before" and node.version == 0
        assert store.get("/m") is None
        assert store.set("/n", b"after", version=0).version == 1
    finally:
        store.close()


# --- lost replies -------------------------------------------------------------------------------


def lose_replies(
    monkeypatch: pytest.MonkeyPatch,
    store: ZooKeeperMetadataStore,
    method: str,
    *,
    before_reply: Callable[..., None] | None = None,
    times: int | None = 1,
) -> list[tuple[Any, ...]]:
    """Make the store's next ``times`` calls of ``kazoo.<method>`` lose their reply (``create``: the
    store's own ``_create_async``, which sends kazoo's create request without kazoo's extra hop).

    ``before_reply(real, *args)`` runs what reached the server (by default: the request itself; pass
    a no-op for a request lost on the way). Returns the arguments of every call made.
    """
    client = store.kazoo
    target: Any = store if method == "_create_async" else client
    real = getattr(target, method)
    calls: list[tuple[Any, ...]] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if times is not None and len(calls) > times:
            return real(*args, **kwargs)
        if before_reply is None:
            real(*args, **kwargs).get()
        else:
            before_reply(*args)
        lost = client.handler.async_result()
        lost.set_exception(ConnectionLoss())
        return lost

    monkeypatch.setattr(target, method, wrapper)
    return calls


def test_retried_create_that_had_succeeded(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = lose_replies(monkeypatch, store, "_create_async")
    node = store.create("/c", b"mine")
    assert len(calls) == 2  # the retry met NodeExists, and the node turned out to be ours
    assert node.data == b"mine" and node.version == 0
    assert store.get("/c") == node


def test_retried_create_that_another_writer_beat(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def someone_else_created(path: str, *_: Any) -> None:
        store.kazoo.create(path, b"theirs")

    lose_replies(monkeypatch, store, "_create_async", before_reply=someone_else_created)
    # From here, "theirs landed first" and "ours landed, then changed" look alike: say so.
    with pytest.raises(CommitOutcomeUnknown, match="may have created it"):
        store.create("/c", b"mine")
    node = store.get("/c")
    assert node is not None and node.data == b"theirs"


def test_retried_create_whose_request_was_lost(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = lose_replies(monkeypatch, store, "_create_async", before_reply=lambda *_: None)
    assert store.create("/c", b"mine").version == 0
    assert len(calls) == 2


def test_retried_set_that_had_succeeded(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/s", b"v0")
    calls = lose_replies(monkeypatch, store, "set_async")
    node = store.set("/s", b"v1", version=0)
    assert len(calls) == 2
    assert node.data == b"v1" and node.version == 1
    assert store.get("/s") == node


def test_retried_set_that_another_writer_beat(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/s", b"v0")

    def someone_else_set(path: str, *_: Any) -> None:
        store.kazoo.set(path, b"theirs", version=0)

    lose_replies(monkeypatch, store, "set_async", before_reply=someone_else_set)
    with pytest.raises(CommitOutcomeUnknown, match="may have been applied"):
        store.set("/s", b"mine", version=0)


def test_retried_delete_that_had_succeeded(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/d", b"")
    calls = lose_replies(monkeypatch, store, "delete_async")
    store.delete("/d", version=0)
    assert len(calls) == 2 and store.get("/d") is None


def _lose_first_transaction_reply(
    monkeypatch: pytest.MonkeyPatch, store: ZooKeeperMetadataStore, *, applied: bool
) -> None:
    """The store's first multi request loses its reply: after being applied (``applied``) or on its
    way (never sent). Hooked where every request leaves, so that it holds for a multi combined
    with others or sent alone."""
    client = store.kazoo
    real_call = client._call
    commits = itertools.count()

    def call(request: Any, async_object: Any) -> Any:
        if request.type == wire.Transaction.type and next(commits) == 0:
            if applied:  # not waited for here: this may be kazoo's connection thread, which reads it
                sent = client.handler.async_result()
                sent.rawlink(lambda _: async_object.set_exception(ConnectionLoss()))
                return real_call(request, sent)
            async_object.set_exception(ConnectionLoss())
            return True
        return real_call(request, async_object)

    monkeypatch.setattr(client, "_call", call)


def test_retried_transaction_is_reported_as_unknown(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/t", b"v0")
    _lose_first_transaction_reply(monkeypatch, store, applied=True)
    with pytest.raises(CommitOutcomeUnknown):
        store.transaction([SetData("/t", b"v1", 0), Create("/t2", b"")])
    # It had been applied, which the caller learns by re-reading.
    node = store.get("/t")
    assert node is not None and node.data == b"v1"
    assert store.get("/t2") is not None


def test_retried_transaction_whose_first_commit_was_lost_on_the_way(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/t", b"v0")
    _lose_first_transaction_reply(monkeypatch, store, applied=False)
    store.transaction([SetData("/t", b"v1", 0)])  # the retry applies it; nothing to doubt
    node = store.get("/t")
    assert node is not None and node.version == 1


def test_write_in_doubt_at_the_deadline(zk_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ZooKeeperMetadataStore.from_uri(zk_uri, SHORT)
    try:
        store.create("/n", b"")
        lose_replies(monkeypatch, store, "set_async", before_reply=lambda *_: None, times=None)
        with pytest.raises(CommitOutcomeUnknown):
            store.set("/n", b"x", version=0)
        fail_requests(store, monkeypatch, wire.GetData, ConnectionLoss)  # every read's reply is lost
        with pytest.raises(StoreUnavailable) as info:
            store.get("/n")
        assert type(info.value) is StoreUnavailable  # a read is never "in doubt"
    finally:
        store.close()
