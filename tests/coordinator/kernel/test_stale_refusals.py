"""A refusal that may come from a lagging ZooKeeper follower is decided again after a sync.

The store double plays a follower that has not applied some writes yet: reads of the ``behind``
paths answer "absent" until ``sync`` (the real store underneath is the embedded one). The
multi-replica test in ``tests/failures/test_stale_reads.py`` does the same on a real ensemble,
where the lag is real but short.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, NotFound, Reason
from snapcoord.coordinator.kernel.commit import CommitKernel, synced_retry
from snapcoord.coordinator.kernel.decision import Commit, Done, ReadNode, Reads
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.storage.backends import open_metadata_store
from snapcoord.coordinator.storage.election import Election
from snapcoord.coordinator.storage.metadata import (
    MetadataStore,
    Node,
    Op,
    SetData,
    StateListener,
    WatchCallback,
)


class LaggingStore(MetadataStore):
    """``inner``, except that the ``behind`` paths read as absent until the next ``sync``."""

    def __init__(self, inner: MetadataStore, behind: set[str]) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.behind = set(behind)
        self.syncs = 0

    def get(self, path: str) -> Node | None:
        return None if path in self.behind else self.inner.get(path)

    def sync(self, path: str = "/") -> None:
        self.syncs += 1
        self.behind.clear()
        self.inner.sync(path)

    def create(self, path: str, data: bytes, *, make_parents: bool = False) -> Node:
        return self.inner.create(path, data, make_parents=make_parents)

    def set(self, path: str, data: bytes, *, version: int) -> Node:
        return self.inner.set(path, data, version=version)

    def delete(self, path: str, *, version: int | None = None) -> None:
        self.inner.delete(path, version=version)

    def children(self, path: str) -> list[str]:
        return self.inner.children(path)

    def transaction(self, ops: Sequence[Op]) -> None:
        self.inner.transaction(ops)

    def watch(self, path: str, callback: WatchCallback) -> Callable[[], None]:
        return self.inner.watch(path, callback)

    def is_usable(self) -> bool:
        return self.inner.is_usable()

    def add_state_listener(self, listener: StateListener) -> None:
        self.inner.add_state_listener(listener)

    def election(self, name: str, identifier: str) -> Election:
        return self.inner.election(name, identifier)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def inner(tmp_path: Path) -> MetadataStore:
    store = open_metadata_store((tmp_path / "metadata").as_uri())
    store.create("/lease", b"1")
    return store


def kernel(store: MetadataStore) -> CommitKernel:
    return CommitKernel(store, None, CoordinatorMetrics(new_registry()))


def renew(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
    """Bump /lease, or NOT_FOUND when there is none (what a lease renewal decides)."""
    node = reads.node("/lease")
    if node is None:
        raise NotFound("no lease 'lease'")
    return Commit([SetData("/lease", str(int(node.data) + 1).encode(), node.version)], int(node.data) + 1)


def test_not_found_on_a_stale_read_is_decided_again_after_a_sync(inner: MetadataStore) -> None:
    store = LaggingStore(inner, {"/lease"})
    assert kernel(store).run("renew", {"lease_id": "lease"}, [ReadNode("/lease")], renew) == 2
    assert store.syncs == 1
    assert inner.get("/lease").data == b"2"  # type: ignore[union-attr]


def test_fenced_on_a_stale_read_is_decided_again_with_every_read_refreshed(inner: MetadataStore) -> None:
    """The generation is there only after a sync; the dependent read (More) is refreshed too."""
    inner.create("/gen", b"7")
    store = LaggingStore(inner, {"/gen", "/lease"})
    seen: list[tuple[Node | None, Node | None]] = []

    def report(reads: Reads, pending: Commit[str] | None) -> Done[str]:
        seen.append((reads.node("/lease"), reads.node("/gen")))
        if reads.node("/gen") is None:
            raise FailedPrecondition("generation 7 does not exist", reason=Reason.SNAPSHOT_FENCED)
        return Done("accepted")

    assert kernel(store).run("report", {}, [ReadNode("/lease"), ReadNode("/gen")], report) == "accepted"
    assert store.syncs == 1
    assert [(a is None, b is None) for a, b in seen] == [(True, True), (False, False)]


def test_the_fast_path_does_not_sync(inner: MetadataStore) -> None:
    store = LaggingStore(inner, set())
    assert kernel(store).run("renew", {"lease_id": "lease"}, [ReadNode("/lease")], renew) == 2
    assert store.syncs == 0


def test_a_true_refusal_is_answered_after_one_sync(inner: MetadataStore) -> None:
    inner.delete("/lease")
    store = LaggingStore(inner, set())
    with pytest.raises(NotFound):
        kernel(store).run("renew", {"lease_id": "lease"}, [ReadNode("/lease")], renew)
    assert store.syncs == 1


@pytest.mark.parametrize(
    "error",
    [
        InvalidArgument("bad duration"),
        NotFound("lease expired", reason=Reason.EXPIRED),
        FailedPrecondition("held", reason=Reason.LEASE_HELD),
    ],
)
def test_other_refusals_do_not_sync(inner: MetadataStore, error: Exception) -> None:
    store = LaggingStore(inner, {"/lease"})

    def refuse(reads: Reads, pending: Commit[int] | None) -> Commit[int]:
        raise error

    with pytest.raises(type(error)):
        kernel(store).run("renew", {"lease_id": "lease"}, [ReadNode("/lease")], refuse)
    assert store.syncs == 0


def test_synced_retry_reads_again_after_a_sync_only_on_a_stale_refusal(inner: MetadataStore) -> None:
    store = LaggingStore(inner, {"/lease"})

    def get() -> bytes:
        node = store.get("/lease")
        if node is None:
            raise NotFound("no lease 'lease'")
        return node.data

    assert synced_retry(store, get) == b"1"
    assert store.syncs == 1
    assert synced_retry(store, get) == b"1"  # fresh now: no second sync
    assert store.syncs == 1
    inner.delete("/lease")
    with pytest.raises(NotFound):
        synced_retry(store, get)
    assert store.syncs == 2
