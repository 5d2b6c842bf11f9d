"""The test broker itself (``harness.kafka``) and Spark's Kafka source reading it: what the Kafka
tests of the connector stand on."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession

from harness.kafka import KafkaBroker

pytestmark = pytest.mark.spark


def test_records_produced_are_at_the_end_offsets_spark_reads(
    kafka: KafkaBroker, spark: SparkSession, record_property: Callable[[str, object], None]
) -> None:
    record_property("kafka_start_s", kafka.last_start_s)
    record_property("kafka_format_s", kafka.format_s)
    kafka.create_topic("broker-basics", partitions=2)
    assert kafka.end_offsets("broker-basics") == {0: 0, 1: 0}
    kafka.produce("broker-basics", [(i % 2, json.dumps({"id": i})) for i in range(7)])
    assert kafka.end_offsets("broker-basics") == {0: 4, 1: 3}

    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("subscribe", "broker-basics")
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .collect()
    )
    got = sorted((r["partition"], r["offset"], json.loads(r["value"])["id"]) for r in rows)
    assert got == sorted((i % 2, i // 2, i) for i in range(7))

    # A grown topic: the new partition starts empty, the old ones keep their records.
    kafka.add_partitions("broker-basics", 3)
    assert kafka.end_offsets("broker-basics") == {0: 4, 1: 3, 2: 0}
    kafka.produce("broker-basics", [(2, "late")])
    assert kafka.end_offsets("broker-basics") == {0: 4, 1: 3, 2: 1}
