"""The backlog-aware runner on a source that grows, with real PySpark and a real coordinator on
ZooKeeper + SeaweedFS: a partition that appears while the query runs with its steady trigger is
marked at its latest offset from Spark's own progress, the query goes back to the catch-up
trigger while that partition is behind, and steady again once it caught up; every record reaches
the sink once and the partitions marked before keep their boundaries and progress.

The source is the repository's growing Python Data Source (``harness.growing_source``): Kafka-shaped
offsets with admission control and latest offsets in each progress, which is what the runner
reads from Kafka too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from harness import growing_source
from harness.batch_sink import Sink
from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector import BacklogAwareRunner, Switch

CATCH_UP: dict[str, Any] = {"availableNow": True}
STEADY: dict[str, Any] = {"processingTime": "200 milliseconds"}
STREAM = "grow"
TOPIC = "t"


@pytest.fixture(scope="module")
def client(zk_coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(zk_coordinator.target, timeout_s=10) as c:
        yield c


def ids(partition: int, files: int) -> list[list[int]]:
    """File i of ``partition`` holds ids partition*1000 + i*10 + 0..2."""
    return [[partition * 1000 + i * 10 + k for k in range(3)] for i in range(files)]


def test_a_partition_added_while_steady_is_marked_and_caught_up_with_the_catch_up_trigger(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path
) -> None:
    growing_source.register(spark)
    job = f"grow-{uuid.uuid4().hex[:8]}"
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    source.mkdir()
    for p in range(2):  # the backlog: 2 files in each of 2 partitions, one file a batch
        growing_source.publish_partition(str(source), p, ids(p, 2))
    sink = Sink()

    def start_query(trigger: Mapping[str, Any]) -> StreamingQuery:
        return (
            spark.readStream.format(growing_source.NAME)
            .option("path", str(source))
            .option("topic", TOPIC)
            .option("maxFilesPerTrigger", 1)
            .load()
            .writeStream.queryName("growing")
            .option("checkpointLocation", str(checkpoint))
            .foreachBatch(sink)
            .trigger(**trigger)
            .start()
        )

    # No latest_offsets callable: the latest offsets come from Spark's progress (as from Kafka's).
    runner = BacklogAwareRunner(
        start_query,
        job,
        client,
        CATCH_UP,
        STEADY,
        stream_names=[STREAM],
        checkpoint_location=str(checkpoint),
        poll_interval_s=0.1,
    )
    stream = f"{STREAM}:{TOPIC}"
    try:
        runner.start()
        runner.await_steady(timeout_s=120)
        status = client.get_backlog_status(job)
        marked = [(p.partition, p.boundary, p.finished) for p in status.partitions]
        assert marked == [(0, 2, True), (1, 2, True)]

        # The topic gains partition 2 with 3 files; the steady query reads one file a batch, so
        # it is behind its latest offset (3) when the runner first sees it.
        growing_source.publish_partition(str(source), 2, ids(2, 3))
        runner.await_phase("catch_up", timeout_s=120)
        assert runner.tracker is not None and runner.tracker.added == [Offset(stream, 2, 3)]
        assert runner.tracker.resets == 0  # a grow, not a reset: the others keep their progress
        runner.await_steady(timeout_s=120)

        assert [(s.from_phase, s.to_phase) for s in runner.switches] == [
            ("catch_up", "steady"),
            ("steady", "catch_up"),
            ("catch_up", "steady"),
        ]
        assert all(isinstance(s, Switch) for s in runner.switches)
        assert runner.triggers == [CATCH_UP, STEADY, CATCH_UP, STEADY]
        status = client.get_backlog_status(job)
        assert not status.processing_backlog and status.unmarked_partitions == 0
        assert [(p.stream, p.partition, p.boundary, p.position, p.finished) for p in status.partitions] == [
            (stream, 0, 2, 2, True),
            (stream, 1, 2, 2, True),
            (stream, 2, 3, 3, True),
        ]
        expected = sorted(i for p in range(3) for f in ids(p, 3 if p == 2 else 2) for i in f)
        assert sink.ids() == expected
        assert runner.query is not None and runner.query.exception() is None
    finally:
        runner.stop()
