"""The BlobStore contract, run against every backend: a local directory and a real S3 (SeaweedFS)."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.concurrency import run_threads
from snapcoord.coordinator.errors import BlobNotFound, InvalidArgument, StoreUnavailable
from snapcoord.coordinator.storage.backends import open_blob_store
from snapcoord.coordinator.storage.blobs import BlobStore


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    # Only the S3 cases ask for (and so start) the server.
    uri = (tmp_path / "blobs").as_uri() if request.param == "local" else request.getfixturevalue("s3_uri")
    s = open_blob_store(uri)
    yield s
    s.close()


def keys_of(store: BlobStore, prefix: str = "", **kwargs: int) -> list[str]:
    return [info.key for info in store.list(prefix, **kwargs)]


def test_check_passes_on_a_usable_store(store: BlobStore) -> None:
    store.check()  # raises StoreUnavailable when the location cannot be used


def test_put_then_get(store: BlobStore) -> None:
    store.put("a/b/c.json", b'{"version": 1}')
    assert store.get("a/b/c.json") == b'{"version": 1}'


def test_get_missing_raises_blob_not_found(store: BlobStore) -> None:
    with pytest.raises(BlobNotFound):
        store.get("missing")
    store.put("dir/present", b"x")
    with pytest.raises(BlobNotFound):
        store.get("dir/absent")
    with pytest.raises(BlobNotFound):
        store.get("dir")  # a "directory" of other keys is not an object


def test_overwrite_replaces(store: BlobStore) -> None:
    store.put("k", b"first")
    store.put("k", b"second, longer than the first")
    store.put("k", b"3rd")
    assert store.get("k") == b"3rd"
    assert keys_of(store) == ["k"]


def test_binary_and_empty_objects(store: BlobStore) -> None:
    data = bytes(range(256)) * 16
    store.put("bin", data)
    store.put("empty", b"")
    assert store.get("bin") == data
    assert store.get("empty") == b""
    sizes = {info.key: info.size for info in store.list()}
    assert sizes == {"bin": len(data), "empty": 0}


def test_large_object(store: BlobStore) -> None:
    data = random.randbytes(5 * 1024 * 1024 + 123)
    store.put("large/object.bin", data)
    assert store.get("large/object.bin") == data
    [info] = list(store.list("large/"))
    assert info.size == len(data)


def test_delete_is_idempotent(store: BlobStore) -> None:
    store.put("d/k", b"x")
    store.put("d/other", b"y")
    store.delete("d/k")
    with pytest.raises(BlobNotFound):
        store.get("d/k")
    store.delete("d/k")
    store.delete("never/existed")
    assert keys_of(store) == ["d/other"]
    store.delete("d/other")
    assert keys_of(store) == []
    store.put("d/k", b"again")  # a deleted key (and its emptied "directory") can be used again
    assert store.get("d/k") == b"again"


def test_list_in_key_order_with_prefix(store: BlobStore) -> None:
    # Keys whose order differs from a naive directory walk: '-' < '/' < '0' < 'a' in key order.
    keys = ["a/b", "a/c/d", "a/c/e", "a-b", "a0", "ab", "b", "p/x/1", "p/x/2", "p/y", "pq", "z/z/z/z"]
    for key in random.sample(keys, len(keys)):
        store.put(key, key.encode())
    assert keys_of(store) == sorted(keys)
    for prefix in ("a", "a/", "a/c", "a/c/", "a-", "p", "p/x/", "p/x/1", "z/z/", "nothing", "p/nothing/"):
        assert keys_of(store, prefix) == [k for k in sorted(keys) if k.startswith(prefix)], prefix
    assert keys_of(store, "a")[:2] == ["a-b", "a/b"]  # not the order of a directory walk
    infos = list(store.list("p/"))
    assert [i.size for i in infos] == [len(k) for k in ("p/x/1", "p/x/2", "p/y")]


def test_list_modified_before(store: BlobStore) -> None:
    store.put("old", b"1")
    [info] = list(store.list())
    # Cut-offs derived from the listed time itself, so no clock comparison and no sleeping.
    assert keys_of(store, modified_before_ms=info.last_modified_ms) == []
    assert keys_of(store, modified_before_ms=info.last_modified_ms + 1) == ["old"]
    assert keys_of(store, modified_before_ms=0) == []
    store.put("new", b"2")
    newer = {i.key: i.last_modified_ms for i in store.list()}
    assert newer["new"] >= newer["old"]
    assert keys_of(store, modified_before_ms=max(newer.values()) + 1) == ["new", "old"]
    # Overwriting refreshes the time: an upload in flight is never older than the grace period.
    store.put("old", b"rewritten")
    rewritten = {i.key: i.last_modified_ms for i in store.list()}
    assert rewritten["old"] >= newer["old"]


def test_concurrent_puts(store: BlobStore) -> None:
    payloads = {i: random.randbytes(64 * 1024) for i in range(12)}

    def put(i: int) -> None:
        store.put(f"c/own-{i:02d}", payloads[i])
        store.put("c/shared", payloads[i])  # everybody overwrites the same key too

    run_threads(len(payloads), put)
    for i, data in payloads.items():
        assert store.get(f"c/own-{i:02d}") == data
    # The last writer wins whole: never a torn or mixed object.
    assert store.get("c/shared") in payloads.values()
    assert keys_of(store, "c/") == [f"c/own-{i:02d}" for i in range(12)] + ["c/shared"]


def test_concurrent_puts_and_deletes_under_one_prefix(store: BlobStore) -> None:
    """Deletes that empty a "directory" must not break puts into it at the same time."""

    def churn(i: int) -> None:
        for n in range(10):
            key = f"churn/dir/{i}-{n}"
            store.put(key, b"x")
            store.delete(key)
        store.put(f"churn/dir/kept-{i}", b"k")

    run_threads(8, churn)
    assert keys_of(store, "churn/") == [f"churn/dir/kept-{i}" for i in range(8)]


def test_malformed_keys_are_rejected(store: BlobStore) -> None:
    for bad in ("", "/abs", "a//b", "a/./b", "../up", "trailing/"):
        with pytest.raises(ValueError):
            store.put(bad, b"x")
        with pytest.raises(ValueError):
            store.get(bad)


def test_closed_store_is_unavailable(store: BlobStore) -> None:
    store.put("k", b"x")
    store.close()
    store.close()
    with pytest.raises(StoreUnavailable):
        store.get("k")
    with pytest.raises(StoreUnavailable):
        store.put("k", b"y")


# --- local store specifics --------------------------------------------------------------------------


def test_local_temp_files_are_never_listed(tmp_path: Path) -> None:
    store = open_blob_store((tmp_path / "blobs").as_uri())
    store.put("k", b"x")
    # What a writer that died between write and rename leaves behind.
    (tmp_path / "blobs" / "tmp" / "0123.tmp").write_bytes(b"partial")
    assert keys_of(store) == ["k"]
    store.put("k", b"y")  # and its own temp file is gone once put returns
    assert os.listdir(tmp_path / "blobs" / "tmp") == ["0123.tmp"]


def test_a_local_delete_is_on_disk_when_it_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller withdraws the intent naming an object once its delete returned; after a power
    loss an unlink not yet on disk would bring the file back named by nothing. The directory that
    held it is fsynced before delete returns."""
    store = open_blob_store((tmp_path / "blobs").as_uri())
    store.put("a/b/k", b"x")
    store.put("a/b/other", b"y")
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    store.delete("a/b/k")
    monkeypatch.undo()
    assert synced == [str(tmp_path / "blobs" / "objects" / "a" / "b")]
    assert keys_of(store) == ["a/b/other"]


