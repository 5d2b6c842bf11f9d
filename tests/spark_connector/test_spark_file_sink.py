"""``SparkFileSink``'s record and cut on a real local table whose log is written as Spark's file sink
writes it (the runs with Spark itself are in test_spark_file_sink_savepoints.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapcoord.client import Offset
from snapcoord.spark_connector.savepoints.spark_file_sink import (
    SparkFileSink,
    UnfencedRestorableSink,
    _relative,
)
from snapcoord.spark_connector.sink.protocols import RestorableSink, RestoreRefused
from snapcoord.spark_connector.sink.spark_sink_log import LOG_DIR, SinkFileStatus, batch_id_of
from snapcoord.spark_connector.storage import LocalStorage


def write_batches(sink: SparkFileSink, batches: range, tag: str = "") -> None:
    """Batch b: two data files (none every fourth batch), written, then committed in the log."""
    table = sink.table
    for b in batches:
        files = []
        if b % 4 != 3:
            for n in range(2):
                name = f"part-{b:03d}-{n}{tag}.json"
                table.write_bytes(name, f'{{"b":{b},"n":{n}}}\n'.encode())
                files.append(SinkFileStatus(table.uri(name), table.size(name), False, 1, 1, 1))
        assert sink.log.write_batch(b, files)


def visible_names(sink: SparkFileSink) -> list[str]:
    root = sink.table.uri()
    return sorted(str(_relative(f.path, root)) for f in sink.log.files_at())


def names_through(batch: int, tag: str = "") -> list[str]:
    return sorted(f"part-{b:03d}-{n}{tag}.json" for b in range(batch + 1) if b % 4 != 3 for n in range(2))


def log_state(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / LOG_DIR).iterdir()}


def clean_up_below(root: Path, compaction: int) -> None:
    for p in (root / LOG_DIR).iterdir():
        b = batch_id_of(p.name)
        if b is not None and b < compaction:
            p.unlink()


def test_is_the_unfenced_protocol_and_records_small_positions(tmp_path: Path) -> None:
    sink = SparkFileSink(LocalStorage(tmp_path / "my table"), compact_interval=10)
    assert isinstance(sink, UnfencedRestorableSink) and not isinstance(sink, RestorableSink)
    assert sink.name == "my_table"
    write_batches(sink, range(25))
    positions = sink.batch_end_positions(22)
    by_part = {p.partition: p.offset for p in positions}
    assert by_part[0] == 23 and by_part[1] == 10 and by_part[3] == 19
    assert sorted(k for k in by_part if k >= 100) == list(range(100, 104))  # entries 19..22
    assert by_part[103] == len(names_through(22))
    with pytest.raises(LookupError, match="ends at batch 24"):
        sink.batch_end_positions(30)


@pytest.mark.parametrize("cleanup", [None, 29, 39])
@pytest.mark.parametrize("cut_at", [0, 9, 13, 19, 22])
def test_restore_keeps_exactly_the_batches_through_the_cut(
    tmp_path: Path, cut_at: int, cleanup: int | None
) -> None:
    sink = SparkFileSink(LocalStorage(tmp_path), compact_interval=10)
    write_batches(sink, range(cut_at + 1))
    positions = sink.batch_end_positions(cut_at)
    write_batches(sink, range(cut_at + 1, 45))
    if cleanup is not None:
        clean_up_below(tmp_path, cleanup)  # what Spark's log retention deletes
    sink.check_restore(positions)
    sink.restore_to(positions)
    assert sink.last_batch_id() == cut_at
    assert visible_names(sink) == names_through(cut_at)
    # Idempotent: the same restore again changes nothing.
    before = log_state(tmp_path)
    sink.restore_to(positions)
    assert log_state(tmp_path) == before
    # The restored query's next batches follow on.
    write_batches(sink, range(cut_at + 1, cut_at + 13), tag="-again")
    assert visible_names(sink) == sorted(
        names_through(cut_at) + [n for n in names_through(cut_at + 12, "-again") if int(n[5:8]) > cut_at]
    )


def test_restore_refuses_when_cut_below_since_and_changes_nothing(tmp_path: Path) -> None:
    sink = SparkFileSink(LocalStorage(tmp_path), compact_interval=10)
    write_batches(sink, range(8))
    early = sink.batch_end_positions(7)
    write_batches(sink, range(8, 26))
    late = sink.batch_end_positions(25)
    sink.restore_to(early)
    before = log_state(tmp_path)
    with pytest.raises(RestoreRefused, match="ends at batch 7"):
        sink.check_restore(late)
    with pytest.raises(RestoreRefused, match="ends at batch 7"):
        sink.restore_to(late)
    assert log_state(tmp_path) == before
    # The restored query wrote other batches 8..30: the log is past 25, but another history.
    write_batches(sink, range(8, 31), tag="-new")
    clean_up_below(tmp_path, 19)
    before = log_state(tmp_path)
    with pytest.raises(RestoreRefused, match="no longer begins with"):
        sink.restore_to(late)
    assert log_state(tmp_path) == before
    # The early snapshot is still restorable: its history is the current one's beginning.
    sink.restore_to(early)
    assert visible_names(sink) == names_through(7)


def test_restore_refuses_when_a_data_file_is_gone(tmp_path: Path) -> None:
    sink = SparkFileSink(LocalStorage(tmp_path), compact_interval=10)
    write_batches(sink, range(12))
    positions = sink.batch_end_positions(5)
    write_batches(sink, range(12, 15))
    (tmp_path / "part-004-1.json").unlink()
    before = log_state(tmp_path)
    with pytest.raises(RestoreRefused, match=r"1 data file\(s\).*part-004-1.json"):
        sink.restore_to(positions)
    assert log_state(tmp_path) == before


def test_positions_of_another_sink_are_a_value_error(tmp_path: Path) -> None:
    sink = SparkFileSink(LocalStorage(tmp_path), compact_interval=10, name="a")
    write_batches(sink, range(3))
    with pytest.raises(ValueError, match="not those of a SparkFileSink named 'a'"):
        sink.check_restore([Offset("b", 0, 3)])


def test_relative_paths() -> None:
    assert _relative("file:/t/a/b.parquet", "file:///t") == "a/b.parquet"
    assert _relative("file:///t/a%20b/c", "file:/t/") == "a b/c"
    assert _relative("file:/tx/a", "file:/t") is None
    assert _relative("sftp://u@h:22/t/a", "sftp://h:22/t") == "a"
    assert _relative("sftp://h:23/t/a", "sftp://h:22/t") is None
    assert _relative("hdfs://h/t/a", "file:/t") is None
    assert _relative("file:/t/../a", "file:/t") is None


def test_restore_interrupted_after_writing_back_completes_when_run_again(tmp_path: Path) -> None:
    """A crash after the cleaned-up entries are back but before the compaction above the cut is
    deleted leaves compactions 9 and 29: Spark would derive interval 20 from them. The same restore
    again reads the log with the recorded interval and finishes the cut."""
    sink = SparkFileSink(LocalStorage(tmp_path), compact_interval=10)
    write_batches(sink, range(16))
    positions = sink.batch_end_positions(15)
    write_batches(sink, range(16, 35))
    clean_up_below(tmp_path, 29)
    # Replay the cut up to the crash: deletes above, every entry written back, 29.compact kept.
    recorded = {b: fs for b, fs in zip(range(9, 16), _split_recorded(sink, positions), strict=True)}
    cut_plan = sink.log.plan_cut(15, recorded)
    for name in cut_plan.delete_above:
        (tmp_path / LOG_DIR / name).unlink()
    for name, data in cut_plan.write_back:
        (tmp_path / LOG_DIR / name).write_bytes(data)
    assert cut_plan.delete_last == ("29.compact",)
    assert sink.log.compact_interval() == 20
    sink.restore_to(positions)
    assert sink.log.compact_interval() == 10
    assert sink.last_batch_id() == 15
    assert visible_names(sink) == names_through(15)


def _split_recorded(sink: SparkFileSink, positions: list[Offset]) -> list[tuple[SinkFileStatus, ...]]:
    """The lines of entries 9..15 as the positions record them, cut from the log's first lines."""
    counts = [p.offset for p in sorted(positions, key=lambda p: p.partition) if p.partition >= 100]
    listed = sink.log.listed_at(sink.log.latest_batch_id() or 0)
    out, low = [], 0
    for count in counts:
        out.append(listed[low:count])
        low = count
    return out
