"""The checkpoint cut and its archive, on checkpoint directories laid out as Spark writes them, and
the cut between two queries (on a real coordinator, without Spark)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, SnapshotState
from snapcoord.spark_connector.backlog.runner import BacklogAwareRunner
from snapcoord.spark_connector.savepoints import app_snapshots
from snapcoord.spark_connector.savepoints import restore as restore_module
from snapcoord.spark_connector.savepoints.app_snapshots import (
    ARCHIVE_KEY,
    BATCH_ID_KEY,
    SINK_POSITIONS_KEY,
    SnapshotNotCompleted,
    SnapshotQuery,
    downstream_first,
    take_snapshot,
)
from snapcoord.spark_connector.savepoints.checkpoint_archive import (
    CheckpointCut,
    CheckpointNotReady,
    cut_checkpoint,
    cut_files,
    send_cut,
    unpack_chunks,
)
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, restore_snapshot
from snapcoord.spark_connector.savepoints.restore_target import (
    PLACEHOLDER_LINE,
    PendingRestore,
    RestoreMarker,
    abandon,
    claim_target,
    complete,
    unfinished_restore,
    write_archive,
)
from snapcoord.spark_connector.sink.commit_log import Commit, commits_fingerprint
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import exactly_once
from snapcoord.spark_connector.storage import LocalStorage, Storage, StorageError, UnsupportedLocation


def offsets_entry(file_log_offset: int, kafka: dict[str, dict[str, int]]) -> str:
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    return "\n".join(["v1", json.dumps(meta), json.dumps({"logOffset": file_log_offset}), json.dumps(kafka)])


def make_checkpoint(root: Path, last_offsets: int, last_commit: int) -> Path:
    """A two-source stateful checkpoint: batch b read file log entry b; state version v = b + 1."""
    cp = root / "cp"
    (cp / "metadata").parent.mkdir(parents=True)
    (cp / "metadata").write_text('{"id":"11111111-2222-3333-4444-555555555555"}\n')
    (cp / ".metadata.crc").write_bytes(b"crc")
    for b in range(last_offsets + 1):
        (cp / "offsets").mkdir(exist_ok=True)
        (cp / "offsets" / str(b)).write_text(offsets_entry(b, {"topic": {"0": 10 * b}}))
        (cp / "offsets" / f".{b}.crc").write_bytes(b"crc")
        (cp / "sources" / "0").mkdir(parents=True, exist_ok=True)
        (cp / "sources" / "0" / (f"{b}.compact" if b == 9 else str(b))).write_text(f"v1\nfile-{b}\n")
    (cp / "sources" / "1").mkdir(parents=True)
    (cp / "sources" / "1" / "0").write_text("v1\n{}\n")
    for b in range(last_commit + 1):
        (cp / "commits").mkdir(exist_ok=True)
        (cp / "commits" / str(b)).write_text("v1\n{}\n")
    store = cp / "state" / "0" / "1"
    store.mkdir(parents=True)
    (cp / "state" / "0" / "_metadata").mkdir()
    (cp / "state" / "0" / "_metadata" / "metadata").write_text("operator")
    for v in range(1, last_offsets + 2):
        (store / f"{v}.delta").write_bytes(bytes([v]) * 100)
        (store / f".{v}.delta.crc").write_bytes(b"crc")
    (store / "4.snapshot").write_bytes(b"s" * 50)
    (store / "temp-123.tmp").write_bytes(b"unfinished")
    return cp


def listing(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def archive_of(checkpoint: Storage) -> tuple[CheckpointCut, bytes]:
    """The cut of ``checkpoint`` and its archive, as ``take_snapshot`` streams it."""
    return send_cut(checkpoint, lambda cut, chunks: b"".join(chunks))


def restore_into(target: Storage, archive: bytes, batch_id: int) -> PendingRestore:
    """``restore_target``'s protocol up to its completion point."""
    marker = RestoreMarker.new("app", 1, "q", batch_id)
    claim_target(target, marker)
    return write_archive(target, [archive], marker)


