"""A store cut from ZooKeeper answers StoreUnavailable once its connection has been gone for a
quarter of the session timeout, not after its whole retry deadline: a replica on the wrong side of
a partition says so within its session timeout. The deadline here is an hour, so only the patience
can end the calls; the proxy cuts silently (no reset), as a partition does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from harness.faults import TcpProxy
from harness.process import wait_until
from snapcoord.coordinator.errors import StoreUnavailable
from snapcoord.coordinator.storage.backends import MetadataOptions
from snapcoord.coordinator.storage.metadata import Create
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore

pytestmark = [pytest.mark.zookeeper]

PATIENT = MetadataOptions(zk_retry_deadline_ms=3_600_000, zk_session_timeout_ms=4_000)
WAIT_S = 120.0


def _outcome(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # recorded for the test to inspect
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.parametrize("kind", ["read", "write"])
def test_a_cut_store_refuses_within_its_session_timeout_not_its_retry_deadline(
    zk_hosts: str, zk_uri: str, kind: str
) -> None:
    zk_host, zk_port = zk_hosts.rsplit(":", 1)
    chroot = "/" + zk_uri.split("/", 3)[3]
    with TcpProxy(zk_host, int(zk_port)) as proxy:
        store = ZooKeeperMetadataStore.from_uri(f"zk://{proxy.address}{chroot}-cut", PATIENT)
        try:
            store.transaction([Create("/before", b"x")])
            proxy.cut()
            call: Callable[[], object] = (
                (lambda: store.get("/before"))
                if kind == "read"
                else (lambda: store.transaction([Create("/during", b"y")]))
            )
            thread, errors = _outcome(call)
            thread.join(WAIT_S)
            assert not thread.is_alive(), f"the {kind} still waits {WAIT_S} s after the cut"
            assert len(errors) == 1 and isinstance(errors[0], StoreUnavailable), errors
            assert "not connected to ZooKeeper for" in str(errors[0].__cause__), errors[0]
            # Calls made later, with the connection known gone, are refused at once the same way.
            with pytest.raises(StoreUnavailable):
                store.get("/before")
            proxy.restore()
            wait_until(store.is_usable, timeout=WAIT_S, what="the store connected again")
            node = store.get("/before")
            assert node is not None and node.data == b"x"
        finally:
            store.close()
