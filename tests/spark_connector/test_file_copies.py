"""Copies of many files several at a time (``savepoints.file_copies``), on local directories: every
file arrives, in order where order matters, and no copy is still running once a copy is left."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import pytest

from snapcoord.spark_connector.savepoints.file_copies import SpooledWrites, read_ahead
from snapcoord.spark_connector.storage import LocalStorage, StorageError, copy_concurrency

NAMES = [f"state/0/{i % 3}/{i}.sst" for i in range(12)]


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The spool directories go below this test's own directory (checked empty afterwards)."""
    spool_root = tmp_path / "spool-root"
    spool_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_root))
    return spool_root


def content(i: int) -> bytes:
    return f"file {i} ".encode() * (1000 * i + 1)


def filled(root: Path) -> LocalStorage:
    storage = LocalStorage(root)
    for i, name in enumerate(NAMES):
        storage.write_bytes(name, content(i))
    return storage


def worker_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("snapcoord-read-ahead", "snapcoord-write"))
    ]


def test_only_stores_that_declare_it_copy_several_files_at_once(tmp_path: Path) -> None:
    assert copy_concurrency(LocalStorage(tmp_path)) == 1

    class Declared(LocalStorage):
        concurrent_copies = 5

    class Nonsense(LocalStorage):
        concurrent_copies = 0

    assert copy_concurrency(Declared(tmp_path)) == 5
    assert copy_concurrency(Nonsense(tmp_path)) == 1


def test_read_ahead_hands_out_every_file_in_order(tmp_path: Path, private_tempdir: Path) -> None:
    storage = filled(tmp_path / "cp")
    got = [local.read_bytes() for local in read_ahead(storage, NAMES, concurrency=4)]
    assert got == [content(i) for i in range(len(NAMES))]
    assert list(private_tempdir.iterdir()) == [] and worker_threads() == []


def test_a_file_gone_fails_where_the_stream_reaches_it_and_the_earlier_ones_arrive_whole(
    tmp_path: Path, private_tempdir: Path
) -> None:
    storage = filled(tmp_path / "cp")
    storage.delete(NAMES[7])
    got: list[bytes] = []
    with pytest.raises(FileNotFoundError):
        for local in read_ahead(storage, NAMES, concurrency=4):
            got.append(local.read_bytes())
    assert got == [content(i) for i in range(7)]
    assert list(private_tempdir.iterdir()) == [] and worker_threads() == []


def test_read_ahead_left_early_stops_its_reads_and_removes_its_spool(
    tmp_path: Path, private_tempdir: Path
) -> None:
    storage = filled(tmp_path / "cp")
    reads = read_ahead(storage, NAMES, concurrency=4)
    assert next(reads).read_bytes() == content(0)
    reads.close()
    assert list(private_tempdir.iterdir()) == [] and worker_threads() == []


def test_spooled_writes_write_every_file(tmp_path: Path, private_tempdir: Path) -> None:
    target = LocalStorage(tmp_path / "restored")
    with SpooledWrites(target, concurrency=4) as writes:
        for i, name in enumerate(NAMES):
            writes.write(name, [content(i)[:10], content(i)[10:]])
    assert {n: target.read_bytes(n) for n in NAMES} == {n: content(i) for i, n in enumerate(NAMES)}
    assert list(private_tempdir.iterdir()) == [] and worker_threads() == []


class Recording(LocalStorage):
    """Uploads that fail for ``fail``; records the uploads begun and ended."""

    def __init__(self, root: Path, fail: str = "") -> None:
        super().__init__(root)
        self.fail = fail
        self.lock = threading.Lock()
        self.begun: set[str] = set()
        self.ended: set[str] = set()

    def upload(self, local_file: str | os.PathLike[str], path: str) -> None:
        with self.lock:
            self.begun.add(path)
        try:
            if path == self.fail:
                raise StorageError(f"upload of {path} refused")
            super().upload(local_file, path)
        finally:
            with self.lock:
                self.ended.add(path)


def test_a_failed_write_is_raised_and_no_write_runs_after_the_block(
    tmp_path: Path, private_tempdir: Path
) -> None:
    target = Recording(tmp_path / "restored", fail=NAMES[5])
    with pytest.raises(StorageError, match="refused"), SpooledWrites(target, concurrency=3) as writes:
        for i, name in enumerate(NAMES):
            writes.write(name, [content(i)])
    # Everything begun has ended, nothing runs any more: whatever the caller removes stays removed.
    assert target.begun == target.ended and worker_threads() == []
    written = {
        p.relative_to(tmp_path / "restored").as_posix() for p in (tmp_path / "restored").rglob("*.sst")
    }
    assert written == target.begun - {NAMES[5]}
    assert list(private_tempdir.iterdir()) == []


def test_an_error_in_the_block_drops_the_writes_not_begun_and_waits_for_the_rest(
    tmp_path: Path, private_tempdir: Path
) -> None:
    target = Recording(tmp_path / "restored")
    with pytest.raises(ValueError, match="bad member"), SpooledWrites(target, concurrency=4) as writes:
        for i, name in enumerate(NAMES[:6]):
            writes.write(name, [content(i)])
        raise ValueError("bad member")
    assert target.begun == target.ended and worker_threads() == []
    for name in target.begun:
        assert target.read_bytes(name) == content(NAMES.index(name))
    assert list(private_tempdir.iterdir()) == []


def test_one_at_a_time_writes_in_the_callers_thread_with_nothing_spooled(
    tmp_path: Path, private_tempdir: Path
) -> None:
    target = LocalStorage(tmp_path / "restored")
    with SpooledWrites(target, concurrency=1) as writes:
        writes.write(NAMES[0], iter([content(0)]))
        assert target.read_bytes(NAMES[0]) == content(0)  # written before write() returned
        assert list(private_tempdir.iterdir()) == []
    with pytest.raises(ValueError, match="at least 1"):
        SpooledWrites(target, concurrency=0)
