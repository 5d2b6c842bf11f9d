"""Stores for coordinator tests: each test that asks for ``stores`` runs on both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.stores import Stores
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store


@pytest.fixture(params=["embedded", pytest.param("zk+s3", marks=[pytest.mark.zookeeper, pytest.mark.s3])])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    """The embedded defaults, then real ZooKeeper + S3 (each test gets its own chroot and prefix)."""
    if request.param == "embedded":
        metadata = open_metadata_store((tmp_path / "metadata").as_uri())
        blobs = open_blob_store((tmp_path / "blobs").as_uri())
    else:
        metadata = open_metadata_store(request.getfixturevalue("zk_uri"))
        blobs = open_blob_store(request.getfixturevalue("s3_uri"))
    yield Stores(request.param, metadata, blobs)
    blobs.close()
    metadata.close()


@pytest.fixture
def zk_stores(zk_uri: str, s3_uri: str) -> Iterator[Stores]:
    """Real ZooKeeper + S3 only: for what only they can tell (e.g. ZooKeeper requests per call)."""
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(s3_uri)
    yield Stores("zk+s3", metadata, blobs)
    blobs.close()
    metadata.close()


#: The blob store methods ``blob_calls`` records.
BLOB_METHODS = ("put", "put_stream", "get", "get_stream", "delete", "list", "check")


@pytest.fixture
def blob_calls(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every call made to ``stores.blobs`` from here on, in order (for the tests that
    a call makes no blob store request at all)."""
    seen: list[str] = []
    for name in BLOB_METHODS:
        method = getattr(stores.blobs, name)

        def counted(*args: object, __name: str = name, __method: Callable[..., object] = method) -> object:
            seen.append(__name)
            return __method(*args)

        monkeypatch.setattr(stores.blobs, name, counted)
    return seen