def test_cut_is_the_last_batch_with_offsets_and_commit(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=6, last_commit=5)  # batch 6 is running
    cut = cut_checkpoint(LocalStorage(cp))
    assert cut.batch_id == 5
    assert cut.source_offsets == ('{"logOffset": 5}', '{"topic": {"0": 50}}')
    with pytest.raises(CheckpointNotReady):
        cut_checkpoint(LocalStorage(tmp_path / "missing"))


def test_the_cut_holds_exactly_what_a_restart_from_it_reads(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=11, last_commit=10)
    storage = LocalStorage(cp)
    cut = cut_checkpoint(storage)
    assert cut.batch_id == 10
    files = cut_files(storage, cut)
    assert all(f.size == (cp / f.path).stat().st_size for f in files)
    deltas = {f"state/0/1/{v}.delta" for v in range(1, 12)} | {
        f"state/0/1/.{v}.delta.crc" for v in range(1, 12)
    }
    assert sorted(f.path for f in files) == sorted(
        {
            "metadata",
            ".metadata.crc",
            "offsets/9",
            "offsets/.9.crc",
            "offsets/10",
            "offsets/.10.crc",
            "commits/9",
            "commits/10",
            # The file source's log up to its logOffset (10), through the compact file of 9.
            "sources/0/9.compact",
            "sources/0/10",
            *(f"sources/0/{b}" for b in range(9)),
            "sources/1/0",
            "state/0/_metadata/metadata",
            "state/0/1/4.snapshot",
            *deltas,  # version 11 = batch 10's; 12 (batch 11, not committed) stays out
        }
    )
    # The archive carries those files byte for byte, read straight from the store.
    _, archive = archive_of(storage)
    members = {m.path: b"".join(m.chunks) for m in unpack_chunks([archive])}
    assert members == {f.path: (cp / f.path).read_bytes() for f in files}


class PurgingStorage(LocalStorage):
    """A local checkpoint on which "Spark" runs ``purge`` once, when the copy first reads ``trigger``;
    copied ``concurrency`` files at a time (as object stores are: ``storage.copy_concurrency``)."""

    def __init__(self, root: Path, trigger: str, purge: Callable[[], None], concurrency: int = 1) -> None:
        super().__init__(root)
        self.trigger, self.purge, self.purged = trigger, purge, 0
        self.concurrent_copies = concurrency

    def read_chunks(self, path: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        if not self.purged and path.endswith(self.trigger):
            self.purged += 1
            self.purge()
        return super().read_chunks(path, chunk_bytes)


def commit_batch_5_and_purge(cp: Path, *, state_too: bool) -> Callable[[], None]:
    def purge() -> None:
        # Spark commits batch 5 and purges everything of batches <= 3 in the middle of the copy.
        (cp / "offsets" / "5").write_text(offsets_entry(5, {"topic": {"0": 50}}))
        (cp / "state/0/1/6.delta").write_bytes(b"6" * 100)
        (cp / "commits" / "5").write_text("v1\n{}\n")
        for b in range(4):
            (cp / "offsets" / str(b)).unlink()
        if state_too:  # a file of the cut that the copy has not read yet
            (cp / "state/0/1/3.delta").unlink()

    return purge


@pytest.mark.parametrize("concurrency", [1, 4], ids=["one-at-a-time", "read-ahead"])
@pytest.mark.parametrize("state_too", [False, True], ids=["guard", "vanished-file"])
def test_the_copy_starts_over_when_the_cut_is_purged_meanwhile(
    tmp_path: Path, state_too: bool, concurrency: int
) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=4, last_commit=4)
    purge = commit_batch_5_and_purge(cp, state_too=state_too)
    storage = PurgingStorage(cp, "2.delta", purge, concurrency)
    cut, archive = archive_of(storage)
    assert storage.purged == 1 and cut.batch_id == 5
    paths = {m.path for m in unpack_chunks([archive])}
    assert {"offsets/4", "offsets/5", "state/0/1/6.delta"} <= paths
    assert "offsets/3" not in paths


