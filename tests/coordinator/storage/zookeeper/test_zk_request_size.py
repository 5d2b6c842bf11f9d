"""The ZooKeeper request size calculator, checked against kazoo's serializer and the real server.

The server test is the point: multis sized exactly at the computed limit commit, one byte more
and ZooKeeper drops the connection ("Len error"). Two shapes, since what outgrows a request is
as often the overhead of many small ops as the data of one large op. With ``--zk-auth-file`` every create
carries a digest ACL, 24 bytes plus the user name's longer than world:anyone, which the store
counts too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol.serialization import CheckVersion as KzCheck
from kazoo.protocol.serialization import Create as KzCreate
from kazoo.protocol.serialization import Delete as KzDelete
from kazoo.protocol.serialization import SetData as KzSetData
from kazoo.protocol.serialization import Transaction as KzTransaction
from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl

from harness.isolation import chroot_of
from snapcoord.coordinator.errors import InvalidArgument, Reason
from snapcoord.coordinator.storage.backends import MetadataOptions
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Op, SetData
from snapcoord.coordinator.storage.zookeeper.auth import digest_acl
from snapcoord.coordinator.storage.zookeeper.request_size import (
    LENGTH_PREFIX_BYTES,
    REQUEST_HEADER_BYTES,
    ZK_DEFAULT_MAX_REQUEST_BYTES,
    AclEntry,
    request_bytes,
    wire_bytes,
)
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

LIMIT = ZK_DEFAULT_MAX_REQUEST_BYTES
WAIT_S = 60.0
USER, PASSWORD = "snapcoord", "zk-secret-7f3a"


def _entries(acl: Sequence[ACL]) -> tuple[AclEntry, ...]:
    return tuple(AclEntry(a.perms, a.id.scheme, a.id.id) for a in acl)


def _kazoo_request_length(ops: list[Op], chroot: str, acl: Sequence[ACL] = OPEN_ACL_UNSAFE) -> int:
    """What kazoo's own serializer makes of the ops, plus the request header (xid, type)."""
    kz_ops = []
    for op in ops:
        path = chroot + op.path
        if isinstance(op, Create):
            kz_ops.append(KzCreate(path, op.data, list(acl), 0))
        elif isinstance(op, SetData):
            kz_ops.append(KzSetData(path, op.data, op.version))
        elif isinstance(op, Delete):
            kz_ops.append(KzDelete(path, -1 if op.version is None else op.version))
        else:
            kz_ops.append(KzCheck(path, op.version))
    return REQUEST_HEADER_BYTES + len(KzTransaction(kz_ops).serialize())


@pytest.mark.parametrize("chroot", ["", "/snapcoord", "/ünïcode-chroot"])
def test_matches_kazoos_serialization(chroot: str) -> None:
    ops: list[Op] = [
        Create("/a", b""),
        Create("/a/" + "x" * 200, b"payload" * 100),
        SetData("/a/é", b"\x00" * 17, 3),
        Delete("/a/b", None),
        Delete("/a/c", 7),
        Check("/a", 2),
    ]
    assert request_bytes(ops, chroot=chroot) == _kazoo_request_length(ops, chroot)
    assert wire_bytes(ops, chroot=chroot) == LENGTH_PREFIX_BYTES + request_bytes(ops, chroot=chroot)
    assert request_bytes([], chroot=chroot) == REQUEST_HEADER_BYTES + 9  # header and closing MultiHeader


@pytest.mark.parametrize("user", ["u", USER, "ü" * 128])
def test_a_digest_acl_is_kazoos_and_counted_like_kazoo(user: str) -> None:
    """``digest_acl`` (which config counts, without kazoo) is the ACL kazoo makes from the same
    credentials, and each create carrying it costs 24 bytes plus the user name's more."""
    made = make_digest_acl(user, PASSWORD, all=True)
    acl = (digest_acl(user, PASSWORD),)
    assert acl == _entries([made])
    ops: list[Op] = [Create("/a", b""), Create("/a/b", b"x"), SetData("/a", b"y", 0)]
    assert request_bytes(ops, chroot="/c", acl=acl) == _kazoo_request_length(ops, "/c", [made])
    assert request_bytes(ops, acl=acl) - request_bytes(ops) == 2 * (24 + len(user.encode()))


