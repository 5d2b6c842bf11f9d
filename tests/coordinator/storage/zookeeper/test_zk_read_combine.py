"""Read combining (``zk_combine.ReadCombiner``) on a real ZooKeeper: concurrent reads share one
``multiRead`` (a consistent read's sync in front of it), and each call still gets exactly the
nodes it would read alone.

To make calls meet deterministically, the first ``MAX_IN_FLIGHT`` read requests are held before
they are sent (the combiner then counts them as in flight) until the others are queued behind.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.exceptions import ConnectionLoss, NoAuthError, UnimplementedError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol import serialization as wire

from harness.process import wait_until
from harness.zk_requests import fail_requests
from snapcoord.coordinator.errors import StoreUnavailable
from snapcoord.coordinator.storage.metadata import Node
from snapcoord.coordinator.storage.zookeeper import multiread
from snapcoord.coordinator.storage.zookeeper.combine import MAX_IN_FLIGHT, ReadCombiner
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

WAIT_S = 30.0


@pytest.fixture
def store(zk_uri: str) -> Iterator[ZooKeeperMetadataStore]:
    s = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield s
    s.close()


class Reads:
    """Every read request the store's kazoo client sends: ``("Sync", path)``, ``("GetData", path)``
    or ``("MultiRead", paths)``, chroot removed. The first ``MAX_IN_FLIGHT`` GetData/MultiRead
    requests wait until ``release``. A ``fail_requests`` installed before acts behind it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: ZooKeeperMetadataStore) -> None:
        client = store.kazoo
        chroot = client.chroot
        self.log: list[tuple[str, Any]] = []
        self.held = threading.Semaphore(0)
        self._release = threading.Event()
        self._reads = 0
        real_call = client._call

        def call(request: Any, async_object: Any) -> Any:
            if isinstance(request, wire.Sync):
                self.log.append(("Sync", request.path.removeprefix(chroot) or "/"))
            elif isinstance(request, wire.GetData):
                self.log.append(("GetData", request.path.removeprefix(chroot)))
            elif isinstance(request, multiread.MultiRead):
                self.log.append(("MultiRead", tuple(p.removeprefix(chroot) for p in request.paths)))
            else:
                return real_call(request, async_object)
            if not isinstance(request, wire.Sync):
                self._reads += 1
                if self._reads <= MAX_IN_FLIGHT:  # only ever a caller's thread, never kazoo's
                    self.held.release()
                    assert self._release.wait(WAIT_S)
            return real_call(request, async_object)

        monkeypatch.setattr(client, "_call", call)

    def release(self) -> None:
        self._release.set()


def read_together(
    store: ZooKeeperMetadataStore, reads: Reads, calls: list[Callable[[], dict[str, Node | None]]]
) -> list[dict[str, Node | None] | BaseException]:
    """``MAX_IN_FLIGHT`` reads of their own go out (held), then ``calls`` queue behind them, then
    all complete; returns each call's nodes or error."""
    outcomes: list[dict[str, Node | None] | BaseException] = [{} for _ in calls]
    for i in range(MAX_IN_FLIGHT):
        store.create(f"/first{i}", b"first")

    def run(i: int, call: Callable[[], dict[str, Node | None]]) -> None:
        try:
            outcomes[i] = call()
        except BaseException as e:  # recorded and asserted by the test
            outcomes[i] = e

    # One thread at a time, each in flight or queued before the next starts: the order of the
    # requests and of the paths in the combined one is the order of ``calls``.
    firsts = [threading.Thread(target=store.get, args=(f"/first{i}",)) for i in range(MAX_IN_FLIGHT)]
    for t in firsts:
        t.start()
        assert reads.held.acquire(timeout=WAIT_S)
    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for queued, t in enumerate(threads, start=1):
        t.start()
        wait_until(
            lambda queued=queued: len(store._reads._queue) == queued,  # type: ignore[misc]
            timeout=WAIT_S,
            interval=0.002,
            what="the read to queue",
        )
    reads.release()
    for t in [*firsts, *threads]:
        t.join(WAIT_S)
        assert not t.is_alive()
    return outcomes


def alone(store: ZooKeeperMetadataStore, paths: list[str]) -> dict[str, Node | None]:
    """The nodes as single gets read them."""
    return {p: store.get(p) for p in paths}


