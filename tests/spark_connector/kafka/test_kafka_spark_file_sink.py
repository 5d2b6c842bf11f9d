"""A Kafka topic into Spark's built-in file sink under driver kills, a zombie and a checkpoint reset
(``harness.eo_file_sink``): every record of the topic in the table exactly once, as every reader sees
it, at every moment. A module of its own so that xdist runs it beside the other Kafka runs.

And the limit of a reset: Spark's sink skips every batch at or below its log's latest, whatever the
batch reads, so a reset query whose batches are larger than the old run's loses records.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from harness.eo_file_sink import file_sink_kills_zombie_and_reset, visible_ids
from harness.file_sink_streams import SCHEMA, run_file_sink
from harness.kafka import KafkaBroker, json_topic
from snapcoord.spark_connector.sink.spark_sink_log import SparkSinkLog
from snapcoord.spark_connector.storage import LocalStorage

pytestmark = pytest.mark.spark


@pytest.mark.timeout(900)
def test_killed_zombie_and_reset_drivers_write_every_record_once_through_sparks_file_sink(
    tmp_path: Path, kafka: KafkaBroker
) -> None:
    file_sink_kills_zombie_and_reset(tmp_path, kafka)


def test_a_reset_with_larger_batches_loses_the_records_of_the_skipped_batches(
    spark: SparkSession, tmp_path: Path, kafka: KafkaBroker
) -> None:
    """Why docs/spark-storage.md says to give a reset query a new path: Spark's own behaviour, shown
    so that the docs' warning stays true for the Spark the tests run."""
    topic, table = f"fs-reset-{tmp_path.name}", tmp_path / "table"
    kafka.create_topic(topic, partitions=2)
    kafka.produce_ids(topic, range(20))

    def batches_of(n: int) -> Callable[[Any], Any]:
        return lambda s: json_topic(s, kafka.bootstrap, topic, SCHEMA, max_offsets_per_trigger=n)

    run_file_sink(spark, batches_of(10), tmp_path / "cp", table, "json")  # batches 0-1, ten ids each
    assert SparkSinkLog(LocalStorage(table)).latest_batch_id() == 1
    kafka.produce_ids(topic, range(20, 40))
    shutil.rmtree(tmp_path / "cp")
    # The reset query reads twenty a batch from the earliest offsets: its batches 0-1 hold ids 0-39,
    # and the sink skips both as committed.
    run_file_sink(spark, batches_of(20), tmp_path / "cp", table, "json")
    assert SparkSinkLog(LocalStorage(table)).latest_batch_id() == 1
    assert visible_ids(table) == Counter(range(20))
    read = Counter(int(r["id"]) for r in spark.read.schema(SCHEMA).json(str(table)).collect())
    assert read == Counter(range(20))  # ids 20-39 are in the topic, in no file a reader reads
