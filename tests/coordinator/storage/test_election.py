"""Leader election behind the MetadataStore: one leader at a time, and the right reaction to faults.

The contract part runs on both backends: on ZooKeeper every contender has a store (a session) of its
own, as replicas do; on the embedded store the contenders share the one store a process may open.
The ZooKeeper part injects the faults the janitor must survive: a dropped connection (SUSPENDED, then
the same session), an expired session (LOST), ZooKeeper down, and closing or cancelling meanwhile.
Waits are bounded only to turn a hang into a failure; nothing asserts on durations.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from harness.faults import drop_zk_connection, expire_zk_session
from harness.process import wait_until
from harness.zookeeper import ZooKeeperServer
from snapcoord.coordinator.storage.election import Election, Leadership
from snapcoord.coordinator.storage.local.embedded import EmbeddedMetadataStore
from snapcoord.coordinator.storage.metadata import MetadataStore
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

WAIT_S = 30.0
NAME = "janitor"


@dataclass
class Term:
    """One call of ``lead``: when it started and ended (monotonic), and how often it could act."""

    leadership: Leadership
    start: float
    end: float | None = None
    acted: int = 0


class Exclusive:
    """The work a leader does: records it whenever two contenders are inside at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside: set[str] = set()
        self.overlaps: list[tuple[str, set[str]]] = []

    def act(self, who: str) -> None:
        with self._lock:
            if self._inside:
                self.overlaps.append((who, set(self._inside)))
            self._inside.add(who)
        time.sleep(0.005)
        with self._lock:
            self._inside.discard(who)


class Contender:
    """Runs ``election.run`` on a thread with a leader function that records its terms.

    The leader function acts (through ``exclusive``) whenever ``may_act()``, returns after
    ``term_loops`` iterations if given (a voluntary step-down), and raises in its first
    ``fail_terms`` terms.
    """

    def __init__(
        self,
        store: MetadataStore,
        identifier: str,
        *,
        name: str = NAME,
        exclusive: Exclusive | None = None,
        term_loops: int | None = None,
        fail_terms: int = 0,
    ) -> None:
        self.store = store
        self.identifier = identifier
        self.election: Election = store.election(name, identifier)
        self.exclusive = exclusive or Exclusive()
        self.term_loops = term_loops
        self.fail_terms = fail_terms
        self.terms: list[Term] = []
        self.returned = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"test-contender-{identifier}", daemon=True)

    def start(self) -> Contender:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.election.run(self._lead)
        finally:
            self.returned.set()

    def _lead(self, leadership: Leadership) -> None:
        term = Term(leadership, time.monotonic())
        self.terms.append(term)
        try:
            if self.fail_terms > 0:
                self.fail_terms -= 1
                raise RuntimeError(f"{self.identifier} fails on purpose")
            loops = 0
            while not leadership.is_lost():
                if leadership.may_act():
                    term.acted += 1
                    self.exclusive.act(self.identifier)
                loops += 1
                if self.term_loops is not None and loops >= self.term_loops:
                    return
                if leadership.wait(0.01):
                    return
        finally:
            term.end = time.monotonic()

    @property
    def current(self) -> Term | None:
        """The term in progress, if any."""
        term = self.terms[-1] if self.terms else None
        return term if term is not None and term.end is None else None

    def acting(self) -> bool:
        term = self.current
        return term is not None and term.leadership.may_act()

    def stop(self) -> None:
        self.election.cancel()
        assert self.returned.wait(WAIT_S), f"run() of {self.identifier} did not return after cancel()"


class Backend:
    """Makes contenders: each on a store of its own (ZooKeeper), or all on one store (embedded)."""

    def __init__(self, kind: str, open_store: Callable[[], MetadataStore]) -> None:
        self.kind = kind
        self._open_store = open_store
        self._shared: MetadataStore | None = None
        self.stores: list[MetadataStore] = []
        self.contenders: list[Contender] = []

    def store(self) -> MetadataStore:
        if self.kind == "embedded":
            if self._shared is None:
                self._shared = self._open_store()
                self.stores.append(self._shared)
            return self._shared
        store = self._open_store()
        self.stores.append(store)
        return store

    def contender(
        self,
        identifier: str,
        *,
        name: str = NAME,
        term_loops: int | None = None,
        fail_terms: int = 0,
        exclusive: Exclusive | None = None,
    ) -> Contender:
        contender = Contender(
            self.store(),
            identifier,
            name=name,
            exclusive=exclusive,
            term_loops=term_loops,
            fail_terms=fail_terms,
        )
        self.contenders.append(contender)
        return contender.start()

    def close(self) -> None:
        for contender in self.contenders:
            contender.election.cancel()
        for store in self.stores:
            store.close()
        for contender in self.contenders:
            assert contender.returned.wait(WAIT_S), f"run() of {contender.identifier} did not return"