def test_reads_that_meet_go_out_as_one_multiread_each_node_once(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in "abc":
        store.create(f"/{name}", name.encode())
    store.set("/b", b"b1", version=0)
    expected = alone(store, ["/a", "/b", "/c", "/missing"])
    reads = Reads(monkeypatch, store)
    outcomes = read_together(
        store,
        reads,
        [
            lambda: {"/a": store.get("/a")},
            lambda: store.get_many(["/b", "/missing"]),
            lambda: store.get_many(["/a", "/c", "/b"]),
        ],
    )
    assert outcomes == [
        {"/a": expected["/a"]},
        {"/b": expected["/b"], "/missing": None},
        {p: expected[p] for p in ("/a", "/c", "/b")},
    ]
    # Those in flight alone (a plain get each), the three queued behind them in one multiRead
    # that reads each node once.
    assert reads.log == [
        *[("GetData", f"/first{i}") for i in range(MAX_IN_FLIGHT)],
        ("MultiRead", ("/a", "/b", "/missing", "/c")),
    ]
    assert store._reads.combined == 1


def test_a_consistent_read_puts_one_sync_in_front_of_the_batch(
    store: ZooKeeperMetadataStore, zk_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync goes out after every queued call arrived, right before the batch's read: a write
    another session (another replica) made before the calls began is seen, by the synced calls and
    by the plain read sharing their batch."""
    other = ZooKeeperMetadataStore.from_uri(zk_uri)
    try:
        other.create("/s", b"v0")
        reads = Reads(monkeypatch, store)
        other.set("/s", b"v1", version=0)
        outcomes = read_together(
            store,
            reads,
            [
                lambda: store.synced_get_many("/", ["/s"]),
                lambda: {"/s": store.get("/s")},
                lambda: store.synced_get_many("/", ["/s", "/absent"]),
            ],
        )
    finally:
        other.close()
    for outcome in outcomes:
        assert isinstance(outcome, dict)
        node = outcome["/s"]
        assert node is not None and (node.data, node.version) == (b"v1", 1)
    assert outcomes[2] == {"/s": outcomes[2]["/s"], "/absent": None}  # type: ignore[index]
    assert reads.log[MAX_IN_FLIGHT:] == [("Sync", "/"), ("MultiRead", ("/s", "/absent"))]


def test_a_failed_sync_fails_the_synced_reads_only(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/p", b"plain")

    fail_requests(store, monkeypatch, wire.Sync, NoAuthError)
    reads = Reads(monkeypatch, store)
    outcomes = read_together(
        store,
        reads,
        [lambda: {"/p": store.get("/p")}, lambda: store.synced_get_many("/", ["/p"])],
    )
    plain = outcomes[0]
    assert isinstance(plain, dict) and plain["/p"] is not None and plain["/p"].data == b"plain"
    assert isinstance(outcomes[1], StoreUnavailable) and "refused access" in str(outcomes[1])
    assert reads.log[MAX_IN_FLIGHT:] == [("Sync", "/"), ("GetData", "/p")]


def test_a_node_refused_to_one_call_does_not_fail_the_others(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each node answers on its own in a multiRead: an ACL refusing one fails the calls that read
    it and no other."""
    for name in ("ok", "secret", "also"):
        store.create(f"/{name}", name.encode())
    original = multiread.MultiRead.deserialize
    reads = Reads(monkeypatch, store)

    def refuse_secret(buffer: bytes, offset: int) -> list[multiread.Reply]:
        replies = original(buffer, offset)
        request = reads.log[-1]
        return [NoAuthError() if p == "/secret" else r for p, r in zip(request[1], replies, strict=True)]

    monkeypatch.setattr(multiread.MultiRead, "deserialize", staticmethod(refuse_secret))
    outcomes = read_together(
        store,
        reads,
        [
            lambda: store.get_many(["/ok", "/also"]),
            lambda: store.get_many(["/secret", "/ok"]),
            lambda: {"/also": store.get("/also")},
        ],
    )
    assert reads.log[MAX_IN_FLIGHT:] == [("MultiRead", ("/ok", "/also", "/secret"))]
    first, refused, third = outcomes
    assert isinstance(first, dict) and {p: n.data if n else None for p, n in first.items()} == {
        "/ok": b"ok",
        "/also": b"also",
    }
    assert isinstance(refused, StoreUnavailable) and "refused access" in str(refused)
    assert isinstance(third, dict) and third["/also"] is not None and third["/also"].data == b"also"


def test_a_lost_reply_is_read_again_by_each_call(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read is never in doubt: when the combined read's reply is lost, each call reads again
    and gets its nodes."""
    store.create("/x", b"x")
    store.create("/y", b"y")
    expected = alone(store, ["/x", "/y"])
    lost = fail_requests(store, monkeypatch, multiread.MultiRead, ConnectionLoss, times=1)
    reads = Reads(monkeypatch, store)
    outcomes = read_together(store, reads, [lambda: {"/x": store.get("/x")}, lambda: store.get_many(["/y"])])
    assert outcomes == [{"/x": expected["/x"]}, {"/y": expected["/y"]}]
    assert len(lost) == 1
    assert reads.log[MAX_IN_FLIGHT] == ("MultiRead", ("/x", "/y"))
    assert sorted(reads.log[MAX_IN_FLIGHT + 1 :]) == [("GetData", "/x"), ("GetData", "/y")]


def test_a_combined_read_stays_within_a_multireads_paths(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued calls go out together only up to ``MAX_PATHS`` nodes per request."""
    step = multiread.MAX_PATHS // 2 + 1  # two calls of this many do not fit in one request
    groups = [[f"/g{g}/{i}" for i in range(step)] for g in range(3)]
    for g in range(3):
        store.create(f"/g{g}", b"")
        for path in groups[g][::3]:
            store.create(path, path.encode())
    expected = [alone(store, paths) for paths in groups]
    reads = Reads(monkeypatch, store)
    outcomes = read_together(store, reads, [functools.partial(store.get_many, paths) for paths in groups])
    assert outcomes == expected
    sent = reads.log[MAX_IN_FLIGHT:]
    assert [kind for kind, _ in sent] == ["MultiRead"] * 3
    assert sorted(len(paths) for _, paths in sent) == [step] * 3


def test_a_server_without_multiread_reads_each_call_with_gets(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper before 3.6 refuses the combined multiRead: every call of the batch reads its
    nodes with gets instead, and the store does not try multiRead again."""
    store.create("/u", b"u")
    store.create("/v", b"v")
    expected = alone(store, ["/u", "/v", "/w"])

    fail_requests(store, monkeypatch, multiread.MultiRead, UnimplementedError)
    reads = Reads(monkeypatch, store)
    outcomes = read_together(
        store,
        reads,
        [
            lambda: {"/u": store.get("/u")},
            lambda: store.get_many(["/v", "/w"]),
            lambda: {"/v": store.get("/v")},
        ],
    )
    assert outcomes == [{"/u": expected["/u"]}, {"/v": expected["/v"], "/w": None}, {"/v": expected["/v"]}]
    assert reads.log[MAX_IN_FLIGHT] == ("MultiRead", ("/u", "/v", "/w"))
    assert sorted(reads.log[MAX_IN_FLIGHT + 1 :]) == [
        ("GetData", "/u"),
        ("GetData", "/v"),
        ("GetData", "/v"),
        ("GetData", "/w"),
    ]
    assert store._multi_read is False


def test_a_request_never_answered_frees_its_place_when_its_waiter_gives_up(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kazoo can drop a request without an answer (one sent as the session expires): its waiter
    gives up at its deadline, and the place it held in flight is free again, so that later reads
    are sent instead of queueing for good."""
    store.create("/d", b"d")
    client = store.kazoo
    real_call = client._call
    dropped: list[Any] = []

    def drop_first(request: Any, async_object: Any) -> Any:
        if isinstance(request, wire.GetData) and not dropped:
            dropped.append(async_object)  # never sent, never answered
            return True
        return real_call(request, async_object)

    monkeypatch.setattr(client, "_call", drop_first)
    combiner = ReadCombiner(client, max_in_flight=1)
    path = f"{client.chroot}/d"
    with pytest.raises(KazooTimeoutError):
        combiner.submit([path]).get(timeout=0.05)
    assert len(dropped) == 1
    ((data, stat),) = combiner.submit([path]).get(timeout=WAIT_S)
    assert (data, stat.version) == (b"d", 0)
    dropped[0].set(("late", None))  # a reply after all: ignored, the place is not freed twice
    assert combiner._in_flight == 0


def test_a_reply_that_does_not_parse_fails_its_calls_and_not_the_session(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error raised while handing out a reply would run on kazoo's connection thread and end
    the session's loop for good: the calls fail instead, and the store goes on."""
    store.create("/k", b"k")
    original = multiread.MultiRead.deserialize

    def one_short(buffer: bytes, offset: int) -> list[multiread.Reply]:
        return original(buffer, offset)[:-1]

    monkeypatch.setattr(multiread.MultiRead, "deserialize", staticmethod(one_short))
    with pytest.raises(StoreUnavailable, match="MarshallingError"):
        store.get_many(["/k", "/l"])
    monkeypatch.undo()
    node = store.get("/k")
    assert node is not None and node.data == b"k"
    assert store._reads._in_flight == 0


class ClosedClient:
    """A kazoo client whose requests fail at once, as a closed one's do, except those it holds."""

    def __init__(self) -> None:
        self.held: list[Any] = []
        self.closed = False

    def _call(self, request: Any, async_object: Any) -> bool:
        if self.closed:
            async_object.set_exception(ConnectionLoss())
            return False
        self.held.append(async_object)
        return True


def test_a_deep_queue_failing_at_once_drains_without_recursion() -> None:
    """When a closed or expiring client fails each request inside ``_call``, the queue drains in a
    loop: recursing took a few stack frames per batch and overflowed at about 165 batches."""
    client = ClosedClient()
    combiner = ReadCombiner(client, max_in_flight=1)
    first = combiner.submit(["/first"])
    batches = [[f"/b{b}/{i}" for i in range(multiread.MAX_PATHS)] for b in range(400)]
    queued = [combiner.submit(paths) for paths in batches]  # a full batch each
    client.closed = True
    client.held[0].set_exception(ConnectionLoss())
    for pending in [first, *queued]:
        with pytest.raises(ConnectionLoss):
            pending.get(timeout=WAIT_S)
    assert combiner._in_flight == 0 and not combiner._queue
