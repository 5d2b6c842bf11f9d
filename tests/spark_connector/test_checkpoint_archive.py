"""The checkpoint cut and its archive, on checkpoint directories laid out as Spark writes them, and
the cut between two queries (on a real coordinator, without Spark)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, SnapshotState
from snapcoord.spark_connector.app_snapshots import (
    ARCHIVE_KEY,
    BATCH_ID_KEY,
    SINK_POSITIONS_KEY,
    SnapshotNotCompleted,
    SnapshotQuery,
    downstream_first,
    take_snapshot,
)
from snapcoord.spark_connector.checkpoint_archive import (
    CheckpointNotReady,
    archive_chunks,
    cut_checkpoint,
    extract_archive,
    local_checkpoint,
    stage_cut,
)
from snapcoord.spark_connector.commit_log import Commit, commits_fingerprint
from snapcoord.spark_connector.sinks import PartitionedFileSink


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


def test_cut_is_the_last_batch_with_offsets_and_commit(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=6, last_commit=5)  # batch 6 is running
    cut = cut_checkpoint(cp)
    assert cut.batch_id == 5
    assert cut.source_offsets == ('{"logOffset": 5}', '{"topic": {"0": 50}}')
    with pytest.raises(CheckpointNotReady):
        cut_checkpoint(tmp_path / "missing")


def test_stage_copies_exactly_what_a_restart_from_the_cut_reads(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=11, last_commit=10)
    staging = tmp_path / "stage" / "checkpoint"
    cut = stage_cut(cp, staging)
    assert cut.batch_id == 10
    staged = set(listing(staging))
    deltas = {f"state/0/1/{v}.delta" for v in range(1, 12)} | {
        f"state/0/1/.{v}.delta.crc" for v in range(1, 12)
    }
    assert staged == {
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
    # Hard links: the copy costs no bytes, and it survives Spark deleting the originals.
    assert (staging / "state/0/1/3.delta").stat().st_ino == (cp / "state/0/1/3.delta").stat().st_ino
    (cp / "state/0/1/3.delta").unlink()
    assert (staging / "state/0/1/3.delta").read_bytes() == bytes([3]) * 100


def test_stage_starts_over_when_the_cut_is_purged_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=4, last_commit=4)
    import snapcoord.spark_connector.checkpoint_archive as archive

    real_link = archive._link_or_copy
    purged: list[int] = []

    def link_while_spark_runs(src: Path, dst: Path) -> None:
        if not purged and src.name == "2.delta":
            # Spark commits batch 5 and purges everything of batches <= 3 in the middle of the copy.
            (cp / "offsets" / "5").write_text(offsets_entry(5, {"topic": {"0": 50}}))
            (cp / "state/0/1/6.delta").write_bytes(b"6" * 100)
            (cp / "commits" / "5").write_text("v1\n{}\n")
            for b in range(4):
                (cp / "offsets" / str(b)).unlink()
            purged.append(1)
        real_link(src, dst)

    monkeypatch.setattr(archive, "_link_or_copy", link_while_spark_runs)
    staging = tmp_path / "stage" / "checkpoint"
    assert stage_cut(cp, staging).batch_id == 5
    assert {"offsets/4", "offsets/5", "state/0/1/6.delta"} <= set(listing(staging))
    assert "offsets/3" not in listing(staging)


def test_archive_round_trip_streams_and_extracts_atomically(tmp_path: Path) -> None:
    cp = make_checkpoint(tmp_path, last_offsets=3, last_commit=3)
    big = cp / "state" / "0" / "1" / "4.snapshot"
    big.write_bytes(bytes(range(256)) * 9000)  # > 2 pieces of 1 MiB
    chunks = list(archive_chunks(cp))
    assert max(len(c) for c in chunks) <= 1024 * 1024
    target = tmp_path / "restored" / "cp"
    extract_archive(iter(chunks), target, prepare=lambda d: (d / "metadata").write_text("new\n"))
    expected = listing(cp)
    expected["metadata"] = hashlib.sha256(b"new\n").hexdigest()
    assert listing(target) == expected
    with pytest.raises(FileExistsError):
        extract_archive(iter(chunks), target)

    # A stream cut short leaves nothing behind: no target, no partial directory.
    broken = tmp_path / "broken" / "cp"
    with pytest.raises(Exception, match=r"unexpected end|truncated"):
        extract_archive(iter(chunks[: len(chunks) // 2]), broken)
    assert list(broken.parent.iterdir()) == []


def test_local_checkpoint_locations() -> None:
    assert local_checkpoint("/chk/a") == Path("/chk/a")
    assert local_checkpoint("file:///chk/a%20b") == Path("/chk/a b")
    with pytest.raises(ValueError, match="only local checkpoints"):
        local_checkpoint("s3a://bucket/chk")


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
        extract_archive(client.read_checkpoint("pipe", gen, "a", ARCHIVE_KEY), restored)
        assert cut_checkpoint(restored).batch_id == 4
        assert (restored / "state/0/1/5.delta").exists() and not (restored / "state/0/1/6.delta").exists()
