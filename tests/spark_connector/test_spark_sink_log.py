"""Spark's file sink log: the pure format and batch arithmetic, and reads, writes and cuts on a real
local directory (the Spark-facing checks are in test_spark_sink_log_spark.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snapcoord.spark_connector.sink.spark_sink_log import (
    LOG_DIR,
    SinkFileStatus,
    SinkLogError,
    SparkSinkLog,
    batch_id_of,
    batches_before_compaction,
    derive_compact_interval,
    entry_name,
    format_entry,
    is_compaction_batch,
    parse_entry,
    valid_batches,
)
from snapcoord.spark_connector.storage import LocalStorage


def status(name: str, size: int = 10) -> SinkFileStatus:
    return SinkFileStatus(f"file:/t/{name}", size, False, 1700000000000, 1, 33554432, "add")


# ---- format ----------------------------------------------------------------------------------------


def test_format_is_spark_layout() -> None:
    data = format_entry([status("a"), status("b", 7)])
    assert data == (
        b"v1\n"
        b'{"path":"file:/t/a","size":10,"isDir":false,"modificationTime":1700000000000,'
        b'"blockReplication":1,"blockSize":33554432,"action":"add"}\n'
        b'{"path":"file:/t/b","size":7,"isDir":false,"modificationTime":1700000000000,'
        b'"blockReplication":1,"blockSize":33554432,"action":"add"}'
    )
    assert format_entry([]) == b"v1"


@pytest.mark.parametrize("path", ["file:/t/a b", 'q"u\\o\tte', "\u00e9\u2028\U0001f600", "\x00\x1f\x7f"])
def test_line_is_json_dumps(path: str) -> None:
    f = SinkFileStatus(path, 2**40, True, -1, 3, 0, "delete")
    assert f.to_line() == json.dumps(f.to_json(), separators=(",", ":"), ensure_ascii=False)
    assert parse_entry(format_entry([f, f])) == (f, f)


def test_parse_rejects_two_values_on_one_line() -> None:
    line = json.dumps(status("a").to_json())
    with pytest.raises(SinkLogError, match="line 2"):
        parse_entry(f"v1\n{line},{line}\n{line}".encode())


def test_parse_round_trips_and_accepts_spark_line_ends() -> None:
    files = (status("a"), status("b%20c"), SinkFileStatus("file:/t/d", 0, True, action="delete"))
    assert parse_entry(format_entry(files)) == files
    assert parse_entry(format_entry(files).replace(b"\n", b"\r\n") + b"\r\n") == files
    assert parse_entry(b"v1") == ()
    assert parse_entry(b"v1\n") == ()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty"),
        (b"v2\n", "log version v2"),
        (b"x1\n", "not a log version"),
        (b"v1\n{not json}", "line 2"),
        (b'v1\n{"path":"p"}', "field 'size'"),
        (b"v1\n[]", "JSON object"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_parse_rejects_what_spark_cannot_read(data: bytes, needle: str) -> None:
    with pytest.raises(SinkLogError, match="the-name") as info:
        parse_entry(data, "the-name")
    assert needle in str(info.value)


def test_parse_rejects_wrong_field_types() -> None:
    good = status("a").to_json()
    for key, bad in [("size", True), ("size", 1.5), ("isDir", 0), ("action", "move"), ("path", 3)]:
        line = dict(good, **{key: bad})
        with pytest.raises(SinkLogError, match="line 2"):
            parse_entry(b"v1\n" + json.dumps(line).encode())


# ---- batch arithmetic --------------------------------------------------------------------------------


def test_names_and_batch_ranges() -> None:
    assert [b for b in range(31) if is_compaction_batch(b, 10)] == [9, 19, 29]
    assert entry_name(19, 10) == "19.compact"
    assert entry_name(20, 10) == "20"
    assert batch_id_of("19.compact") == 19
    assert batch_id_of("7") == 7
    for other in [".7.tmp", "7.crc", "-1", "\uff17", "", ".compact", "7.compact.tmp"]:
        assert batch_id_of(other) is None, other
    assert list(valid_batches(25, 10)) == list(range(19, 26))
    assert list(valid_batches(19, 10)) == [19]
    assert list(valid_batches(5, 10)) == list(range(0, 6))
    assert list(batches_before_compaction(9, 10)) == list(range(0, 9))
    assert list(batches_before_compaction(19, 10)) == list(range(9, 19))
    with pytest.raises(ValueError):
        batches_before_compaction(18, 10)


@pytest.mark.parametrize(
    ("default", "compactions", "want"),
    [
        (10, [], 10),
        (10, [9, 19, 29], 10),
        (3, [9, 19], 10),
        (10, [9], 10),
        (10, [4], 5),
        (10, [19], 20),  # 10 is not below 20 // 2: Spark keeps 20
        (10, [29], 10),
        (5, [11], 6),
        (7, [40], 41),
    ],
)
def test_compact_interval_is_derived_as_spark_does(default: int, compactions: list[int], want: int) -> None:
    assert derive_compact_interval(default, compactions) == want


# ---- on a local directory ----------------------------------------------------------------------------


def write_batches(log: SparkSinkLog, count: int) -> dict[int, tuple[SinkFileStatus, ...]]:
    """Write batches 0..count-1 (batch b has files b-0 and b-1, every third none); return the files
    visible at each batch."""
    seen: list[SinkFileStatus] = []
    states: dict[int, tuple[SinkFileStatus, ...]] = {}
    for b in range(count):
        files = [] if b % 3 == 2 else [status(f"{b}-0"), status(f"{b}-1")]
        assert log.write_batch(b, files)
        seen += files
        states[b] = tuple(seen)
    return states


def names_in(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / LOG_DIR).iterdir())


def test_write_read_and_compact(tmp_path: Path) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    assert log.latest_batch_id() is None
    assert log.files_at() == ()
    states = write_batches(log, 26)
    assert "9.compact" in names_in(tmp_path) and "19.compact" in names_in(tmp_path)
    assert "9" not in names_in(tmp_path)
    assert log.latest_batch_id() == 25
    assert log.batch_ids() == list(range(26))
    assert log.files_at() == states[25]
    for b in range(26):
        assert log.files_at(b) == states[b], b
    assert log.read_entry(19) == states[19]
    assert log.read_entry(21) == (status("21-0"), status("21-1"))
    assert log.read_entry(20) == ()


def test_write_is_create_if_absent_and_refuses_gaps(tmp_path: Path) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    write_batches(log, 3)
    before = (tmp_path / LOG_DIR / "1").read_bytes()
    assert log.write_batch(1, [status("other")]) is False
    assert (tmp_path / LOG_DIR / "1").read_bytes() == before
    with pytest.raises(SinkLogError, match="next batch is 3"):
        log.write_batch(4, [])
    assert names_in(tmp_path) == ["0", "1", "2"]


def test_compaction_refuses_when_an_entry_it_merges_is_missing(tmp_path: Path) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    write_batches(log, 9)
    (tmp_path / LOG_DIR / "4").unlink()
    with pytest.raises(SinkLogError, match="4 is missing"):
        log.write_batch(9, [])
    assert "9.compact" not in names_in(tmp_path)


def test_cut_deletes_newest_first_and_each_step_is_a_complete_batch(tmp_path: Path) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    states = write_batches(log, 34)
    plan = log.plan_cut(15)
    assert plan.delete_above == tuple(entry_name(b, 10) for b in range(33, 15, -1))
    assert plan.write_back == () and plan.delete_last == ()
    # Replay the plan one storage call at a time: a reader always sees some batch's full state.
    for name in plan.delete_above:
        (tmp_path / LOG_DIR / name).unlink()
        latest = log.latest_batch_id()
        assert latest is not None and latest >= 15
        assert log.files_at() == states[latest]
    assert log.latest_batch_id() == 15
    assert log.files_at() == states[15]


def test_cut_keeps_everything_at_or_below_the_cut(tmp_path: Path) -> None:
    for cut_at in [0, 8, 9, 10, 18, 19, 20, 29, 33]:
        root = tmp_path / str(cut_at)
        log = SparkSinkLog(LocalStorage(root))
        states = write_batches(log, 34)
        recorded = log.entries_for(cut_at)
        result = log.cut(cut_at, recorded)
        assert log.latest_batch_id() == cut_at
        assert log.files_at() == states[cut_at]
        assert result.written_back == ()
        assert all(batch_id_of(n) is not None and batch_id_of(n) > cut_at for n in result.deleted)  # type: ignore[operator]
        # The log then takes the next batch as Spark's sink would write it.
        assert log.write_batch(cut_at + 1, [status("again")])
        assert log.files_at() == states[cut_at] + (status("again"),)


def clean_up_below(root: Path, compaction: int) -> None:
    """Delete what Spark's log retention deletes: every entry below the compaction ``compaction``."""
    for p in (root / LOG_DIR).iterdir():
        b = batch_id_of(p.name)
        if b is not None and b < compaction:
            p.unlink()


