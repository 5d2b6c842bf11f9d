"""The MetadataStore contract, run against every backend: embedded SQLite and a real ZooKeeper.

Each test gets a fresh store (a new directory, or a new chroot that the store creates). Waits are
bounded only to turn a hang into a failure; nothing asserts on durations.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.concurrency import run_threads
from snapcoord.coordinator.domain.clock import SystemClock
from snapcoord.coordinator.errors import (
    BadVersionError,
    InvalidArgument,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    StoreUnavailable,
    TransactionFailed,
)
from snapcoord.coordinator.storage.backends import open_metadata_store
from snapcoord.coordinator.storage.metadata import (
    MAX_NODE_BYTES,
    Check,
    Create,
    Delete,
    MetadataStore,
    Op,
    SetData,
)

WAIT_S = 20.0


@pytest.fixture(params=["embedded", pytest.param("zookeeper", marks=pytest.mark.zookeeper)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MetadataStore]:
    if request.param == "embedded":
        uri = (tmp_path / "metadata").as_uri()
    else:
        uri = request.getfixturevalue("zk_uri")  # only ZooKeeper cases start the server
    s = open_metadata_store(uri)
    yield s
    s.close()


class Recorder:
    """Collects callback arguments from any thread; tests wait for a count, never for a time."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.threads: set[str] = set()
        self._cond = threading.Condition()

    def __call__(self, arg: Any) -> None:
        with self._cond:
            self.calls.append(arg)
            self.threads.add(threading.current_thread().name)
            self._cond.notify_all()

    def wait_for(self, count: int) -> list[Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.calls) >= count, timeout=WAIT_S):
                raise AssertionError(f"expected {count} calls, got {self.calls}")
            return list(self.calls)


# --- nodes ----------------------------------------------------------------------------------------


def test_root_exists_and_starts_empty(store: MetadataStore) -> None:
    assert store.get("/") is not None
    assert store.children("/") == []


def test_create_then_get(store: MetadataStore) -> None:
    now = SystemClock().now_ms()
    created = store.create("/a", b"payload")
    assert created.data == b"payload"
    assert created.version == 0
    assert created.created_ms == created.modified_ms
    # Same machine, so the server's clock and ours agree to well within a minute.
    assert abs(created.created_ms - now) < 60_000
    assert store.get("/a") == created


def test_get_absent_is_none(store: MetadataStore) -> None:
    assert store.get("/missing") is None
    assert store.get("/missing/child") is None


def test_get_many_reads_each_path_like_get(store: MetadataStore) -> None:
    store.create("/a", b"one")
    store.create("/a/b", b"")
    store.set("/a", b"two", version=0)
    paths = ["/a", "/missing", "/a/b", "/missing/child", "/a"]  # a repeat is read once
    assert store.get_many(paths) == {p: store.get(p) for p in paths}
    assert store.get_many(paths)["/a"] == store.get("/a")
    assert store.get_many(["/a"])["/a"].version == 1  # type: ignore[union-attr]
    assert store.get_many([]) == {}
    with pytest.raises(ValueError, match="absolute"):
        store.get_many(["/a", "relative"])


def test_get_many_of_many_paths(store: MetadataStore) -> None:
    store.create("/n", b"")
    store.transaction([Create(f"/n/{i:03d}", str(i).encode()) for i in range(0, 200, 2)])
    nodes = store.get_many([f"/n/{i:03d}" for i in range(200)])
    assert len(nodes) == 200
    for i in range(200):
        node = nodes[f"/n/{i:03d}"]
        assert (node.data if node is not None else None) == (str(i).encode() if i % 2 == 0 else None)


def test_binary_and_empty_data_round_trip(store: MetadataStore) -> None:
    blob = bytes(range(256)) * 4
    store.create("/bin", blob)
    store.create("/empty", b"")
    node = store.get("/bin")
    assert node is not None and node.data == blob
    empty = store.get("/empty")
    assert empty is not None and empty.data == b""


def test_create_existing_raises_and_keeps_data(store: MetadataStore) -> None:
    store.create("/a", b"first")
    with pytest.raises(NodeExistsError):
        store.create("/a", b"second")
    node = store.get("/a")
    assert node is not None and node.data == b"first" and node.version == 0


def test_create_needs_parent(store: MetadataStore) -> None:
    with pytest.raises(NoNodeError):
        store.create("/p/c", b"x")
    assert store.get("/p") is None