def _one_big_create(parent: str, chroot: str, target: int) -> list[Op]:
    """One Create whose data brings the request to exactly ``target`` bytes."""
    base = request_bytes([Create(f"{parent}/big", b"")], chroot=chroot)
    return [Create(f"{parent}/big", b"d" * (target - base))]


def _many_small_creates(
    parent: str, chroot: str, target: int, acl: tuple[AclEntry, ...] = _entries(OPEN_ACL_UNSAFE)
) -> list[Op]:
    """Creates of 200-character names with no data (the shape of a large lease's pin index writes), then one
    whose name is lengthened to land on exactly ``target`` bytes when each create carries ``acl``."""
    ops: list[Op] = []
    i = 0
    while True:
        op = Create(f"{parent}/{i:06d}" + "n" * 194, b"")
        if request_bytes([*ops, op], chroot=chroot, acl=acl) > target - 300:
            break
        ops.append(op)
        i += 1
    rest = target - request_bytes([*ops, Create(f"{parent}/last", b"")], chroot=chroot, acl=acl)
    ops.append(Create(f"{parent}/last" + "z" * rest, b""))
    assert len(ops) > 2000
    return ops


def _commit(client: KazooClient, ops: list[Op]) -> None:
    tx = client.transaction()
    for op in ops:
        assert isinstance(op, Create)
        tx.create(op.path, op.data)
    results = tx.commit()
    assert not [r for r in results if isinstance(r, Exception)], results[:3]


def _connected(client: KazooClient) -> None:
    done = threading.Event()
    if client.connected:
        return
    client.add_listener(lambda state: done.set() if state == "CONNECTED" else None)
    assert client.connected or done.wait(WAIT_S), "kazoo did not reconnect"


@pytest.mark.parametrize("shape", [_one_big_create, _many_small_creates], ids=["one-op", "many-ops"])
def test_the_computed_limit_is_where_zookeeper_starts_refusing(
    kazoo_client: KazooClient, zk_uri: str, shape: object
) -> None:
    assert callable(shape)
    chroot = chroot_of(zk_uri)
    kazoo_client.ensure_path("/at")
    kazoo_client.ensure_path("/over")
    at = shape("/at", chroot, LIMIT)
    over = shape("/over", chroot, LIMIT + 1)
    assert request_bytes(at, chroot=chroot) == LIMIT
    assert request_bytes(over, chroot=chroot) == LIMIT + 1

    _commit(kazoo_client, at)  # exactly at the limit: accepted
    assert len(kazoo_client.get_children("/at")) == len(at)

    with pytest.raises(ConnectionLoss):  # one byte more: "Len error", the connection is dropped
        _commit(kazoo_client, over)
    _connected(kazoo_client)
    assert kazoo_client.get_children("/over") == []


@pytest.fixture
def store(zk_uri: str) -> Iterator[ZooKeeperMetadataStore]:
    s = ZooKeeperMetadataStore.from_uri(zk_uri)
    yield s
    s.close()


def test_the_limit_is_a_constructor_parameter(zk_uri: str, zk_hosts: str) -> None:
    from snapcoord.coordinator.storage.backends import MetadataOptions

    chroot = chroot_of(zk_uri)
    small = ZooKeeperMetadataStore(zk_hosts, chroot, MetadataOptions(), uri=zk_uri, max_request_bytes=500)
    try:
        small.create("/q", b"")
        with pytest.raises(InvalidArgument, match="the limit is 500 bytes"):
            small.transaction([Create(f"/q/{i}", b"") for i in range(20)])
        assert small.children("/q") == []
        small.transaction([Create("/q/one", b"")])
        assert small.children("/q") == ["one"]
    finally:
        small.close()