@pytest.mark.parametrize("concurrency", [1, 4], ids=["one-at-a-time", "read-ahead"])
def test_a_file_read_back_with_another_size_restarts_the_copy(tmp_path: Path, concurrency: int) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=2, last_commit=2)

    def rewrite() -> None:
        (cp / "state/0/1/1.delta").write_bytes(b"longer" * 100)

    storage = PurgingStorage(cp, "1.delta", rewrite, concurrency)
    cut, archive = archive_of(storage)
    assert storage.purged == 1 and cut.batch_id == 2
    members = {m.path: b"".join(m.chunks) for m in unpack_chunks([archive])}
    assert members["state/0/1/1.delta"] == b"longer" * 100


class ConcurrentLocal(LocalStorage):
    """A local directory copied to and from several files at a time, as object stores are."""

    concurrent_copies = 4


@pytest.mark.parametrize(
    "storage_class", [LocalStorage, ConcurrentLocal], ids=["one-at-a-time", "concurrent"]
)
def test_restore_writes_everything_but_the_completion_point_then_completes(
    tmp_path: Path, storage_class: type[LocalStorage]
) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=3, last_commit=3)
    big = cp / "state" / "0" / "1" / "4.snapshot"
    big.write_bytes(bytes(range(256)) * 9000)  # > 2 pieces of 1 MiB
    chunks: list[bytes] = []
    cut, _ = send_cut(storage_class(cp), lambda cut, c: chunks.extend(c))
    assert max(len(c) for c in chunks) <= 1024 * 1024
    target_dir = tmp_path / "restored" / "cp"
    target = storage_class(target_dir)
    pending = restore_into(target, b"".join(chunks), cut.batch_id)
    # Short of its completion point: offsets/4 is the placeholder, which Spark cannot read.
    placeholder = (target_dir / "offsets" / "4").read_text()
    assert placeholder.startswith(PLACEHOLDER_LINE + "\n")
    assert unfinished_restore(target) == pending.marker
    complete(target, pending)
    assert unfinished_restore(target) is None
    expected = {
        k: v for k, v in listing(cp).items() if k in {f.path for f in cut_files(LocalStorage(cp), cut)}
    }
    del expected[".metadata.crc"]  # the checksum of the old metadata (it has a new query id)
    new_metadata = (target_dir / "metadata").read_bytes()
    assert json.loads(new_metadata)["id"] == pending.query_id != "11111111-2222-3333-4444-555555555555"
    expected["metadata"] = hashlib.sha256(new_metadata).hexdigest()
    assert listing(target_dir) == expected
    # A stream cut at a file's end (tarfile alone would take it for the archive's end) is refused.
    with pytest.raises(EOFError, match="end marker"):
        restore_into(LocalStorage(tmp_path / "other"), b"".join(chunks[:-1]), cut.batch_id)
    # A complete checkpoint is never overwritten.
    with pytest.raises(FileExistsError, match="not empty"):
        claim_target(target, RestoreMarker.new("app", 1, "q", 3))
    assert listing(target_dir) == expected


