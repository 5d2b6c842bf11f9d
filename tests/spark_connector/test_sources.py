"""Offsets of Spark sources: real offset JSON from each source, per-source stream names, the hook
for custom sources. The file, rate and rate-micro-batch JSON below was captured from PySpark 4.x
(events re-indented by PySpark; offsets log lines compact); ``test_offsets_from_a_real_query``
checks it against a live query. Kafka's comes from Spark's docs (the Kafka jars cannot be fetched
here): the progress example of the Structured Streaming guide and the startingOffsets example of
the Kafka integration guide."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from snapcoord.client import Offset
from snapcoord.spark_connector.sources import (
    UnknownOffsetFormat,
    default_stream_name,
    offsets_of_sources,
    parse_offsets_log,
    register_parser,
    unregister_parser,
)

#: "Reading Metrics Interactively" in Spark's Structured Streaming programming guide.
KAFKA_EVENT = json.dumps({"topic-0": {"2": 0, "4": 115, "1": 134, "3": 21, "0": 534}}, indent=2)
KAFKA_LOG = '{"topic-0":{"2":0,"4":115,"1":134,"3":21,"0":534}}'
FILE_EVENT, FILE_LOG = '{"logOffset": 2}', '{"logOffset":2}'
RATE = "5"
RATE_MB_EVENT, RATE_MB_LOG = '{"offset": 49, "timestamp": 7000}', '{"offset":49,"timestamp":7000}'
#: An offsets log file of a file source query, as Spark 4 writes it (conf shortened).
OFFSETS_LOG = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795475362262,"conf":{"a":"b"}}\n{"logOffset":2}'


def test_kafka_offsets_name_one_stream_per_source_and_topic() -> None:
    expected = tuple(Offset("q.0:topic-0", p, o) for p, o in [(0, 534), (1, 134), (2, 0), (3, 21), (4, 115)])
    assert offsets_of_sources("q", [KAFKA_EVENT]) == expected
    assert offsets_of_sources("q", [KAFKA_LOG]) == expected
    # Two sources on the same topic (a self-join) never collide.
    both = offsets_of_sources("q", [KAFKA_LOG, KAFKA_LOG])
    assert len(both) == 10 and {o.stream for o in both} == {"q.0:topic-0", "q.1:topic-0"}
    aliased = offsets_of_sources("q", [KAFKA_LOG, KAFKA_LOG], stream_names=["left", None])
    assert {o.stream for o in aliased} == {"left:topic-0", "q.1:topic-0"}


def test_kafka_starting_offsets_are_not_positions() -> None:
    # startingOffsets JSON (Kafka integration guide): -2 means "earliest", not a position.
    with pytest.raises(UnknownOffsetFormat, match="topic1/1"):
        offsets_of_sources("q", ['{"topic1":{"0":23,"1":-2},"topic2":{"0":-2}}'])


@pytest.mark.parametrize(
    ("event", "log", "offset"),
    [(FILE_EVENT, FILE_LOG, 2), (RATE, RATE, 5), (RATE_MB_EVENT, RATE_MB_LOG, 49)],
    ids=["file", "rate", "rate-micro-batch"],
)
def test_single_stream_sources(event: str, log: str, offset: int) -> None:
    assert offsets_of_sources("my query", [event]) == (Offset("my_query.0", 0, offset),)
    assert offsets_of_sources("my query", [log]) == (Offset("my_query.0", 0, offset),)
    assert offsets_of_sources("q", [None, log], stream_names=[None, "in"]) == (Offset("in", 0, offset),)


@pytest.mark.parametrize("none", [None, "null", "-", ""])
def test_a_source_without_offsets_gives_none(none: str | None) -> None:
    assert offsets_of_sources("q", [none, FILE_LOG]) == (Offset("q.1", 0, 2),)


@pytest.mark.parametrize("bad", ['{"x": 1}', '"text"', "[1, 2]", "{nope", '{"t": {"p": 1}}', "true"])
def test_unknown_formats_raise_naming_the_source(bad: str) -> None:
    with pytest.raises(UnknownOffsetFormat, match=r"q\.1"):
        offsets_of_sources("q", [FILE_LOG, bad])


def test_repeated_aliases_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct stream_names"):
        offsets_of_sources("q", [FILE_LOG, RATE], stream_names=["in", "in"])


def test_custom_source_parsers() -> None:
    custom = '{"shards": [{"id": 3, "seq": 70}, {"id": 1, "seq": 9}]}'

    def shards(stream: str, value: Any) -> list[Offset] | None:
        if not isinstance(value, dict) or "shards" not in value:
            return None
        return [Offset(stream, s["id"], s["seq"]) for s in value["shards"]]

    with pytest.raises(UnknownOffsetFormat, match="register_parser"):
        offsets_of_sources("q", [custom])
    # For one source...
    assert offsets_of_sources("q", [FILE_LOG, custom], parsers={1: shards}) == (
        Offset("q.0", 0, 2),
        Offset("q.1", 1, 9),
        Offset("q.1", 3, 70),
    )
    # ...or registered for every query; built-in formats still parse.
    register_parser(shards)
    try:
        assert offsets_of_sources("q", [custom, RATE]) == (
            Offset("q.0", 1, 9),
            Offset("q.0", 3, 70),
            Offset("q.1", 0, 5),
        )
    finally:
        unregister_parser(shards)
    with pytest.raises(UnknownOffsetFormat):
        offsets_of_sources("q", [custom])


def test_offsets_log_file() -> None:
    entry = parse_offsets_log(OFFSETS_LOG)
    assert (entry.batch_timestamp_ms, entry.batch_watermark_ms, entry.sources) == (
        1795475362262,
        0,
        ('{"logOffset":2}',),
    )
    assert parse_offsets_log('v1\n{"batchTimestampMs":5}\n-\n7').sources == (None, "7")
    with pytest.raises(ValueError, match="not a Spark offsets log"):
        parse_offsets_log('{"logOffset":2}')


def test_default_stream_names_use_accepted_characters() -> None:
    assert default_stream_name("orders/eu (v2)", 3) == "orders_eu__v2_.3"


@pytest.mark.spark
def test_offsets_from_a_real_query(spark: SparkSession, tmp_path: Path) -> None:
    """File, rate and rate-micro-batch in one query: its progress and its offsets log parse to the
    same offsets, one stream per source."""
    source = tmp_path / "in"
    source.mkdir()
    for i in range(2):
        (source / f"f{i}.json").write_text(json.dumps({"id": i}) + "\n")
    files = spark.readStream.schema("id LONG").json(str(source)).selectExpr("id AS value")
    rate = spark.readStream.format("rate").option("rowsPerSecond", 10).load().select("value")
    rate_mb = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 7).load().select("value")
    checkpoint = tmp_path / "cp"
    query = (
        files.union(rate)
        .union(rate_mb)
        .writeStream.format("noop")
        .queryName("mixed")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while not [p for p in query.recentProgress if p.batchId >= 2]:
            assert time.monotonic() < deadline, "no third batch within 120 s"
            assert query.exception() is None
            time.sleep(0.2)
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if p.numInputRows >= 0][-1]
    from_event = offsets_of_sources("mixed", [s.endOffset for s in progress.sources])
    assert [o.stream for o in from_event] == ["mixed.0", "mixed.1", "mixed.2"]
    assert from_event[0] == Offset("mixed.0", 0, 0)  # both files went in batch 0 (file log 0)
    assert from_event[2].offset == 7 * (progress.batchId + 1)  # 7 rows per rate-micro-batch batch
    log = checkpoint / "offsets" / str(progress.batchId)
    assert offsets_of_sources("mixed", parse_offsets_log(log.read_text()).sources) == from_event
