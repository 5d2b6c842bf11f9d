"""Embedded-store specifics: durability, the one-process directory lock, thread safety."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from snapcoord.coordinator.errors import BadVersionError, StoreUnavailable, TransactionFailed
from snapcoord.coordinator.storage.local.embedded import DB_FILE, EmbeddedMetadataStore
from snapcoord.coordinator.storage.metadata import Create, Delete, SetData

WAIT_S = 60.0


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=WAIT_S
    )


OPEN_AND_WRITE = """
    import sys
    from snapcoord.coordinator.storage.local.embedded import EmbeddedMetadataStore
    from snapcoord.coordinator.errors import StoreUnavailable
    try:
        store = EmbeddedMetadataStore.from_uri(sys.argv[1])
    except StoreUnavailable as e:
        print(e)
        sys.exit(3)
    store.create("/from-child", b"hello")
    store.close()
"""


def test_data_survives_close_and_reopen(tmp_path: Path) -> None:
    uri = tmp_path.as_uri()
    store = EmbeddedMetadataStore.from_uri(uri)
    store.create("/a/b", b"one", make_parents=True)
    store.set("/a/b", b"two", version=0)
    store.transaction([Create("/a/c", b"three"), SetData("/a/b", b"four", 1)])
    store.create("/gone", b"")
    store.delete("/gone")
    before = {path: store.get(path) for path in ("/", "/a", "/a/b", "/a/c")}
    store.close()

    reopened = EmbeddedMetadataStore.from_uri(uri)
    try:
        assert {path: reopened.get(path) for path in before} == before
        b = reopened.get("/a/b")
        assert b is not None and b.data == b"four" and b.version == 2
        assert reopened.children("/a") == ["b", "c"]
        assert reopened.get("/gone") is None
        # Versions continue where they were: CAS across a restart works.
        with pytest.raises(BadVersionError):
            reopened.set("/a/b", b"stale", version=1)
        assert reopened.set("/a/b", b"five", version=2).version == 3
    finally:
        reopened.close()


@pytest.mark.process
def test_committed_writes_survive_a_killed_process(tmp_path: Path) -> None:
    code = """
        import os, signal, sys
        from snapcoord.coordinator.storage.local.embedded import EmbeddedMetadataStore
        store = EmbeddedMetadataStore.from_uri(sys.argv[1])
        store.create("/committed", b"before the crash")
        os.kill(os.getpid(), signal.SIGKILL)  # no close(), no cleanup
    """
    result = run_python(code, tmp_path.as_uri())
    assert result.returncode == -signal.SIGKILL, result.stderr
    store = EmbeddedMetadataStore.from_uri(tmp_path.as_uri())  # the dead process's lock is gone
    try:
        node = store.get("/committed")
        assert node is not None and node.data == b"before the crash"
    finally:
        store.close()


@pytest.mark.process
def test_second_process_fails_at_once_with_a_clear_message(tmp_path: Path) -> None:
    store = EmbeddedMetadataStore.from_uri(tmp_path.as_uri())
    try:
        result = run_python(OPEN_AND_WRITE, tmp_path.as_uri())
        assert result.returncode == 3, result.stderr
        assert "already in use" in result.stdout and str(tmp_path) in result.stdout
        assert "zk://" in result.stdout  # says what to do instead
        assert store.get("/from-child") is None
    finally:
        store.close()
    # Once closed, the directory is free for another process.
    result = run_python(OPEN_AND_WRITE, tmp_path.as_uri())
    assert result.returncode == 0, result.stdout + result.stderr
    reopened = EmbeddedMetadataStore.from_uri(tmp_path.as_uri())
    try:
        assert reopened.get("/from-child") is not None
    finally:
        reopened.close()


def test_second_store_in_the_same_process_fails(tmp_path: Path) -> None:
    store = EmbeddedMetadataStore.from_uri(tmp_path.as_uri())
    try:
        with pytest.raises(StoreUnavailable, match="already in use"):
            EmbeddedMetadataStore.from_uri(tmp_path.as_uri())
        store.create("/still", b"fine")  # the failed open did not disturb the holder
    finally:
        store.close()


def test_relative_file_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = EmbeddedMetadataStore.from_uri("file:data/md")
    try:
        store.create("/x", b"")
    finally:
        store.close()
    assert (tmp_path / "data" / "md" / DB_FILE).exists()


@pytest.mark.parametrize("uri", ["file://otherhost/dir", "file:", "zk://h:1/x"])
def test_malformed_uris_are_rejected(uri: str) -> None:
    with pytest.raises(ValueError):
        EmbeddedMetadataStore.from_uri(uri)


def test_database_uses_a_write_ahead_log(tmp_path: Path) -> None:
    store = EmbeddedMetadataStore.from_uri(tmp_path.as_uri())
    try:
        with sqlite3.connect(tmp_path / DB_FILE) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_mixed_operations_from_many_threads(tmp_path: Path) -> None:
    """Writers, transactions, readers and watches at once: every invariant holds at the end."""
    store = EmbeddedMetadataStore.from_uri(tmp_path.as_uri())
    store.create("/items", b"")
    store.create("/total", b"0")
    seen = threading.Semaphore(0)
    store.watch("/total", lambda _: seen.release())
    writers, per_writer = 6, 15
    stop_reading = threading.Event()
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            for n in range(per_writer):
                while True:
                    total = store.get("/total")
                    assert total is not None
                    try:
                        # One item and the total, together: children and total never disagree.
                        store.transaction(
                            [
                                Create(f"/items/{w}-{n}", b""),
                                SetData("/total", str(int(total.data) + 1).encode(), total.version),
                            ]
                        )
                        break
                    except TransactionFailed as e:
                        if not isinstance(e.cause, BadVersionError):
                            raise
                if n % 3 == 0:
                    store.transaction([Delete(f"/items/{w}-{n}", 0)])
        except BaseException as e:
            errors.append(e)

    def reader() -> None:
        try:
            while not stop_reading.is_set():
                store.children("/items")
                store.get("/total")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join()
    stop_reading.set()
    for t in readers:
        t.join()
    try:
        assert not errors, errors
        total = store.get("/total")
        assert total is not None and int(total.data) == writers * per_writer == total.version
        deleted_per_writer = len(range(0, per_writer, 3))
        assert len(store.children("/items")) == writers * (per_writer - deleted_per_writer)
        # Every committed change of /total was reported (one callback per change here).
        for _ in range(writers * per_writer):
            assert seen.acquire(timeout=WAIT_S)
    finally:
        store.close()


def test_a_watch_fires_only_for_changes_after_it_was_armed(tmp_path: Path) -> None:
    """Events are dispatched after the commit, on their own thread: a change committed before a
    watch was armed but dispatched after must not fire it (ZooKeeper's watches behave so; the
    contract test saw a third call for two changes when the dispatcher ran late). The dispatcher is
    held on an earlier event while /a changes and the watch is armed."""
    store = EmbeddedMetadataStore.from_uri(tmp_path.as_uri())
    try:
        store.create("/hold", b"")
        store.create("/a", b"0")
        entered, release = threading.Event(), threading.Event()

        def hold(_: str) -> None:
            entered.set()
            release.wait(WAIT_S)

        store.watch("/hold", hold)
        store.set("/hold", b"1", version=0)
        assert entered.wait(WAIT_S), "the dispatcher never ran the held callback"
        store.set("/a", b"1", version=0)  # committed, its event queued behind the held one
        calls: list[str] = []
        changed = threading.Event()

        def record(path: str) -> None:
            calls.append(path)
            changed.set()

        store.watch("/a", record)
        release.set()
        store.set("/a", b"2", version=1)  # the first change after the watch was armed
        assert changed.wait(WAIT_S), "the watch missed the change made after it was armed"
        flushed = threading.Event()  # a marker: dispatched after every earlier event
        store.watch("/hold", lambda _: flushed.set())
        store.set("/hold", b"2", version=1)
        assert flushed.wait(WAIT_S)
        assert calls == ["/a"]
    finally:
        release.set()
        store.close()