@pytest.mark.parametrize("cut_at", [12, 19, 9, 25])
def test_cut_across_a_compaction_writes_back_the_cleaned_up_entries(tmp_path: Path, cut_at: int) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    states = write_batches(log, 45)
    recorded = log.entries_for(cut_at)
    clean_up_below(tmp_path, 29)
    # The compaction 29 above the cut is the only copy of the files at or below it.
    plan = log.plan_cut(cut_at, recorded)
    assert plan.delete_last == ("29.compact",)
    assert plan.delete_above == tuple(entry_name(b, 10) for b in range(44, 29, -1))
    # Plain entries come back before the compaction (they change no reader's view).
    assert [n for n, _ in plan.write_back][-1].endswith(".compact")
    log.cut(cut_at, recorded)
    assert log.latest_batch_id() == cut_at
    assert log.files_at() == states[cut_at]
    assert log.write_batch(cut_at + 1, [status("again")])
    assert log.files_at() == states[cut_at] + (status("again"),)


def test_cut_without_a_record_refuses_to_delete_the_only_copy(tmp_path: Path) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    write_batches(log, 35)
    clean_up_below(tmp_path, 29)
    before = {p.name: p.read_bytes() for p in (tmp_path / LOG_DIR).iterdir()}
    with pytest.raises(SinkLogError, match="nothing recorded them"):
        log.cut(15)
    assert {p.name: p.read_bytes() for p in (tmp_path / LOG_DIR).iterdir()} == before


