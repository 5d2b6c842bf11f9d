"""One contract for every ``Storage`` backend, each on a real store.

Backends: a local directory; Spark's Hadoop FileSystem over sftp (the test sshd), over ``file:``, over
``s3a://`` (hadoop-aws 3.5.0 on SeaweedFS: conditional create) and over ``hdfs://`` (the HDFS
minicluster); fsspec over sftp (paramiko, the same sshd) and over S3 (s3fs on SeaweedFS). Each test gets
a fresh root.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.concurrency import run_threads
from harness.locations import TestDir, sftp_dir
from harness.seaweed import SeaweedS3Server
from harness.sshd import SshServer
from snapcoord.spark_connector.storage import LocalStorage, Storage, open_location
from snapcoord.spark_connector.storage.fsspec_storage import FsspecStorage
from snapcoord.spark_connector.storage.hadoop import HadoopStorage, hadoop_storage

pytestmark = pytest.mark.spark

BACKENDS = ("local", "hadoop-file", "hadoop-sftp", "hadoop-s3a", "hadoop-hdfs", "fsspec-sftp", "fsspec-s3")


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    kind: str = request.param
    if kind == "local":
        yield LocalStorage(tmp_path / "root")
    elif kind == "hadoop-file":
        spark: SparkSession = request.getfixturevalue("spark")
        s = hadoop_storage(spark, (tmp_path / "root").as_uri())
        assert s.fs_class.endswith("LocalFileSystem")
        yield s
    elif kind in ("hadoop-sftp", "fsspec-sftp"):
        sshd: SshServer = request.getfixturevalue("sshd")
        with sftp_dir(sshd, request.node.name) as d:
            if kind == "hadoop-sftp":
                storage = open_location(d.uri, spark=request.getfixturevalue("spark"))
                assert isinstance(storage, HadoopStorage)
            else:
                storage = open_location(d.uri, use_jvm=False, storage_options=sshd.storage_options())
                assert isinstance(storage, FsspecStorage)
            yield storage
    elif kind in ("hadoop-s3a", "hadoop-hdfs"):
        fixture = "s3a_dir" if kind == "hadoop-s3a" else "hdfs_dir"
        directory: TestDir = request.getfixturevalue(fixture)
        storage = open_location(directory.uri, spark=request.getfixturevalue("spark"))
        assert isinstance(storage, HadoopStorage)
        yield storage
    else:
        s3_uri: str = request.getfixturevalue("s3_uri")
        s3: SeaweedS3Server = request.getfixturevalue("s3_server")
        storage = open_location(
            s3_uri.replace("s3://", "s3a://"),
            use_jvm=False,
            storage_options={"endpoint_url": s3.endpoint_url},
        )
        assert isinstance(storage, FsspecStorage)
        yield storage


def test_write_read_list_nested(storage: Storage) -> None:
    storage.write_bytes("a/b/c.json", b'{"x": 1}')
    storage.write_bytes("a/top", b"")
    storage.write_bytes("z", b"zz")
    assert storage.read_bytes("a/b/c.json") == b'{"x": 1}'
    assert storage.read_bytes("a/top") == b""
    assert storage.exists("a/b/c.json") and storage.exists("a/b") and storage.exists("z")
    assert storage.size("a/b/c.json") == 8 and storage.size("z") == 2
    assert [(e.name, e.is_dir, e.size) for e in storage.list()] == [("a", True, 0), ("z", False, 2)]
    assert [(e.name, e.is_dir) for e in storage.list("a")] == [("b", True), ("top", False)]
    assert [(e.name, e.size) for e in storage.list("a/b")] == [("c.json", 8)]
    assert storage.list("z") == []  # a file has nothing below it
    assert storage.uri("a/b/c.json") == storage.uri().rstrip("/") + "/a/b/c.json"


def test_missing_objects(storage: Storage) -> None:
    assert not storage.exists("nope")
    assert storage.list("nope") == []
    assert storage.list() == []
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("nope/x")
    with pytest.raises(FileNotFoundError):
        storage.size("nope")
    with pytest.raises(FileNotFoundError):
        b"".join(storage.read_chunks("nope"))
    assert storage.delete("nope") is False
    storage.delete_tree("nope")  # nothing to do, no error


def test_overwrite_and_delete(storage: Storage) -> None:
    storage.write_bytes("d/f", b"one")
    storage.write_bytes("d/f", b"two, longer")
    assert storage.read_bytes("d/f") == b"two, longer"
    assert [e.name for e in storage.list("d")] == ["f"]  # no temporary file left behind
    with pytest.raises(IsADirectoryError):
        storage.delete("d")
    assert storage.delete("d/f") is True
    assert not storage.exists("d/f")
    assert storage.delete("d/f") is False


def test_delete_tree_removes_only_the_tree(storage: Storage) -> None:
    for name in ("t/a", "t/sub/b", "t/sub/deeper/c", "keep/t", "t2"):
        storage.write_bytes(name, name.encode())
    storage.delete_tree("t")
    assert not storage.exists("t/a") and not storage.exists("t/sub/deeper/c")
    assert storage.read_bytes("keep/t") == b"keep/t"
    assert storage.read_bytes("t2") == b"t2"
    assert [e.name for e in storage.list() if e.name != "t"] == ["keep", "t2"]


def test_exclusive_write(storage: Storage) -> None:
    storage.write_bytes("log/0", b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        storage.write_bytes("log/0", b"second", exclusive=True)
    assert storage.read_bytes("log/0") == b"first"
    assert [e.name for e in storage.list("log")] == ["0"]


def test_exclusive_write_race(storage: Storage) -> None:
    """Several writers create one name at once: where the store is atomic, exactly one wins and its
    bytes are what is stored; elsewhere at least one wins and the stored bytes are a winner's, whole."""
    writers = 6
    won: list[int] = []
    lost: list[int] = []

    def write(i: int) -> None:
        try:
            storage.write_bytes("commit", f"writer {i} ".encode() * 1000, exclusive=True)
            won.append(i)
        except FileExistsError:
            lost.append(i)

    run_threads(writers, write)  # any other error fails the test
    assert len(won) + len(lost) == writers
    stored = storage.read_bytes("commit")
    if storage.atomic_exclusive:
        assert len(won) == 1, f"{len(won)} writers won an atomic exclusive write"
    assert won
    assert stored in {f"writer {i} ".encode() * 1000 for i in won}
    assert [e.name for e in storage.list()] == ["commit"]