def test_local_relative_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_blob_store("file:rel/blobs")
    store.put("k", b"x")
    assert (tmp_path / "rel" / "blobs" / "objects" / "k").read_bytes() == b"x"


def test_local_key_that_is_also_a_directory_is_rejected(tmp_path: Path) -> None:
    """S3 allows both ``a`` and ``a/b``; files cannot. The coordinator never needs it (keys end in a UUID)."""
    store = open_blob_store((tmp_path / "blobs").as_uri())
    store.put("a", b"object")
    with pytest.raises(InvalidArgument):
        store.put("a/b", b"under an object")
    store.put("x/y", b"object")
    with pytest.raises(InvalidArgument):
        store.put("x", b"over a directory")
    assert keys_of(store) == ["a", "x/y"]
    assert os.listdir(tmp_path / "blobs" / "tmp") == []


def test_get_stream_yields_bounded_pieces_in_order(store: BlobStore) -> None:
    """A payload read in pieces of at most chunk_bytes, as the reader consumes them."""
    data = random.Random(7).randbytes(5 * 65536 + 123)
    store.put("stream/a", data)
    pieces = list(store.get_stream("stream/a", 65536))
    assert all(0 < len(p) <= 65536 for p in pieces)
    assert len(pieces) >= 6 and b"".join(pieces) == data
    store.put("stream/empty", b"")
    assert b"".join(store.get_stream("stream/empty", 65536)) == b""
    with pytest.raises(BlobNotFound):
        store.get_stream("stream/missing", 65536)