def test_cut_refuses_a_log_behind_or_changed_below_the_cut(tmp_path: Path) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    write_batches(log, 24)
    recorded = log.entries_for(22)
    log.cut(12, log.entries_for(12))
    # Behind: the sink was cut below the recorded batch since.
    with pytest.raises(SinkLogError, match="ends at batch 12"):
        log.cut(22, recorded)
    # Changed below the cut: another history was written after the earlier cut.
    for b in range(13, 24):
        log.write_batch(b, [status(f"new-{b}")])
    before = {p.name: p.read_bytes() for p in (tmp_path / LOG_DIR).iterdir()}
    with pytest.raises(SinkLogError, match="differs from what was recorded"):
        log.cut(22, recorded)
    assert {p.name: p.read_bytes() for p in (tmp_path / LOG_DIR).iterdir()} == before


def test_cut_repeated_after_a_crash_completes(tmp_path: Path) -> None:
    log = SparkSinkLog(LocalStorage(tmp_path))
    states = write_batches(log, 40)
    recorded = log.entries_for(14)
    clean_up_below(tmp_path, 29)
    plan = log.plan_cut(14, recorded)
    # Crash after the deletes above and one entry written back.
    for name in plan.delete_above:
        (tmp_path / LOG_DIR / name).unlink()
    name, data = plan.write_back[0]
    (tmp_path / LOG_DIR / name).write_bytes(data)
    log.cut(14, recorded)
    assert log.files_at() == states[14]
    assert log.latest_batch_id() == 14


def test_checksum_files_go_with_their_entries(tmp_path: Path) -> None:
    """Hadoop's local file system keeps ``.<name>.crc`` next to each entry Spark writes: a cut
    deletes it with its entry, and a write over a name whose stale checksum remains deletes it first
    (Spark fails to write a name whose checksum file exists)."""
    log = SparkSinkLog(LocalStorage(tmp_path))
    states = write_batches(log, 14)
    for name in names_in(tmp_path):
        (tmp_path / LOG_DIR / f".{name}.crc").write_bytes(b"crc")
    plan = log.plan_cut(11)
    assert plan.delete_above == ("13", ".13.crc", "12", ".12.crc")
    log.cut(11)
    assert ".12.crc" not in names_in(tmp_path) and ".11.crc" in names_in(tmp_path)
    assert log.files_at() == states[11]
    (tmp_path / LOG_DIR / ".12.crc").write_bytes(b"stale")
    assert log.write_batch(12, [status("x")])
    assert ".12.crc" not in names_in(tmp_path)
