"""Exactly-once foreachBatch: streaming drivers SIGKILLed at every kill point, reset and run twice on
one checkpoint (``harness.eo_driver``), reading input files; the same runs over a Kafka topic are in
``kafka/test_kafka_exactly_once.py`` and ``kafka/test_kafka_zombie_reset.py``. The control run kills
the unwrapped job between the sink write and Spark's commit of batch 0 and must show the duplicates
that the wrapped job never has.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from harness.eo_driver import FIXED_KILLS, RECORDS_PER_FILE, Driver, run_kill_schedule, zombie_then_reset
from snapcoord.client import Offset
from snapcoord.spark_connector.sink.epochs import Fenced
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink

pytestmark = pytest.mark.spark


@pytest.mark.timeout(1200)  # up to 11 driver lives, each a JVM start, on 2 shared cores
def test_killed_driver_writes_every_record_exactly_once(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    run_kill_schedule(tmp_path, zk_uri, s3_uri, None, [*FIXED_KILLS, "delay"])


def test_same_kill_without_the_wrapper_duplicates_a_batch(tmp_path: Path) -> None:
    driver = Driver(tmp_path / "plain", "plain")
    driver.publish(0, 4)
    proc = driver.start(pause="after_write:1")
    line = driver.wait_for(proc, lambda ln: ln.startswith("pause "))
    assert line == "pause after_write 0"
    assert driver.kill(proc)
    driver.run_to_completion()

    expected = Counter(driver.input_ids())
    got = driver.table_ids()
    assert set(got) == set(expected)  # nothing lost...
    duplicated = sorted(i for i, c in got.items() if c > 1)
    assert len(duplicated) == RECORDS_PER_FILE, got  # ...but batch 0 (one input file) landed twice
    assert all(got[i] == 2 for i in duplicated)


@pytest.mark.timeout(600)
def test_zombie_driver_stays_invisible_and_a_checkpoint_reset_loses_nothing(tmp_path: Path) -> None:
    """Two run changes on one table, sharing driver processes: a second driver on the checkpoint of a
    stalled one, then a reset of that checkpoint."""
    zombie_then_reset(tmp_path, None)


# -- the file sink's commit log and fences, in the test session -----------------------------------------


def _ids(sink: PartitionedFileSink) -> list[int]:
    return sorted(int(r["id"]) for r in sink.read_json_records())


def test_partitioned_file_sink_commits_fences_and_rolls_back_one_attempt(
    tmp_path: Path, spark: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    table = tmp_path / "t"
    sink = PartitionedFileSink(table, partition_by=["bucket"])
    df = spark.createDataFrame([(i, f"b{i % 2}") for i in range(6)], "id long, bucket string")

    def plain_ids() -> list[int]:  # what a Spark reader that knows nothing of the sink reads
        return sorted(int(r["id"]) for r in spark.read.json(str(table)).collect())

    assert sink.positions() == [Offset("t", 0, 0), Offset("t", 1, 0)]
    assert sink.committed_files() == [] and sink.read(spark).count() == 0
    sink.fence(1)  # log entry 0: the fence's empty batch
    sink.write(df, 0)
    mark = sink.positions()
    assert mark == [Offset("t", 0, 2), Offset("t", 1, 1)]
    sink.write(df.filter("id < 3"), 1)
    assert _ids(sink) == plain_ids() == [0, 0, 1, 1, 2, 2, 3, 4, 5]
    assert {r["bucket"] for r in sink.read_json_records()} == {"b0", "b1"}
    assert [c.batch_id for c in sink.commits()] == [0, 1]

    # Files no entry lists (a write that died before its commit point) are never read.
    junk = table / "bucket=b0" / f"_w-s9-e1-a{'a' * 12}-p0" / "part-00000-junk.json"
    junk.parent.mkdir(parents=True)
    junk.write_text('{"id": 99}\n')
    assert _ids(sink) == plain_ids() == [0, 0, 1, 1, 2, 2, 3, 4, 5]
    assert sorted(r["id"] for r in sink.read(spark).collect()) == [0, 0, 1, 1, 2, 2, 3, 4, 5]
    assert sink.read(spark).columns == ["id", "bucket"]

    # A restarted driver (epoch 2) rescans, fences (entry 3), and rolls back epoch 1's attempt.
    fresh = PartitionedFileSink(table, partition_by=["bucket"])
    fresh.fence(2)
    assert fresh.positions() == [Offset("t", 0, 4), Offset("t", 1, 2)]
    fresh.rollback_to(mark)
    assert _ids(fresh) == plain_ids() == list(range(6))
    assert not junk.exists()
    attempt = fresh.positions()
    assert attempt == [Offset("t", 0, 4), Offset("t", 1, 2)]  # entries are voided, never deleted
    fresh.write(df.filter("id >= 4"), 1)
    assert _ids(fresh) == plain_ids() == [0, 1, 2, 3, 4, 4, 5, 5]

    # The old driver is a zombie: its writes fail at the fence check...
    with pytest.raises(Fenced):
        sink.write(df, 2)
    with pytest.raises(Fenced):
        sink.rollback_to(mark)
    # ...and one that passed its check just before the fence finds its number taken by the fence.
    monkeypatch.setattr(sink, "check_epoch", lambda: None)
    with pytest.raises(Fenced, match="took sequence 3"):
        sink.write(df, 2)
    assert _ids(fresh) == plain_ids() == [0, 1, 2, 3, 4, 4, 5, 5]
    assert _ids(PartitionedFileSink(table, partition_by=["bucket"])) == [0, 1, 2, 3, 4, 4, 5, 5]

    # A rollback by epoch 2 of an attempt of epoch 2 voids that attempt, deletes the zombie's
    # files, and keeps epoch 1's committed batch 0 below the position.
    fresh.rollback_to(attempt)
    assert _ids(fresh) == plain_ids() == list(range(6))
    assert [(c.kind, c.epoch, c.batch_id) for c in fresh._commits()] == [
        ("fence", 1, None),
        ("data", 1, 0),
        ("void", 2, 1),
        ("fence", 2, None),
        ("void", 2, 1),
    ]
    assert len(fresh.committed_files()) == len(list(table.glob("bucket=*/_w-*/part-*")))  # no dead files
    with pytest.raises(Fenced):
        fresh.rollback_to([Offset("t", 0, 0), Offset("t", 1, 3)])  # a newer epoch's attempt
    with pytest.raises(ValueError, match="do not name this sink"):
        fresh.rollback_to([Offset("other", 0, 0)])