def test_a_cut_short_stream_leaves_a_placeholder_only_the_same_restore_takes_over(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=3, last_commit=3)
    cut, archive = archive_of(LocalStorage(cp))
    target_dir = tmp_path / "broken" / "cp"
    target = LocalStorage(target_dir)
    with pytest.raises(Exception, match=r"unexpected end|truncated"):
        restore_into(target, archive[: len(archive) // 2], cut.batch_id)
    left = listing(target_dir)
    assert "offsets/4" in left and "offsets/2" in left  # the placeholder, and what was written
    # Another snapshot's restore, or another query's, is refused and changes nothing.
    for other in (RestoreMarker.new("app", 2, "q", 3), RestoreMarker.new("app", 1, "other", 3)):
        with pytest.raises(FileExistsError, match="unfinished restore of app generation 1 query q"):
            claim_target(target, other)
        assert listing(target_dir) == left
    # The same restore takes it over: files of the earlier attempt (and a metadata file a Spark
    # start wrote) are removed, the rest written again, then completed.
    (target_dir / "stray").write_text("x")
    pending = restore_into(target, archive, cut.batch_id)
    assert not (target_dir / "stray").exists()
    complete(target, pending)
    assert cut_checkpoint(target).batch_id == 3 and not (target_dir / "offsets" / "4").exists()
    assert (target_dir / "offsets" / "3").read_bytes() == (cp / "offsets" / "3").read_bytes()


def test_abandon_removes_only_a_restore_it_still_owns(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=2, last_commit=2)
    cut, archive = archive_of(LocalStorage(cp))
    target = LocalStorage(tmp_path / "t")
    first = restore_into(target, archive, cut.batch_id)
    second = restore_into(target, archive, cut.batch_id)  # a retry took it over
    abandon(target, first.marker)  # not the first's any more: nothing removed
    with pytest.raises(FileExistsError, match="taken over"):
        complete(target, first)
    assert unfinished_restore(target) == second.marker
    abandon(target, second.marker)
    assert target.list("") == [] or listing(tmp_path / "t") == {}


def test_downstream_first_orders_readers_before_what_they_read() -> None:
    sink = object()  # only its presence matters to the order
    a = SnapshotQuery("a", "/a", sink=sink)  # type: ignore[arg-type]
    b = SnapshotQuery("b", "/b", sink=sink, reads_from=("a",))  # type: ignore[arg-type]
    c = SnapshotQuery("c", "/c", reads_from=("b", "a"))
    assert [q.name for q in downstream_first([a, b, c])] == ["c", "b", "a"]
    assert [q.name for q in downstream_first([a, SnapshotQuery("x", "/x")])] == ["a", "x"]
    with pytest.raises(ValueError, match="cycle"):
        p = SnapshotQuery("p", "/p", sink=sink, reads_from=("q",))  # type: ignore[arg-type]
        downstream_first([p, SnapshotQuery("q", "/q", sink=sink, reads_from=("p",))])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no sink to cut"):
        downstream_first([SnapshotQuery("u", "/u"), SnapshotQuery("d", "/d", reads_from=("u",))])
    with pytest.raises(ValueError, match="not a query of the snapshot"):
        downstream_first([SnapshotQuery("d", "/d", reads_from=("nope",))])


# -- the cut between two queries, on a real coordinator (ZooKeeper + S3), without Spark -------------------


def commit_to_sink(sink: PartitionedFileSink, seq: int, batch_id: int) -> None:
    """A committed, empty batch ``batch_id`` at log entry ``seq`` of a ``PartitionedFileSink`` table."""
    sink._create_entry(Commit(seq, 1, batch_id, ()), [])


def fingerprint(sink: PartitionedFileSink, below: int) -> int:
    return commits_fingerprint(sink.commits(), below)


def test_upstream_is_cut_only_once_it_committed_what_its_readers_may_have_read(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> None:
    a_cp = make_checkpoint(tmp_path / "a", last_offsets=4, last_commit=3)
    b_cp = make_checkpoint(tmp_path / "b", last_offsets=2, last_commit=2)
    a_sink = PartitionedFileSink(tmp_path / "a-table", name="a")
    b_sink = PartitionedFileSink(tmp_path / "b-table")
    for b in range(5):  # A's sink shows batch 4 already; Spark has not committed it (no commits/4)
        commit_to_sink(a_sink, b, b)
    for b in range(3):
        commit_to_sink(b_sink, b, b)
    queries = [SnapshotQuery("a", str(a_cp), a_sink)]
    queries.append(SnapshotQuery("b", str(b_cp), b_sink, reads_from=("a",)))
    with (
        CoordinatorProcess(tmp_path / "coordinator", args=["--metadata", zk_uri, "--blobs", s3_uri]) as coord,
        CoordinatorClient(coord.target, timeout_s=30) as client,
    ):
        # B may have read A's batch 4, which A's checkpoint lacks: A cannot be cut, nothing completes.
        with pytest.raises(SnapshotNotCompleted, match="its sink shows batch 4") as info:
            take_snapshot(client, "pipe", queries, timeout_s=2)
        aborted = client.get_snapshot("pipe", info.value.snapshot.generation)
        assert aborted.state is SnapshotState.ABORTED
        assert [t.task_id for t in aborted.tasks] == ["b"]  # downstream first: B was cut already

        (a_cp / "commits" / "4").write_text("v1\n{}\n")  # Spark commits A's batch 4
        done = take_snapshot(client, "pipe", queries, timeout_s=60)
        gen = done.generation

        def key(task: str, name: str) -> str:
            return b"".join(client.read_checkpoint("pipe", gen, task, name)).decode()

        assert (key("a", BATCH_ID_KEY), key("b", BATCH_ID_KEY)) == ("4", "2")
        # After everything B can have read, and the fingerprint of the commits below it.
        assert json.loads(key("a", SINK_POSITIONS_KEY)) == [["a", 0, 5], ["a", 2, fingerprint(a_sink, 5)]]
        assert json.loads(key("b", SINK_POSITIONS_KEY)) == [
            ["b-table", 0, 3],
            ["b-table", 2, fingerprint(b_sink, 3)],
        ]
        # The archive is the checkpoint at A's batch 4, whatever Spark does to the live one next.
        shutil.rmtree(a_cp)
        restored = tmp_path / "restored"
        archive = b"".join(client.read_checkpoint("pipe", gen, "a", ARCHIVE_KEY))
        complete(LocalStorage(restored), restore_into(LocalStorage(restored), archive, 4))
        assert cut_checkpoint(LocalStorage(restored)).batch_id == 4
        assert (restored / "state/0/1/5.delta").exists() and not (restored / "state/0/1/6.delta").exists()


# -- locations no backend reaches: refused with the documented error, nothing written or created -------


@pytest.mark.parametrize(
    "location",
    ["nosuch://host/cp", "abfss://container@account.dfs.core.windows.net/cp"],
    ids=["unknown-scheme", "missing-extra"],
)
def test_a_location_no_backend_reaches_is_refused_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zk_coordinator: CoordinatorProcess, location: str
) -> None:
    monkeypatch.chdir(tmp_path)  # a location taken for a relative path would show up here
    scheme = location.split(":")[0]
    app = f"bad-{scheme}"
    with CoordinatorClient(zk_coordinator.target, timeout_s=30) as client:
        with pytest.raises(UnsupportedLocation, match=scheme):
            take_snapshot(client, app, [SnapshotQuery("q", location)], timeout_s=30)
        assert client.list_snapshots(app).items == ()  # refused before the snapshot was created
        good = make_checkpoint(tmp_path / "good", last_offsets=1, last_commit=1)
        done = take_snapshot(client, app, [SnapshotQuery("q", str(good))], timeout_s=60)
        before = listing(tmp_path)
        with pytest.raises(UnsupportedLocation, match=scheme):
            restore_snapshot(client, app, done.generation, [RestoreTarget("q", location)])
        writer = exactly_once(
            PartitionedFileSink(tmp_path / "table"),
            zk_coordinator.target,
            query_name="bad",
            batch_function=print,
            checkpoint_location=location,
        )
        with pytest.raises(UnsupportedLocation, match=scheme):
            writer([], 0)
        with pytest.raises(UnsupportedLocation, match=scheme):
            BacklogAwareRunner(
                lambda trigger: None,  # type: ignore[arg-type, return-value]
                "job",
                client,
                {"availableNow": True},
                {"processingTime": "1 second"},
                checkpoint_location=location,
            )
        assert listing(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["good"]
        assert client.get_snapshot(app, done.generation).state is SnapshotState.COMPLETED


@pytest.mark.parametrize("concurrency", [1, 4], ids=["one-at-a-time", "read-ahead"])
def test_a_file_vanishing_mid_upload_cuts_again_and_the_snapshot_holds_the_newer_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zk_coordinator: CoordinatorProcess, concurrency: int
) -> None:
    """The archive streams from the store into the coordinator's upload (gRPC reads the stream in a
    thread of its own): a file Spark purges meanwhile ends that upload, and the copy starts over."""
    cp = make_checkpoint(tmp_path, last_offsets=4, last_commit=4)
    storage = PurgingStorage(cp, "2.delta", commit_batch_5_and_purge(cp, state_too=True), concurrency)
    monkeypatch.setattr(app_snapshots, "open_location", lambda location, **_: storage)
    app = f"vanish-{concurrency}"
    with CoordinatorClient(zk_coordinator.target, timeout_s=30) as client:
        done = take_snapshot(client, app, [SnapshotQuery("q", str(cp))], timeout_s=60)
        assert storage.purged == 1
        assert b"".join(client.read_checkpoint(app, done.generation, "q", BATCH_ID_KEY)) == b"5"
        archive = b"".join(client.read_checkpoint(app, done.generation, "q", ARCHIVE_KEY))
    paths = {m.path for m in unpack_chunks([archive])}
    assert {"offsets/4", "offsets/5", "state/0/1/6.delta"} <= paths and "offsets/3" not in paths


class FailingUploads(ConcurrentLocal):
    """A restore target whose upload of ``fail`` is refused (a store error mid-restore)."""

    def __init__(self, root: Path, fail: str) -> None:
        super().__init__(root)
        self.fail, self.uploads = fail, 0

    def upload(self, local_file: str | os.PathLike[str], path: str) -> None:
        self.uploads += 1
        if path == self.fail:
            raise StorageError(f"upload of {path} refused")
        super().upload(local_file, path)


def test_a_restore_whose_concurrent_write_fails_leaves_nothing_and_a_retry_restores_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zk_coordinator: CoordinatorProcess
) -> None:
    """Files written several at a time: one refused write fails the restore, which removes everything
    it wrote (no write lands after that), and the same restore again writes every file of the cut."""
    cp = make_checkpoint(tmp_path, last_offsets=3, last_commit=3)
    with CoordinatorClient(zk_coordinator.target, timeout_s=30) as client:
        done = take_snapshot(client, "concurrent", [SnapshotQuery("q", str(cp))], timeout_s=60)
        target_dir = tmp_path / "restored"
        failing = FailingUploads(target_dir, fail="state/0/1/3.delta")
        monkeypatch.setattr(restore_module, "open_location", lambda location, **_: failing)
        with pytest.raises(StorageError, match="refused"):
            restore_snapshot(client, "concurrent", done.generation, [RestoreTarget("q", str(target_dir))])
        assert failing.uploads > 1
        assert not target_dir.exists() or listing(target_dir) == {}

        working = ConcurrentLocal(target_dir)
        monkeypatch.setattr(restore_module, "open_location", lambda location, **_: working)
        restored = restore_snapshot(
            client, "concurrent", done.generation, [RestoreTarget("q", str(target_dir))]
        )
    source = LocalStorage(cp)
    cut = {f.path for f in cut_files(source, cut_checkpoint(source))}
    expected = {k: v for k, v in listing(cp).items() if k in cut}
    del expected[".metadata.crc"], expected["metadata"]  # metadata gets a new query id
    got = listing(target_dir)
    assert json.loads((target_dir / "metadata").read_bytes())["id"] == restored["q"].query_id
    del got["metadata"]
    assert got == expected
    assert cut_checkpoint(working).batch_id == 3
