"""The ZooKeeper request size calculator, checked against kazoo's serializer and the real server.

The server test is the point: multis sized exactly at the computed limit commit, one byte more
and ZooKeeper drops the connection ("Len error"). Two shapes, since the bug of #11 D5/D6 was the
overhead of many small ops, not the data of one large op.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol.serialization import CheckVersion as KzCheck
from kazoo.protocol.serialization import Create as KzCreate
from kazoo.protocol.serialization import Delete as KzDelete
from kazoo.protocol.serialization import SetData as KzSetData
from kazoo.protocol.serialization import Transaction as KzTransaction
from kazoo.security import OPEN_ACL_UNSAFE

from harness.isolation import chroot_of
from snapcoord.coordinator.errors import InvalidArgument, Reason
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Op, SetData
from snapcoord.coordinator.storage.zk_request_size import (
    LENGTH_PREFIX_BYTES,
    REQUEST_HEADER_BYTES,
    ZK_DEFAULT_MAX_REQUEST_BYTES,
    request_bytes,
    wire_bytes,
)
from snapcoord.coordinator.storage.zookeeper import ZooKeeperMetadataStore

LIMIT = ZK_DEFAULT_MAX_REQUEST_BYTES
WAIT_S = 60.0


def _kazoo_request_length(ops: list[Op], chroot: str) -> int:
    """What kazoo's own serializer makes of the ops, plus the request header (xid, type)."""
    kz_ops = []
    for op in ops:
        path = chroot + op.path
        if isinstance(op, Create):
            kz_ops.append(KzCreate(path, op.data, OPEN_ACL_UNSAFE, 0))
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


def _one_big_create(parent: str, chroot: str, target: int) -> list[Op]:
    """One Create whose data brings the request to exactly ``target`` bytes."""
    base = request_bytes([Create(f"{parent}/big", b"")], chroot=chroot)
    return [Create(f"{parent}/big", b"d" * (target - base))]


def _many_small_creates(parent: str, chroot: str, target: int) -> list[Op]:
    """Creates of 200-character names with no data (the shape of D5's pin index writes), then one
    whose name is lengthened to land on exactly ``target`` bytes."""
    ops: list[Op] = []
    i = 0
    while True:
        op = Create(f"{parent}/{i:06d}" + "n" * 194, b"")
        if request_bytes([*ops, op], chroot=chroot) > target - 300:
            break
        ops.append(op)
        i += 1
    rest = target - request_bytes([*ops, Create(f"{parent}/last", b"")], chroot=chroot)
    ops.append(Create(f"{parent}/last" + "z" * rest, b""))
    assert len(ops) > 3000
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


def test_the_store_refuses_an_oversized_multi_before_sending_it(store: ZooKeeperMetadataStore) -> None:
    """D5: 4000 small creates (data far below MAX_NODE_BYTES) used to reach the server and drop
    the connection on every retry. Now: INVALID_ARGUMENT/TOO_LARGE at once, the session untouched."""
    chroot = store.kazoo.chroot
    store.create("/p", b"")
    states: list[bool] = []
    store.add_state_listener(states.append)
    ops = _many_small_creates("/p", chroot, LIMIT + 1)
    expected = f"{LIMIT + 1}-byte ZooKeeper request; the limit is {LIMIT}"
    with pytest.raises(InvalidArgument, match=expected) as e:
        store.transaction(ops)
    assert e.value.reason is Reason.TOO_LARGE
    assert states == [] and store.is_usable()
    assert store.children("/p") == []
    # Exactly at the limit, the store sends it and ZooKeeper commits it.
    store.transaction(_many_small_creates("/p", chroot, LIMIT))
    assert len(store.children("/p")) > 3000
    assert states == []


def test_the_limit_is_a_constructor_parameter(zk_uri: str, zk_hosts: str) -> None:
    from snapcoord.coordinator.storage.registry import MetadataOptions

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