def test_a_stream_stopped_early_releases_its_reader(store: BlobStore) -> None:
    store.put("stream/b", b"x" * 300_000)
    for _ in range(50):  # leaking a file or connection each time would exhaust the pool
        pieces = store.get_stream("stream/b", 1000)
        assert next(pieces) == b"x" * 1000
        pieces.close()
    assert b"".join(store.get_stream("stream/b", 100_000)) == b"x" * 300_000


def test_put_stream_stores_many_pieces_as_one_object(store: BlobStore) -> None:
    """More than one S3 part (8 MiB), in uneven pieces, and the empty and one-piece cases."""
    rng = random.Random(3)
    pieces = [rng.randbytes(rng.randrange(1, 3 * 1024 * 1024)) for _ in range(9)]
    store.put_stream("streamed/big", iter(pieces))
    assert store.get("streamed/big") == b"".join(pieces)
    store.put_stream("streamed/empty", iter([]))
    assert store.get("streamed/empty") == b""
    store.put_stream("streamed/small", iter([b"a", b"", b"bc"]))
    assert store.get("streamed/small") == b"abc"
    assert keys_of(store, "streamed/") == ["streamed/big", "streamed/empty", "streamed/small"]


def test_a_failed_put_stream_leaves_nothing(store: BlobStore, request: pytest.FixtureRequest) -> None:
    """The producer of the pieces fails after more than one part was sent: no object, and on S3 no
    multipart upload left open (its parts would cost storage forever)."""

    class Refused(Exception):
        pass

    def pieces() -> Iterator[bytes]:
        for _ in range(20):
            yield b"p" * (1024 * 1024)
        raise Refused("the client went away")

    with pytest.raises(Refused):
        store.put_stream("broken/obj", pieces())
    with pytest.raises(BlobNotFound):
        store.get("broken/obj")
    assert keys_of(store, "broken/") == []
    if "s3" in request.node.callspec.id:
        s3 = request.getfixturevalue("s3_client")
        server = request.getfixturevalue("s3_server")
        open_uploads = s3.list_multipart_uploads(Bucket=server.bucket).get("Uploads", [])
        assert [u["Key"] for u in open_uploads if u["Key"].endswith("broken/obj")] == []
        # The listing does show an open upload (so the check above can fail).
        probe = s3.create_multipart_upload(Bucket=server.bucket, Key="probe/broken/obj")["UploadId"]
        listed = s3.list_multipart_uploads(Bucket=server.bucket).get("Uploads", [])
        s3.abort_multipart_upload(Bucket=server.bucket, Key="probe/broken/obj", UploadId=probe)
        assert "probe/broken/obj" in [u["Key"] for u in listed]