def test_large_streamed_file(storage: Storage) -> None:
    data = os.urandom(5 * 1024 * 1024 + 123)
    pieces = [data[i : i + 700_000] for i in range(0, len(data), 700_000)]
    storage.write_chunks("big/file.bin", iter(pieces))
    assert storage.size("big/file.bin") == len(data)
    chunks = list(storage.read_chunks("big/file.bin", chunk_bytes=1 << 20))
    assert all(len(c) <= 1 << 20 for c in chunks)
    assert b"".join(chunks) == data
    assert storage.read_bytes("big/file.bin") == data


def test_upload_and_download(storage: Storage, tmp_path: Path) -> None:
    data = os.urandom(6 * 1024 * 1024 + 7)
    source = tmp_path / "up.bin"
    source.write_bytes(data)
    storage.upload(source, "u/v/up.bin")
    assert storage.size("u/v/up.bin") == len(data)
    assert [e.name for e in storage.list("u/v")] == ["up.bin"]
    copy = tmp_path / "down" / "copy.bin"
    copy.parent.mkdir()
    copy.write_bytes(b"an older local file")
    storage.download("u/v/up.bin", copy)
    assert copy.read_bytes() == data
    storage.upload(tmp_path / "down" / "copy.bin", "u/v/up.bin")  # replaces the object
    storage.write_bytes("small", b"tiny")
    storage.download("small", copy)
    assert copy.read_bytes() == b"tiny"
    with pytest.raises(FileNotFoundError):
        storage.download("u/missing", tmp_path / "down" / "missing.bin")
    assert sorted(os.listdir(tmp_path / "down")) == ["copy.bin"]  # no partial or temporary file
    with pytest.raises(FileNotFoundError):
        storage.upload(tmp_path / "no-such-file", "u/x")
    assert not storage.exists("u/x")


def test_child_is_the_same_store(storage: Storage) -> None:
    child = storage.child("x/y")
    child.write_bytes("f", b"via child")
    assert storage.read_bytes("x/y/f") == b"via child"
    assert child.uri("f") == storage.uri("x/y/f")
    assert child.location == storage.uri("x/y")
    assert child.atomic_exclusive == storage.atomic_exclusive
    assert [e.name for e in child.list()] == ["f"]


@pytest.mark.parametrize("bad", ["../x", "/abs", "a//b", "a/./b", "a/../b"])
def test_paths_outside_the_root_are_refused(storage: Storage, bad: str) -> None:
    with pytest.raises(ValueError):
        storage.write_bytes(bad, b"x")
    with pytest.raises(ValueError):
        storage.read_bytes(bad)


def test_atomic_exclusive_is_honest(storage: Storage) -> None:
    expected: dict[type, Callable[[Storage], bool]] = {
        LocalStorage: lambda s: True,
        # S3A with conditional create (hadoop-aws 3.5.0 on SeaweedFS) and HDFS (the NameNode's rename)
        # are atomic; sftp and local file systems through Hadoop check, then rename.
        HadoopStorage: lambda s: isinstance(s, HadoopStorage) and s.scheme in ("s3a", "hdfs"),
        FsspecStorage: lambda s: isinstance(s, FsspecStorage) and s.protocol == "s3",
    }
    assert storage.atomic_exclusive == expected[type(storage)](storage)
