"""Reads of several nodes as ZooKeeper ``multiRead``s, on a real ZooKeeper: one request per 64
nodes, the same answers as one ``get`` each (missing nodes, versions, large nodes, a chroot), and
the fallback to gets for a server without ``multiRead``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kazoo.exceptions import NoAuthError, NoNodeError, UnimplementedError

from harness.zk_requests import count_requests, fail_requests
from snapcoord.coordinator.errors import StoreUnavailable
from snapcoord.coordinator.storage.metadata import MAX_NODE_BYTES, Create, SetData
from snapcoord.coordinator.storage.zookeeper import multiread
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore


@pytest.fixture
def store(zk_uri: str) -> Iterator[ZooKeeperMetadataStore]:
    s = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield s
    s.close()


def test_several_nodes_are_one_request_per_64_with_the_answers_of_single_gets(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [f"/m/{i:03d}" for i in range(130)]
    store.transaction([Create("/m", b"")])
    for i in range(0, 130, 2):  # every other node exists, with its own data and version
        store.create(paths[i], f"node {i}".encode())
        if i % 4 == 0:
            store.set(paths[i], f"node {i} v1".encode(), version=0)
    singles = {p: store.get(p) for p in paths}
    requests = count_requests(store, monkeypatch)
    for count, sent in (
        (2, ["MultiRead"]),
        (64, ["MultiRead"]),
        (65, ["MultiRead"] * 2),
        (130, ["MultiRead"] * 3),
    ):
        requests.reset()
        assert store.get_many(paths[:count]) == {p: singles[p] for p in paths[:count]}
        assert requests.log == sent, count
    first = singles[paths[0]]
    assert first is not None and first.version == 1
    assert singles[paths[1]] is None
    requests.reset()  # one node: a plain get
    assert store.get_many([paths[2]]) == {paths[2]: singles[paths[2]]}
    assert requests.log == ["GetData"]


def test_sync_and_reads_are_two_requests(
    store: ZooKeeperMetadataStore, zk_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consistent read: the sync, then one multiRead that sees a write made through another
    session (another replica) just before."""
    other = ZooKeeperMetadataStore.from_uri(zk_uri)
    try:
        other.create("/s", b"v0")
        requests = count_requests(store, monkeypatch)
        other.set("/s", b"v1", version=0)
        nodes = store.synced_get_many("/", ["/s", "/absent"])
        assert nodes["/s"] is not None and nodes["/s"].data == b"v1" and nodes["/absent"] is None
        assert requests.log == ["Sync", "MultiRead"]
    finally:
        other.close()


def test_largest_nodes_in_one_request(store: ZooKeeperMetadataStore) -> None:
    """Six nodes of the largest size a record may have come back whole in one reply."""
    big = [f"/big{i}" for i in range(6)]
    datas = {p: (p.encode() * MAX_NODE_BYTES)[:MAX_NODE_BYTES] for p in big}
    for p in big:
        store.create(p, datas[p])
    nodes = store.get_many(big)
    assert {p: n.data if n else None for p, n in nodes.items()} == datas


def test_reads_under_a_chroot_see_only_the_chroot(zk_hosts: str) -> None:
    chroot = f"/mr-{uuid.uuid4().hex[:8]}"
    outer = ZooKeeperMetadataStore.from_uri(f"zk://{zk_hosts}")
    inner = ZooKeeperMetadataStore.from_uri(f"zk://{zk_hosts}{chroot}")
    try:
        outer.transaction([Create(f"{chroot}/x", b"inside")])
        outer.transaction([Create("/x-outside", b"outside")])
        nodes = inner.get_many(["/x", "/x-outside"])
        assert nodes["/x"] is not None and nodes["/x"].data == b"inside"
        assert nodes["/x-outside"] is None
        outer.transaction([SetData(f"{chroot}/x", b"changed", 0)])
        assert inner.get_many(["/x", "/y"])["/x"].data == b"changed"  # type: ignore[union-attr]
    finally:
        inner.close()
        outer.close()


