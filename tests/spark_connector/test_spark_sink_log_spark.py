"""Spark's file sink log against real Spark: a log Spark's own file sink wrote is read exactly, and a
log written here is what every Spark reader of the table reads (and nothing else in the directory)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from pyspark.sql import SparkSession

from harness.file_sink_streams import SCHEMA, publish_inputs, run_file_sink
from snapcoord.spark_connector.sink.spark_sink_log import (
    COMPACT_INTERVAL_CONF,
    LOG_DIR,
    SinkFileStatus,
    SparkSinkLog,
    format_entry,
    parse_entry,
)
from snapcoord.spark_connector.storage import LocalStorage

ROWS = 3


@pytest.fixture
def compact_every_3(spark: SparkSession) -> Iterator[int]:
    """Spark's file sink log compacts every 3 batches while the test runs."""
    before = spark.conf.get(COMPACT_INTERVAL_CONF, None)
    spark.conf.set(COMPACT_INTERVAL_CONF, "3")
    yield 3
    if before is None:
        spark.conf.unset(COMPACT_INTERVAL_CONF)
    else:
        spark.conf.set(COMPACT_INTERVAL_CONF, before)


def local_path(uri: str) -> Path:
    parsed = urlparse(uri)
    assert parsed.scheme == "file", uri
    return Path(unquote(parsed.path))


def rows_of(spark: SparkSession, table: Path | list[str], fmt: str = "parquet") -> list[int]:
    paths = [str(table)] if isinstance(table, Path) else table
    if not paths:
        return []
    return sorted(r["id"] for r in spark.read.format(fmt).schema(SCHEMA).load(paths).collect())


def expected_rows(batches: range) -> list[int]:
    return sorted(b * ROWS + i for b in batches for i in range(ROWS))


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_reads_the_log_spark_file_sink_wrote(
    spark: SparkSession, tmp_path: Path, compact_every_3: int, fmt: str
) -> None:
    source, table = tmp_path / "in", tmp_path / "table"
    publish_inputs(source, range(8), ROWS)
    run_file_sink(spark, source, tmp_path / "cp", table, fmt)

    names = sorted(p.name for p in (table / LOG_DIR).iterdir() if not p.name.startswith("."))
    assert {"2.compact", "5.compact"} <= set(names), names
    log = SparkSinkLog(LocalStorage(table), default_compact_interval=compact_every_3)
    assert log.compact_interval() == 3
    assert log.latest_batch_id() == 7
    # The sink log's batch ids are the query's batch ids.
    assert log.batch_ids()[-1] == 7

    files = log.files_at()
    listed = {local_path(f.path) for f in files}
    read_by_spark = {local_path(u) for u in spark.read.format(fmt).load(str(table)).inputFiles()}
    assert listed == read_by_spark
    for f in files:
        assert f.action == "add" and not f.is_dir
        assert local_path(f.path).stat().st_size == f.size
    # Every batch's state: the files of batches 0..b hold exactly those batches' rows.
    for b in range(8):
        at_b = [str(local_path(f.path)) for f in log.files_at(b)]
        assert rows_of(spark, at_b, fmt) == expected_rows(range(b + 1)), b
    # Our own formatting of what we parsed reproduces Spark's bytes.
    for name in names:
        data = (table / LOG_DIR / name).read_bytes()
        assert format_entry(parse_entry(data)) == data, name


def plant_batch(spark: SparkSession, table: Path, scratch: Path, batch: int) -> list[SinkFileStatus]:
    """Write batch ``batch``'s rows as part files into ``table`` (as a sink's tasks would) and return
    their statuses; nothing is committed."""
    out = scratch / f"b{batch}"
    rows = [(batch * ROWS + i,) for i in range(ROWS)]
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.parquet(str(out))
    statuses = []
    storage = LocalStorage(table)
    for part in sorted(out.glob("part-*.parquet")):
        name = f"{part.stem}-b{batch}.parquet"
        shutil.copyfile(part, table / name)
        st = (table / name).stat()
        statuses.append(SinkFileStatus(storage.uri(name), st.st_size, False, int(st.st_mtime * 1000)))
    return statuses


def test_spark_readers_read_exactly_the_log_written_here(
    spark: SparkSession, tmp_path: Path, compact_every_3: int
) -> None:
    table, scratch = tmp_path / "table", tmp_path / "scratch"
    table.mkdir()
    log = SparkSinkLog(LocalStorage(table), default_compact_interval=compact_every_3)
    for b in range(8):
        assert log.write_batch(b, plant_batch(spark, table, scratch, b))
    assert (table / LOG_DIR / "5.compact").exists()
    # Part files no log entry names: a batch written but never committed.
    plant_batch(spark, table, scratch, 99)

    assert rows_of(spark, table) == expected_rows(range(8))
    stream = (
        spark.readStream.schema(SCHEMA)
        .parquet(str(table))
        .writeStream.format("memory")
        .queryName("sink_log_reader")
        .option("checkpointLocation", str(tmp_path / "reader-cp"))
        .trigger(availableNow=True)
        .start()
    )
    stream.awaitTermination()
    assert stream.exception() is None
    got = sorted(r["id"] for r in spark.sql("select * from sink_log_reader").collect())
    assert got == expected_rows(range(8))

    # Cut back to batch 4: every reader then sees batches 0..4 only.
    log.cut(4, log.entries_for(4))
    assert rows_of(spark, table) == expected_rows(range(5))


def drop_commit(checkpoint: Path, batch: int) -> None:
    """Make the query run ``batch`` again: its offsets stay, its commit (and checksum) goes."""
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


def test_spark_file_sink_writes_again_a_batch_whose_entry_was_cut(
    spark: SparkSession, tmp_path: Path, compact_every_3: int
) -> None:
    """The rule the built-in sink's restore relies on: Spark's file sink skips a batch whose id is at
    most the log's latest, so a cut log makes it write the removed batches again."""
    source, table, cp = tmp_path / "in", tmp_path / "table", tmp_path / "cp"
    publish_inputs(source, range(4), ROWS)
    run_file_sink(spark, source, cp, table, "parquet")
    log = SparkSinkLog(LocalStorage(table), default_compact_interval=compact_every_3)
    assert log.latest_batch_id() == 3
    drop_commit(cp, 3)
    log.cut(2, log.entries_for(2))
    assert rows_of(spark, table) == expected_rows(range(3))
    run_file_sink(spark, source, cp, table, "parquet")
    assert log.latest_batch_id() == 3
    assert rows_of(spark, table) == expected_rows(range(4))
    # And without the cut it is skipped (rows are not written twice; nothing new appears).
    drop_commit(cp, 3)
    before = sorted(p.name for p in table.glob("part-*"))
    run_file_sink(spark, source, cp, table, "parquet")
    assert sorted(p.name for p in table.glob("part-*")) == before
    assert rows_of(spark, table) == expected_rows(range(4))