def test_create_make_parents(store: MetadataStore) -> None:
    node = store.create("/p/q/r", b"leaf", make_parents=True)
    assert node.data == b"leaf" and node.version == 0
    for ancestor in ("/p", "/p/q"):
        parent = store.get(ancestor)
        assert parent is not None and parent.data == b"" and parent.version == 0
    # Existing ancestors are kept as they are; an existing node still conflicts.
    store.set("/p", b"kept", version=0)
    store.create("/p/q/s", b"", make_parents=True)
    kept = store.get("/p")
    assert kept is not None and kept.data == b"kept"
    with pytest.raises(NodeExistsError):
        store.create("/p/q/r", b"again", make_parents=True)


def test_ensure_path_is_idempotent(store: MetadataStore) -> None:
    store.ensure_path("/e/f")
    store.ensure_path("/e/f")
    assert store.children("/e") == ["f"]


def test_set_is_compare_and_set(store: MetadataStore) -> None:
    created = store.create("/a", b"v0")
    updated = store.set("/a", b"v1", version=0)
    assert updated.data == b"v1" and updated.version == 1
    assert updated.created_ms == created.created_ms
    assert updated.modified_ms >= created.modified_ms
    assert store.get("/a") == updated

    with pytest.raises(BadVersionError):
        store.set("/a", b"stale", version=0)
    with pytest.raises(BadVersionError):
        store.set("/a", b"future", version=5)
    node = store.get("/a")
    assert node is not None and node.data == b"v1" and node.version == 1

    assert store.set("/a", b"v2", version=1).version == 2


def test_set_absent_raises_no_node(store: MetadataStore) -> None:
    with pytest.raises(NoNodeError):
        store.set("/missing", b"x", version=0)


def test_delete_by_version(store: MetadataStore) -> None:
    store.create("/a", b"")
    store.set("/a", b"x", version=0)
    with pytest.raises(BadVersionError):
        store.delete("/a", version=0)
    assert store.get("/a") is not None
    store.delete("/a", version=1)
    assert store.get("/a") is None
    with pytest.raises(NoNodeError):
        store.delete("/a", version=1)
    with pytest.raises(NoNodeError):
        store.delete("/a")


def test_delete_any_version(store: MetadataStore) -> None:
    store.create("/a", b"")
    store.set("/a", b"x", version=0)
    store.delete("/a")
    assert store.get("/a") is None


def test_delete_with_children_raises_not_empty(store: MetadataStore) -> None:
    store.create("/p/c", b"", make_parents=True)
    with pytest.raises(NotEmptyError):
        store.delete("/p")
    with pytest.raises(NotEmptyError):
        store.delete("/p", version=0)
    store.delete("/p/c")
    store.delete("/p")
    assert store.get("/p") is None


def test_a_deleted_node_can_be_created_again_at_version_zero(store: MetadataStore) -> None:
    store.create("/a", b"one")
    store.set("/a", b"two", version=0)
    store.delete("/a")
    assert store.create("/a", b"three").version == 0


def test_children_sorted_and_absent(store: MetadataStore) -> None:
    names = ["b", "a", "c10", "c2", "Z", "a-b", "a_b", "é"]
    store.create("/p", b"")
    for name in random.sample(names, len(names)):
        store.create(f"/p/{name}", b"")
    store.create("/p/a/deeper", b"")  # grandchildren are not children
    assert store.children("/p") == sorted(names)
    assert store.children("/p/b") == []
    assert store.children("/absent") == []
    assert store.children("/") == ["p"]


def test_root_cannot_be_written(store: MetadataStore) -> None:
    with pytest.raises(ValueError):
        store.create("/", b"x")
    with pytest.raises(ValueError):
        store.set("/", b"x", version=0)
    with pytest.raises(ValueError):
        store.delete("/")
    with pytest.raises(ValueError):
        store.transaction([SetData("/", b"x", 0)])


def test_malformed_paths_are_rejected(store: MetadataStore) -> None:
    for bad in ("relative", "/a//b", "/a/./b", "/a/../b"):
        with pytest.raises(ValueError):
            store.get(bad)
        with pytest.raises(ValueError):
            store.create(bad, b"")


