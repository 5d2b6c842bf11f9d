"""Group commit (``zk_combine``) on a real ZooKeeper: concurrent transactions share one multi, and
each still gets exactly the answer it would get alone.

To make calls meet deterministically, the first ``MAX_IN_FLIGHT`` multi requests are held before
they are sent (the combiner then counts them as in flight) until the others are queued behind.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError as KazooBadVersion
from kazoo.exceptions import ConnectionLoss
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol import serialization as wire

from harness.process import wait_until
from snapcoord.coordinator.errors import (
    BadVersionError,
    CommitOutcomeUnknown,
    NodeExistsError,
    NoNodeError,
    TransactionFailed,
)
from snapcoord.coordinator.storage.metadata import Check, Create, Op, SetData
from snapcoord.coordinator.storage.zookeeper.combine import MAX_IN_FLIGHT, TransactionCombiner
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

WAIT_S = 30.0


@pytest.fixture
def store(zk_uri: str) -> Iterator[ZooKeeperMetadataStore]:
    s = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield s
    s.close()


class Requests:
    """Every multi request the store's kazoo client sends (its op count), holding the first
    ``hold`` until ``release``; ``lose`` makes the n-th (0-based) lose its reply after being applied."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        client: Any,
        *,
        hold: int = MAX_IN_FLIGHT,
        lose: int | None = None,
    ) -> None:
        self.sizes: list[int] = []
        self.hold = hold
        self.held = threading.Semaphore(0)
        self._release = threading.Event()
        real_call = client._call

        def call(request: Any, async_object: Any) -> Any:
            if request.type != wire.Transaction.type:
                return real_call(request, async_object)
            index = len(self.sizes)
            self.sizes.append(len(request.operations))
            if index < hold:
                self.held.release()
                assert self._release.wait(WAIT_S)
            if index == lose:
                # Applied, then the reply is lost. Not waited for here: this may be kazoo's own
                # connection thread (a combined multi is sent from there), which reads the reply.
                sent = client.handler.async_result()
                sent.rawlink(lambda _: async_object.set_exception(ConnectionLoss()))
                return real_call(request, sent)
            return real_call(request, async_object)

        monkeypatch.setattr(client, "_call", call)

    def wait_held(self) -> None:
        for _ in range(self.hold):
            assert self.held.acquire(timeout=WAIT_S)

    def release(self) -> None:
        self._release.set()


def run_together(
    store: ZooKeeperMetadataStore, requests: Requests, others: list[list[Op]]
) -> list[BaseException | None]:
    """``MAX_IN_FLIGHT`` transactions of their own go out (held), then ``others`` queue behind
    them, then all complete; returns each of ``others``' errors (None: committed)."""
    outcomes: list[BaseException | None] = [None] * len(others)
    for i in range(MAX_IN_FLIGHT):
        store.create(f"/first{i}", b"")

    def commit(i: int, ops: list[Op]) -> None:
        try:
            store.transaction(ops)
        except BaseException as e:  # recorded and asserted by the test
            outcomes[i] = e

    firsts = [
        threading.Thread(target=store.transaction, args=([SetData(f"/first{i}", b"1", 0)],))
        for i in range(MAX_IN_FLIGHT)
    ]
    for t in firsts:
        t.start()
    requests.wait_held()
    threads = [threading.Thread(target=commit, args=(i, ops)) for i, ops in enumerate(others)]
    for t in threads:
        t.start()
    wait_until(
        lambda: len(store._combiner._queue) == len(others),
        timeout=WAIT_S,
        interval=0.005,
        what="the others to queue",
    )
    requests.release()
    for t in [*firsts, *threads]:
        t.join(WAIT_S)
        assert not t.is_alive()
    for i in range(MAX_IN_FLIGHT):
        node = store.get(f"/first{i}")
        assert node is not None and node.version == 1
    return outcomes