@pytest.fixture(params=["embedded", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "embedded":
        b = Backend("embedded", lambda: EmbeddedMetadataStore(tmp_path / "metadata"))
    else:
        uri = request.getfixturevalue("zk_uri")
        b = Backend("zookeeper", lambda: ZooKeeperMetadataStore.from_uri(uri))
    yield b
    b.close()


def leaders(contenders: list[Contender]) -> list[Contender]:
    return [c for c in contenders if c.acting()]


def the_leader(contenders: list[Contender]) -> Contender:
    """Wait until exactly one contender leads and may act; return it."""

    def one() -> Contender | None:
        acting = leaders(contenders)
        return acting[0] if len(acting) == 1 else None

    return wait_until(one, timeout=WAIT_S, what="exactly one acting leader")


def assert_terms_do_not_overlap(contenders: list[Contender]) -> None:
    terms = sorted((t for c in contenders for t in c.terms), key=lambda t: t.start)
    for earlier, later in itertools.pairwise(terms):
        assert earlier.end is not None and earlier.end <= later.start, (earlier, later)


def election_threads(name: str) -> list[threading.Thread]:
    """The ZooKeeper election's helper threads (contending rounds) still alive."""
    return [t for t in threading.enumerate() if t.name == f"snapcoord-election-{name}" and t.is_alive()]


# --- contract: both backends ------------------------------------------------------------------------


def test_one_leader_at_a_time_while_leadership_rotates(backend: Backend) -> None:
    exclusive = Exclusive()
    contenders = [backend.contender(f"replica-{i}", exclusive=exclusive, term_loops=10) for i in range(3)]

    wait_until(
        lambda: sum(len(c.terms) for c in contenders) >= 6 and all(c.terms for c in contenders),
        timeout=WAIT_S,
        what="six terms, every contender leading at least once",
    )
    for c in contenders:
        c.stop()

    assert exclusive.overlaps == []
    assert_terms_do_not_overlap(contenders)
    # Every term could act: a leader that never may act would make the above vacuous.
    assert all(t.acted > 0 for c in contenders for t in c.terms)
    assert not any(c.election.is_leader() for c in contenders)


def test_a_lone_contender_leads_at_once_and_cancel_ends_run(backend: Backend) -> None:
    c = backend.contender("alone")
    assert the_leader([c]) is c
    assert c.election.is_leader()
    leadership = c.terms[0].leadership
    assert leadership.may_act() and not leadership.is_lost()

    c.stop()

    assert leadership.is_lost() and not leadership.may_act()
    assert leadership.wait(0) is True
    assert not c.election.is_leader()
    assert len(c.terms) == 1 and c.terms[0].end is not None


def test_cancelling_the_leader_hands_over(backend: Backend) -> None:
    first = backend.contender("first")
    assert the_leader([first]) is first
    second = backend.contender("second")
    assert not second.terms

    first.stop()

    assert the_leader([first, second]) is second
    assert second.election.is_leader() and not first.election.is_leader()
    assert_terms_do_not_overlap([first, second])


def test_closing_the_store_ends_run(backend: Backend) -> None:
    contenders = [backend.contender("leader")]
    the_leader(contenders)
    contenders.append(backend.contender("follower"))
    leadership = contenders[0].terms[0].leadership

    for store in backend.stores:
        store.close()

    for c in contenders:
        assert c.returned.wait(WAIT_S), f"run() of {c.identifier} did not return after close()"
        assert not c.election.is_leader()
    assert leadership.is_lost() and not leadership.may_act()
    wait_until(lambda: not election_threads(NAME), timeout=WAIT_S, what="no election thread left")


def test_an_election_on_a_closed_store_returns_at_once(backend: Backend) -> None:
    store = backend.store()
    store.close()
    c = Contender(store, "late").start()
    assert c.returned.wait(WAIT_S)
    assert c.terms == []


def test_run_after_cancel_returns_without_leading(backend: Backend) -> None:
    c = Contender(backend.store(), "cancelled-early")
    c.election.cancel()
    c.election.cancel()  # idempotent
    c.start()
    assert c.returned.wait(WAIT_S)
    assert c.terms == []


def test_a_failing_leader_is_logged_and_leads_again(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="snapcoord.coordinator.storage.election")
    c = backend.contender("flaky", fail_terms=1)

    wait_until(lambda: len(c.terms) >= 2 and c.acting(), timeout=WAIT_S, what="a second term after a failure")

    assert "fails on purpose" in caplog.text
    assert "the leader function raised" in caplog.text
    assert c.terms[0].leadership.is_lost()  # the failed term is over for good


@pytest.mark.parametrize("name", ["", "a/b", "..", "/janitor", "x" * 65, "jan itor"])
def test_malformed_names_are_rejected(backend: Backend, name: str) -> None:
    with pytest.raises(ValueError):
        backend.store().election(name, "me")


# --- ZooKeeper: nodes, faults -----------------------------------------------------------------------


@pytest.fixture
def zk(zk_uri: str) -> Iterator[Backend]:
    b = Backend("zookeeper", lambda: ZooKeeperMetadataStore.from_uri(zk_uri))
    yield b
    b.close()


def contender_nodes(client: KazooClient, name: str = NAME) -> list[tuple[str, bytes]]:
    """(node name, data) of every contender, in election order."""
    path = f"/election/{name}"
    if client.exists(path) is None:
        return []
    children = sorted(client.get_children(path), key=lambda child: child[-10:])
    return [(child, client.get(f"{path}/{child}")[0]) for child in children]


def test_contender_nodes_carry_the_identifier_and_go_on_cancel(
    zk: Backend, kazoo_client: KazooClient
) -> None:
    first = zk.contender("host-a:101")
    the_leader([first])
    second = zk.contender("host-b:202")
    wait_until(lambda: len(contender_nodes(kazoo_client)) == 2, timeout=WAIT_S, what="two contender nodes")
    assert [data for _, data in contender_nodes(kazoo_client)] == [b"host-a:101", b"host-b:202"]

    second.stop()  # a follower that stops leaves the queue at once
    assert [data for _, data in contender_nodes(kazoo_client)] == [b"host-a:101"]
    first.stop()  # and so does a leader: its node is deleted before run() returns
    assert contender_nodes(kazoo_client) == []


def test_session_expiry_steps_the_leader_down(zk: Backend, kazoo_client: KazooClient) -> None:
    first = zk.contender("first")
    the_leader([first])
    second = zk.contender("second")
    wait_until(lambda: len(contender_nodes(kazoo_client)) == 2, timeout=WAIT_S, what="two contender nodes")
    lost = first.terms[0].leadership
    store = first.store
    assert isinstance(store, ZooKeeperMetadataStore)

    expire_zk_session(store.kazoo)  # returns once the first has its new session

    wait_until(lambda: first.terms[0].end is not None, timeout=WAIT_S, what="the first's term to end")
    assert lost.is_lost() and not lost.may_act()  # for good, although connected again
    assert the_leader([first, second]) is second
    # The first contends again, behind the second, under its new session.
    wait_until(
        lambda: [data for _, data in contender_nodes(kazoo_client)] == [b"second", b"first"],
        timeout=WAIT_S,
        what="the first queued again behind the second",
    )
    assert len(first.terms) == 1 and not first.election.is_leader()


def test_a_dropped_connection_suspends_the_leader_without_a_new_election(
    zk: Backend, kazoo_client: KazooClient
) -> None:
    first = zk.contender("first")
    the_leader([first])
    second = zk.contender("second")
    wait_until(lambda: len(contender_nodes(kazoo_client)) == 2, timeout=WAIT_S, what="two contender nodes")
    nodes = contender_nodes(kazoo_client)
    leadership = first.terms[0].leadership
    store = first.store
    assert isinstance(store, ZooKeeperMetadataStore)
    # kazoo sets its state before calling listeners, so this sees what the leader would see.
    seen: list[tuple[str, bool]] = []

    def record(state: str) -> None:
        seen.append((state, leadership.may_act()))

    store.kazoo.add_listener(record)
    try:
        drop_zk_connection(store.kazoo)  # returns once reconnected to the same session
    finally:
        store.kazoo.remove_listener(record)

    assert seen == [(KazooState.SUSPENDED, False), (KazooState.CONNECTED, True)]
    assert leadership.may_act() and not leadership.is_lost()
    assert len(first.terms) == 1 and first.election.is_leader()
    assert second.terms == []
    assert contender_nodes(kazoo_client) == nodes


def test_zookeeper_down_stops_the_leader_until_it_is_back(private_zk_server: ZooKeeperServer) -> None:
    b = Backend("zookeeper", lambda: ZooKeeperMetadataStore.from_uri(f"zk://{private_zk_server.hosts}/elect"))
    try:
        first = b.contender("first")
        the_leader([first])
        leadership = first.terms[0].leadership

        private_zk_server.stop()
        wait_until(lambda: not leadership.may_act(), timeout=WAIT_S, what="may_act() False")
        # Suspended, not lost: only ZooKeeper can tell that the session expired.
        assert not leadership.is_lost() and first.election.is_leader()

        # Same data: the session usually resumes, and the leadership with it. On a loaded machine
        # the restarted server may expire it first; then the old leadership is lost for good and the
        # replica (alone) is elected again. Either way it leads, and no term was lost silently.
        private_zk_server.start()
        wait_until(first.acting, timeout=WAIT_S, what="the replica acting again")
        if len(first.terms) == 1:
            assert leadership.may_act() and not leadership.is_lost()
        else:
            assert leadership.is_lost() and not leadership.may_act()
    finally:
        b.close()


def test_cancel_during_an_outage_returns_and_the_nodes_go_once_it_is_back(
    private_zk_server: ZooKeeperServer,
) -> None:
    name = "outage"
    b = Backend("zookeeper", lambda: ZooKeeperMetadataStore.from_uri(f"zk://{private_zk_server.hosts}/elect"))
    try:
        first = b.contender("first", name=name)
        the_leader([first])
        second = b.contender("second", name=name)
        wait_until(
            lambda: len(b.stores[0].children(f"/election/{name}")) == 2, timeout=WAIT_S, what="2 nodes"
        )

        private_zk_server.stop()
        wait_until(lambda: not any(s.is_usable() for s in b.stores), timeout=WAIT_S, what="both suspended")
        # The follower's contending round is now stuck in kazoo until the reconnection; run()
        # returns anyway, for the leader and the follower.
        first.stop()
        second.stop()

        private_zk_server.start()
        # The stores stay open, and with them the sessions: the deletions queued while
        # disconnected (or the abandoned round's own clean-up) remove both nodes.
        wait_until(
            lambda: b.stores[0].is_usable() and b.stores[0].children(f"/election/{name}") == [],
            timeout=WAIT_S,
            what="no contender node left",
        )
        wait_until(lambda: not election_threads(name), timeout=WAIT_S, what="no election thread left")
    finally:
        b.close()


def test_closing_during_an_outage_leaves_no_thread_behind(private_zk_server: ZooKeeperServer) -> None:
    name = "closing"
    b = Backend("zookeeper", lambda: ZooKeeperMetadataStore.from_uri(f"zk://{private_zk_server.hosts}/elect"))
    first = b.contender("first", name=name)
    the_leader([first])
    second = b.contender("second", name=name)
    wait_until(lambda: len(b.stores[0].children(f"/election/{name}")) == 2, timeout=WAIT_S, what="2 nodes")

    private_zk_server.stop()
    wait_until(lambda: not any(s.is_usable() for s in b.stores), timeout=WAIT_S, what="both suspended")
    for store in b.stores:
        store.close()

    for c in (first, second):
        assert c.returned.wait(WAIT_S), f"run() of {c.identifier} did not return after close()"
    wait_until(lambda: not election_threads(name), timeout=WAIT_S, what="no election thread left")
    b.close()