@pytest.fixture
def digest_store(
    zk_uri: str, zk_hosts: str, kazoo_client: KazooClient, tmp_path: Path
) -> Iterator[ZooKeeperMetadataStore]:
    """A store with ``--zk-auth-file``: each create carries the user's digest ACL. The chroot is
    made open first (by ``kazoo_client``); what the store creates under it is closed to the
    harness's cleanup, which has no credentials, so the owner deletes it."""
    auth_file = tmp_path / "zk-auth"
    auth_file.write_text(f"{USER}:{PASSWORD}\n")
    s = ZooKeeperMetadataStore.from_uri(zk_uri, MetadataOptions(zk_auth_file=str(auth_file)))
    yield s
    s.close()
    owner = KazooClient(hosts=zk_hosts, timeout=10, auth_data=[("digest", f"{USER}:{PASSWORD}")])
    owner.start(timeout=30)
    try:
        owner.delete(chroot_of(zk_uri), recursive=True)
    finally:
        owner.stop()
        owner.close()


def test_a_digest_acl_store_counts_the_request_kazoo_sends(
    digest_store: ZooKeeperMetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The size the store checks (and gives the combiner) is the length of the multi kazoo
    serialises, each create's digest ACL included: 33 bytes more per create for this user than the
    world:anyone count."""
    store = digest_store
    chroot = store.kazoo.chroot
    [acl] = store.kazoo.default_acl
    assert (acl.id.scheme, acl.id.id.split(":")[0]) == ("digest", USER)
    store.create("/a", b"")
    store.create("/a/d", b"")
    checked: list[int] = []
    sent: list[int] = []
    submit, call = store._combiner.submit, store.kazoo._call

    def spy_submit(request: list[Any], size: int) -> Any:
        checked.append(size)
        return submit(request, size)

    def spy_call(request: Any, async_object: Any) -> Any:
        if request.type == KzTransaction.type:
            sent.append(REQUEST_HEADER_BYTES + len(request.serialize()))
        return call(request, async_object)

    monkeypatch.setattr(store._combiner, "submit", spy_submit)
    monkeypatch.setattr(store.kazoo, "_call", spy_call)
    ops: list[Op] = [
        Create("/a/b", b"x" * 100),
        Create("/a/" + "n" * 200, b""),
        SetData("/a", b"y", 0),
        Delete("/a/d", 0),
        Check("/a", 1),
    ]
    store.transaction(ops)
    assert checked == sent == [_kazoo_request_length(ops, chroot, [acl])]
    assert checked[0] - request_bytes(ops, chroot=chroot) == 2 * 33
    assert sorted(store.children("/a")) == sorted(["b", "n" * 200])


@pytest.fixture(params=[pytest.param(acl, marks=pytest.mark.zookeeper) for acl in ("open", "digest")])
def any_store(request: pytest.FixtureRequest) -> ZooKeeperMetadataStore:
    """The store with kazoo's open ACL, then with ``--zk-auth-file``'s digest ACL."""
    store: ZooKeeperMetadataStore = request.getfixturevalue(
        "store" if request.param == "open" else "digest_store"
    )
    return store


def test_the_store_refuses_an_oversized_multi_before_sending_it(any_store: ZooKeeperMetadataStore) -> None:
    """4000 small creates (data far below MAX_NODE_BYTES), which the server would answer by dropping
    the connection on every retry: INVALID_ARGUMENT/TOO_LARGE at once, nothing stored, the
    session untouched; exactly at the limit, ZooKeeper commits them. With a digest ACL the creates'
    world:anyone count is tens of KB under the limit: only the ACL each carries takes it over."""
    store = any_store
    chroot = store.kazoo.chroot
    acl = _entries(store.kazoo.default_acl or OPEN_ACL_UNSAFE)
    store.create("/p", b"")
    states: list[object] = []
    store.add_state_listener(states.append)
    over = _many_small_creates("/p", chroot, LIMIT + 1, acl)
    if acl != _entries(OPEN_ACL_UNSAFE):
        assert request_bytes(over, chroot=chroot) == LIMIT + 1 - 33 * len(over)  # counted with world:anyone
    expected = f"{LIMIT + 1}-byte ZooKeeper request; the limit is {LIMIT}"
    with pytest.raises(InvalidArgument, match=expected) as e:
        store.transaction(over)
    assert e.value.reason is Reason.TOO_LARGE
    assert states == [] and store.is_usable()
    assert store.children("/p") == []
    at = _many_small_creates("/p", chroot, LIMIT, acl)
    store.transaction(at)
    assert len(store.children("/p")) == len(at) > 3000
    assert states == []