def test_node_size_limit(store: MetadataStore) -> None:
    largest = bytes(random.getrandbits(8) for _ in range(1024)) * (MAX_NODE_BYTES // 1024)
    largest += b"x" * (MAX_NODE_BYTES - len(largest))
    assert len(largest) == MAX_NODE_BYTES
    store.create("/big", largest)
    node = store.get("/big")
    assert node is not None and node.data == largest

    too_big = largest + b"!"
    with pytest.raises(InvalidArgument):
        store.create("/bigger", too_big)
    with pytest.raises(InvalidArgument):
        store.set("/big", too_big, version=0)
    with pytest.raises(InvalidArgument):
        store.transaction([Create("/bigger", too_big)])
    # A multi is bounded as a whole: two halves that together exceed the limit are refused.
    half = b"h" * (MAX_NODE_BYTES // 2 + 1)
    with pytest.raises(InvalidArgument):
        store.transaction([Create("/h1", half), Create("/h2", half)])
    assert store.get("/bigger") is None and store.get("/h1") is None
    unchanged = store.get("/big")
    assert unchanged is not None and unchanged.version == 0


# --- transactions -----------------------------------------------------------------------------------


def test_transaction_applies_all_ops_in_order(store: MetadataStore) -> None:
    store.create("/s", b"s0")
    store.create("/gone", b"")
    store.transaction(
        [
            Create("/t", b""),
            Create("/t/child", b"c"),  # sees the Create before it
            SetData("/s", b"s1", 0),
            SetData("/s", b"s2", 1),  # and the SetData before it
            Delete("/gone", 0),
            Check("/t/child", 0),
        ]
    )
    child = store.get("/t/child")
    assert child is not None and child.data == b"c"
    s = store.get("/s")
    assert s is not None and s.data == b"s2" and s.version == 2
    assert store.get("/gone") is None


def test_empty_transaction_is_a_no_op(store: MetadataStore) -> None:
    store.transaction([])


FailingCase = tuple[list[Op], int, type[Exception]]


def _failing_cases() -> dict[str, FailingCase]:
    # Every case starts with two ops that would succeed; the op at `index` fails.
    ok: list[Op] = [Create("/new", b"n"), SetData("/s", b"s1", 0)]
    return {
        "create-exists": ([*ok, Create("/s", b"")], 2, NodeExistsError),
        "create-no-parent": ([*ok, Create("/missing/x", b"")], 2, NoNodeError),
        "set-stale": ([*ok, SetData("/p", b"", 3)], 2, BadVersionError),
        "set-absent": ([*ok, SetData("/missing", b"", 0)], 2, NoNodeError),
        "delete-stale": ([*ok, Delete("/p/c", 1)], 2, BadVersionError),
        "delete-not-empty": ([*ok, Delete("/p", None)], 2, NotEmptyError),
        "delete-absent": ([*ok, Delete("/missing", None)], 2, NoNodeError),
        "check-stale": ([*ok, Check("/s", 0)], 2, BadVersionError),  # /s moved to 1 in this tx
        "check-absent": ([*ok, Check("/missing", 0)], 2, NoNodeError),
        "first-op": ([Check("/p", 7), *ok], 0, BadVersionError),
        "middle-op": (
            [Create("/new", b"n"), Create("/new", b"again"), SetData("/s", b"s1", 0)],
            1,
            NodeExistsError,
        ),
    }


@pytest.mark.parametrize("case", list(_failing_cases()))
def test_transaction_is_all_or_nothing(store: MetadataStore, case: str) -> None:
    ops, index, cause = _failing_cases()[case]
    store.create("/s", b"s0")
    store.create("/p/c", b"", make_parents=True)
    watcher = Recorder()
    store.watch("/new", watcher)
    store.watch("/sentinel", watcher)

    with pytest.raises(TransactionFailed) as info:
        store.transaction(ops)
    assert info.value.index == index
    assert isinstance(info.value.cause, cause)

    # Nothing of it was applied...
    assert store.get("/new") is None
    s = store.get("/s")
    assert s is not None and s.data == b"s0" and s.version == 0
    assert store.children("/p") == ["c"]
    # ...and nothing of it was seen: callbacks run in the order of the changes, so a later change
    # elsewhere is the first thing reported.
    store.create("/sentinel", b"")
    assert watcher.wait_for(1) == ["/sentinel"]


def test_check_op_guards_a_transaction(store: MetadataStore) -> None:
    store.create("/guard", b"")
    store.transaction([Check("/guard", 0), Create("/guarded", b"1")])
    assert store.get("/guarded") is not None
    store.set("/guard", b"moved", version=0)
    with pytest.raises(TransactionFailed) as info:
        store.transaction([Check("/guard", 0), Create("/guarded2", b"2")])
    assert info.value.index == 0 and isinstance(info.value.cause, BadVersionError)
    assert store.get("/guarded2") is None


# --- watches ----------------------------------------------------------------------------------------


def test_watch_fires_on_create_set_and_delete(store: MetadataStore) -> None:
    rec = Recorder()
    store.watch("/w", rec)
    store.create("/w", b"1")
    assert rec.wait_for(1)[-1] == "/w"
    store.set("/w", b"2", version=0)
    assert rec.wait_for(2)[-1] == "/w"
    store.delete("/w")
    assert rec.wait_for(3)[-1] == "/w"
    # Callbacks run on a thread of the store, not on the thread that wrote.
    assert threading.current_thread().name not in rec.threads


def test_watch_and_get_many_reads_under_its_watches(store: MetadataStore) -> None:
    """The reads come back like get_many's (absent: None), and each watch then fires on the next
    change of its node, however soon after the reads it comes; a cancel stops its watch."""
    store.create("/a", b"1")
    rec, other = Recorder(), Recorder()
    cancels, nodes = store.watch_and_get_many([("/a", rec), ("/b", other)], ["/a", "/b", "/a"])
    assert len(cancels) == 2
    assert set(nodes) == {"/a", "/b"} and nodes["/b"] is None
    a = nodes["/a"]
    assert a is not None and (a.data, a.version) == (b"1", 0)
    store.set("/a", b"2", version=0)
    assert rec.wait_for(1) == ["/a"]
    cancels[1]()
    store.create("/b", b"")
    store.set("/a", b"3", version=1)  # a later change: the cancelled watch had its chance by now
    assert rec.wait_for(2) == ["/a", "/a"]
    assert other.calls == []


def test_watch_fires_for_changes_made_in_a_transaction(store: MetadataStore) -> None:
    store.create("/w", b"")
    rec = Recorder()
    store.watch("/w", rec)
    store.transaction([SetData("/w", b"tx", 0)])
    assert rec.wait_for(1) == ["/w"]


def test_watch_on_a_node_created_by_make_parents(store: MetadataStore) -> None:
    rec = Recorder()
    store.watch("/m", rec)
    store.create("/m/n", b"", make_parents=True)
    assert rec.wait_for(1)[0] == "/m"


def test_watch_callback_may_read_the_store(store: MetadataStore) -> None:
    """Callbacks are not called under the store's lock: re-reading from one must not deadlock."""
    seen: list[bytes | None] = []
    done = threading.Event()

    def reread(path: str) -> None:
        node = store.get(path)
        seen.append(node.data if node else None)
        done.set()

    store.watch("/r", reread)
    store.create("/r", b"fresh")
    assert done.wait(WAIT_S)
    assert seen[0] == b"fresh"


def test_cancel_stops_a_watch(store: MetadataStore) -> None:
    cancelled, sentinel = Recorder(), Recorder()
    cancel = store.watch("/w", cancelled)
    store.watch("/w", sentinel)
    store.create("/w", b"1")
    cancelled.wait_for(1)
    sentinel.wait_for(1)

    cancel()
    cancel()  # idempotent
    calls_before = len(cancelled.calls)
    store.set("/w", b"2", version=0)
    # The sentinel hears of the same change; once it has, the cancelled one would have too.
    sentinel.wait_for(2)
    assert len(cancelled.calls) == calls_before


def test_two_watches_with_the_same_callback_cancel_separately(store: MetadataStore) -> None:
    rec = Recorder()
    first = store.watch("/w", rec)
    store.watch("/w", rec)
    first()
    store.create("/w", b"")
    rec.wait_for(1)
    sentinel = Recorder()
    store.watch("/w", sentinel)
    store.set("/w", b"x", version=0)
    sentinel.wait_for(1)
    assert rec.calls == ["/w", "/w"]  # one per change: only the second registration is left


# --- concurrency ------------------------------------------------------------------------------------


def test_concurrent_creates_have_one_winner(store: MetadataStore) -> None:
    winners: list[int] = []
    losers: list[int] = []

    def create(i: int) -> None:
        try:
            store.create("/race", str(i).encode())
            winners.append(i)
        except NodeExistsError:
            losers.append(i)

    run_threads(8, create)
    assert len(winners) == 1 and len(losers) == 7
    node = store.get("/race")
    assert node is not None and node.data == str(winners[0]).encode()


def test_concurrent_cas_has_one_winner_per_version(store: MetadataStore) -> None:
    store.create("/cas", b"start")
    for version in range(3):
        winners: list[int] = []

        def cas(i: int, version: int = version, winners: list[int] = winners) -> None:
            try:
                store.set("/cas", f"{version}:{i}".encode(), version=version)
                winners.append(i)
            except BadVersionError:
                pass

        run_threads(8, cas)
        assert len(winners) == 1
        node = store.get("/cas")
        assert node is not None
        assert node.version == version + 1 and node.data == f"{version}:{winners[0]}".encode()


def test_counter_incremented_by_many_threads_with_retry(store: MetadataStore) -> None:
    threads, increments = 8, 10
    store.create("/counter", b"0")
    conflicts: list[int] = []

    def increment(_: int) -> None:
        for _ in range(increments):
            while True:
                node = store.get("/counter")
                assert node is not None
                try:
                    store.set("/counter", str(int(node.data) + 1).encode(), version=node.version)
                    break
                except BadVersionError:
                    conflicts.append(1)

    run_threads(threads, increment)
    node = store.get("/counter")
    assert node is not None
    assert int(node.data) == threads * increments
    assert node.version == threads * increments


def test_concurrent_transactions_stay_atomic(store: MetadataStore) -> None:
    """Two counters moved together in one transaction never drift apart."""
    store.create("/x", b"0")
    store.create("/y", b"0")

    def move(_: int) -> None:
        for _ in range(5):
            while True:
                x, y = store.get("/x"), store.get("/y")
                assert x is not None and y is not None
                try:
                    store.transaction(
                        [
                            SetData("/x", str(int(x.data) + 1).encode(), x.version),
                            SetData("/y", str(int(y.data) - 1).encode(), y.version),
                        ]
                    )
                    break
                except TransactionFailed as e:
                    assert isinstance(e.cause, BadVersionError)

    run_threads(6, move)
    x, y = store.get("/x"), store.get("/y")
    assert x is not None and y is not None
    assert int(x.data) == 30 and int(y.data) == -30
    assert x.version == y.version == 30


# --- lifecycle --------------------------------------------------------------------------------------


def test_synced_get_many_reads_like_get_many(store: MetadataStore) -> None:
    store.create("/a", b"one")
    store.set("/a", b"two", version=0)
    paths = ["/a", "/missing", "/a"]  # a repeat is read once; an absent node is None
    assert store.synced_get_many("/", paths) == store.get_many(paths)
    assert store.synced_get_many("/a", ["/a"])["/a"].data == b"two"  # type: ignore[union-attr]
    assert store.synced_get_many("/absent", ["/missing"]) == {"/missing": None}  # sync on any path
    assert store.synced_get_many("/", []) == {}
    with pytest.raises(ValueError, match="absolute"):
        store.synced_get_many("/", ["relative"])


def test_create_and_get_many_creates_then_reads(store: MetadataStore) -> None:
    store.create("/a", b"one")
    nodes = store.create_and_get_many("/new", b"made", ["/a", "/missing", "/new", "/a"])
    assert set(nodes) == {"/a", "/missing", "/new"}
    assert nodes["/a"] == store.get("/a") and nodes["/missing"] is None
    # The reads are served after the create: it is visible to them, and it stays.
    assert nodes["/new"] is not None and nodes["/new"].data == b"made" and nodes["/new"].version == 0
    assert store.get("/new") == nodes["/new"]
    assert store.create_and_get_many("/other", b"", []) == {}
    assert store.get("/other") is not None


def test_create_and_get_many_raises_like_create_and_creates_nothing(store: MetadataStore) -> None:
    store.create("/a", b"one")
    with pytest.raises(NodeExistsError):
        store.create_and_get_many("/a", b"two", ["/a"])
    assert store.get("/a").data == b"one"  # type: ignore[union-attr]
    with pytest.raises(NoNodeError):
        store.create_and_get_many("/no/parent", b"x", ["/a"])
    assert store.get("/no") is None and store.get("/no/parent") is None
    with pytest.raises(ValueError, match="absolute"):
        store.create_and_get_many("/b", b"", ["relative"])
    assert store.get("/b") is None  # refused before anything was sent


def test_sync_and_usable(store: MetadataStore) -> None:
    store.create("/a", b"")
    store.sync()
    store.sync("/a")
    assert store.is_usable()


def test_close_makes_the_store_unusable(store: MetadataStore) -> None:
    states = Recorder()
    store.add_state_listener(states)
    store.close()
    store.close()  # idempotent
    assert not store.is_usable()
    # close() returns after the listeners heard about it.
    assert states.calls == [False]
    with pytest.raises(StoreUnavailable):
        store.get("/")
    with pytest.raises(StoreUnavailable):
        store.get_many(["/", "/a"])
    with pytest.raises(StoreUnavailable):
        store.create("/a", b"")
    with pytest.raises(StoreUnavailable):
        store.transaction([Create("/a", b"")])