def test_transactions_that_meet_go_out_as_one_multi(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(4):
        store.create(f"/n{i}", b"v0")
    requests = Requests(monkeypatch, store.kazoo)
    outcomes = run_together(
        store, requests, [[SetData(f"/n{i}", b"v1", 0), Create(f"/n{i}/child", b"c")] for i in range(4)]
    )
    assert outcomes == [None] * 4
    # Those in flight alone, the four queued behind them in one multi.
    assert requests.sizes == [*[1] * MAX_IN_FLIGHT, 8]
    assert store._combiner.combined == 1
    for i in range(4):
        node = store.get(f"/n{i}")
        assert node is not None and (node.data, node.version) == (b"v1", 1)
        assert store.get(f"/n{i}/child") is not None


def test_a_failing_transaction_fails_alone_and_the_others_commit(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/a", b"")
    store.set("/a", b"moved", version=0)
    store.create("/b", b"")
    requests = Requests(monkeypatch, store.kazoo)
    outcomes = run_together(
        store,
        requests,
        [
            [SetData("/b", b"ok", 0)],
            [Create("/x", b"mine"), Check("/missing", 0)],  # fails at its op 1
            [Create("/x", b"theirs")],  # met /x from the failing one's rolled-back create
            [Check("/a", 0)],  # stale: /a is at version 1
        ],
    )
    assert outcomes[0] is None
    # Sent alone (the four at once, in any order), the create that met the failing one's
    # rolled-back /x in the combined multi commits; the failing one fails at its check, or at its
    # create if the other's landed first.
    failed = outcomes[1]
    assert isinstance(failed, TransactionFailed)
    assert (failed.index, type(failed.cause)) in {(1, NoNodeError), (0, NodeExistsError)}
    assert outcomes[2] is None
    node = store.get("/x")
    assert node is not None and node.data == b"theirs"
    stale = outcomes[3]
    assert isinstance(stale, TransactionFailed) and stale.index == 0
    assert isinstance(stale.cause, BadVersionError)
    b = store.get("/b")
    assert b is not None and b.data == b"ok"
    # Those in flight alone, the four combined (failed, nothing applied), then each of the four
    # alone.
    assert requests.sizes[: MAX_IN_FLIGHT + 1] == [*[1] * MAX_IN_FLIGHT, 5]
    assert sorted(requests.sizes[MAX_IN_FLIGHT + 1 :]) == [1, 1, 1, 2]


def test_a_lost_reply_puts_every_combined_transaction_in_doubt(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/b", b"")
    store.create("/c", b"")
    # The combined multi, behind those in flight, is applied and its reply lost.
    requests = Requests(monkeypatch, store.kazoo, lose=MAX_IN_FLIGHT)
    outcomes = run_together(store, requests, [[SetData("/b", b"1", 0)], [SetData("/c", b"1", 0)]])
    # Each retried alone, met its own write (BadVersion) and cannot tell: the callers re-read.
    assert isinstance(outcomes[0], CommitOutcomeUnknown)
    assert isinstance(outcomes[1], CommitOutcomeUnknown)
    assert requests.sizes == [*[1] * MAX_IN_FLIGHT, 2, 1, 1]
    for path in ("/b", "/c"):
        node = store.get(path)
        assert node is not None and (node.data, node.version) == (b"1", 1)


def test_a_waiter_that_gives_up_while_queued_is_never_sent(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create("/a", b"")
    store.create("/b", b"")
    client = store.kazoo
    requests = Requests(monkeypatch, client, hold=1)
    combiner = TransactionCombiner(client, max_bytes=1 << 20, max_in_flight=1)
    first: list[Any] = []
    sender = threading.Thread(
        target=lambda: first.append(combiner.submit([wire.SetData(f"{client.chroot}/a", b"1", 0)], 100))
    )
    sender.start()
    requests.wait_held()
    queued = combiner.submit([wire.SetData(f"{client.chroot}/b", b"1", 0)], 100)
    with pytest.raises(KazooTimeoutError):
        queued.get(timeout=0.01)
    requests.release()
    sender.join(WAIT_S)
    first[0].get(timeout=WAIT_S)
    wait_until(
        lambda: not combiner._in_flight, timeout=WAIT_S, interval=0.005, what="the combiner to go idle"
    )
    assert requests.sizes == [1]
    node = store.get("/b")
    assert node is not None and node.version == 0


def test_a_combined_multi_stays_under_its_byte_budget(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in "abcd":
        store.create(f"/{name}", b"")
    client = store.kazoo
    requests = Requests(monkeypatch, client, hold=1)
    combiner = TransactionCombiner(client, max_bytes=250, max_in_flight=1)
    first: list[Any] = []
    sender = threading.Thread(
        target=lambda: first.append(combiner.submit([wire.SetData(f"{client.chroot}/a", b"1", 0)], 100))
    )
    sender.start()
    requests.wait_held()
    queued = [combiner.submit([wire.SetData(f"{client.chroot}/{n}", b"1", 0)], 100) for n in "bcd"]
    requests.release()
    sender.join(WAIT_S)
    for pending in [*first, *queued]:
        (stat,) = pending.get(timeout=WAIT_S)
        assert stat.version == 1
    assert requests.sizes == [1, 2, 1]  # 100 + 100 fit in 250; a third would not
    with pytest.raises(KazooBadVersion):
        client.set("/a", b"2", version=0)