def test_a_server_without_multiread_is_read_one_get_each(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper before 3.6 answers an unknown op code with UNIMPLEMENTED: the store then reads
    with gets, the answer is the same, and it does not try multiRead again."""
    store.create("/f1", b"1")
    store.create("/f2", b"2")
    expected = {"/f1": store.get("/f1"), "/f2": store.get("/f2"), "/f3": None}

    fail_requests(store, monkeypatch, multiread.MultiRead, UnimplementedError)  # ZooKeeper < 3.6
    requests = count_requests(store, monkeypatch)
    assert store.get_many(["/f1", "/f2", "/f3"]) == expected
    assert store.get_many(["/f1", "/f2", "/f3"]) == expected
    assert store.synced_get_many("/", ["/f1", "/f2"]) == {"/f1": expected["/f1"], "/f2": expected["/f2"]}
    assert requests.log == ["MultiRead"] + ["GetData"] * 6 + ["Sync"] + ["GetData"] * 2


def test_a_create_sent_with_reads_to_a_server_without_multiread(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload intent announced with a report's reads: the create lands before the multiRead is
    refused; sent again with gets, it meets its own node, which counts as created, not as a
    conflict."""
    store.create("/r1", b"1")

    fail_requests(store, monkeypatch, multiread.MultiRead, UnimplementedError)  # ZooKeeper < 3.6
    nodes = store.create_and_get_many("/intent", b"announce", ["/r1", "/r2"])
    assert nodes["/r1"] is not None and nodes["/r1"].data == b"1" and nodes["/r2"] is None
    intent = store.get("/intent")
    assert intent is not None and intent.data == b"announce" and intent.version == 0


def test_an_error_other_than_a_missing_node_is_not_an_answer(
    store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read refused inside a multiRead (e.g. by an ACL) fails the call instead of reading as
    absent, like a refused get."""
    store.create("/e1", b"1")
    original = multiread.MultiRead.deserialize

    def refuse_second(buffer: bytes, offset: int) -> list[multiread.Reply]:
        replies = original(buffer, offset)
        return [replies[0], NoAuthError(), *replies[2:]]

    monkeypatch.setattr(multiread.MultiRead, "deserialize", staticmethod(refuse_second))
    with pytest.raises(StoreUnavailable, match="refused access"):
        store.get_many(["/e1", "/e2"])


def test_wire_format_round_trip() -> None:
    """The request is ZooKeeper's MultiOperationRecord of GetDataRequests; a reply of a data
    result and an error result parses into one answer per path."""
    request = multiread.MultiRead(("/a", "/bc"))
    assert bytes(request.serialize()) == (
        b"\x00\x00\x00\x04\x00\xff\xff\xff\xff" + b"\x00\x00\x00\x02/a" + b"\x00"
        b"\x00\x00\x00\x04\x00\xff\xff\xff\xff" + b"\x00\x00\x00\x03/bc" + b"\x00"
        b"\xff\xff\xff\xff\x01\xff\xff\xff\xff"
    )
    stat = bytes(range(68))  # 11 fields: 8+8+8+8+4+4+4+8+4+4+8 bytes
    reply = (
        b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x02hi" + stat
        + b"\xff\xff\xff\xff\x00\xff\xff\xff\x9b" + b"\xff\xff\xff\x9b"
        + b"\xff\xff\xff\xff\x01\xff\xff\xff\xff"
    )  # fmt: skip
    answers = multiread.MultiRead.deserialize(reply, 0)
    assert len(answers) == 2
    data, parsed = answers[0]  # type: ignore[misc]
    assert data == b"hi" and parsed.czxid == int.from_bytes(stat[:8], "big")
    assert isinstance(answers[1], NoNodeError)
    with pytest.raises(ValueError):
        multiread.multi_read_async(object(), [])
