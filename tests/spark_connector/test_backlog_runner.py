"""The backlog-aware runner: catch-up trigger until the coordinator says the backlog is done, then one
switch to the steady trigger on the same checkpoint; the boundary survives a driver restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from harness.coordinator import embedded_deps, serve_in_process
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.backlog_runner import BacklogAwareRunner
from snapcoord.spark_connector.listener import SnapcoordListener

pytestmark = pytest.mark.spark

CATCH_UP: dict[str, Any] = {"availableNow": True}
STEADY: dict[str, Any] = {"processingTime": "200 milliseconds"}
STREAM = "events-files"
APPS = Path(__file__).parent / "apps"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorClient]:
    with (
        embedded_deps(tmp_path_factory.mktemp("coordinator")) as deps,
        serve_in_process(deps) as server,
        CoordinatorClient(server.target, timeout_s=10) as c,
    ):
        yield c


def write_file(directory: Path, index: int) -> None:
    """File ``index`` holds ids index*10 .. index*10+2; published atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}-{index}.tmp"
    staging.write_text("".join(json.dumps({"id": index * 10 + k}) + "\n" for k in range(3)))
    os.replace(staging, directory / f"f{index:03d}.json")


def ids_of(files: range) -> list[int]:
    return sorted(i * 10 + k for i in files for k in range(3))


class Sink:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: list[int] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [int(r["id"]) for r in df.collect()]
        with self._lock:
            self._ids.extend(rows)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._ids)


class QueryStarter:
    """``start_query`` for the runner: one file per batch, same checkpoint every time; records what
    the sink had seen when each trigger was started."""

    def __init__(self, spark: SparkSession, source: Path, checkpoint: Path, sink: Sink) -> None:
        self.spark, self.source, self.checkpoint, self.sink = spark, source, checkpoint, sink
        self.seen_at_start: list[tuple[dict[str, Any], list[int]]] = []

    def __call__(self, trigger: Mapping[str, Any]) -> StreamingQuery:
        self.seen_at_start.append((dict(trigger), self.sink.ids()))
        return (
            self.spark.readStream.schema("id INT")
            .option("maxFilesPerTrigger", 1)
            .json(str(self.source))
            .writeStream.queryName("events")
            .option("checkpointLocation", str(self.checkpoint))
            .foreachBatch(self.sink)
            .trigger(**trigger)
            .start()
        )


def backlog_listener(
    client: CoordinatorClient, checkpoint: Path, job_id: str, boundary: int
) -> SnapcoordListener:
    return SnapcoordListener(
        client,
        "backlog-app",
        {"events": str(checkpoint)},
        backlog_jobs={"events": job_id},
        backlog_boundaries={"events": [Offset(STREAM, 0, boundary)]},
        stream_names={"events": [STREAM]},
    )


def test_switches_once_after_the_backlog(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    for i in range(4):  # the backlog: 4 files, one per batch -> file-source log offsets 0..3
        write_file(source, i)
    listener = backlog_listener(client, checkpoint, job, boundary=3)
    spark.streams.addListener(listener)
    sink = Sink()
    starter = QueryStarter(spark, source, checkpoint, sink)
    runner = BacklogAwareRunner(starter, job, client, CATCH_UP, STEADY, poll_interval_s=0.1)
    try:
        catch_up = runner.start()
        steady = runner.await_steady(timeout_s=90)

        assert runner.switch_count == 1
        assert [t for t, _ in starter.seen_at_start] == [CATCH_UP, STEADY]
        # The switch came after the whole backlog went through the sink, and not before.
        assert starter.seen_at_start[1][1] == ids_of(range(4))
        status = client.get_backlog_status(job)
        assert not status.processing_backlog
        assert [(p.stream, p.partition, p.boundary, p.finished) for p in status.partitions] == [
            (STREAM, 0, 3, True)
        ]
        assert steady.id == catch_up.id  # same checkpoint
        assert steady.isActive

        write_file(source, 4)  # new data after the switch: read by the steady query, once
        steady.processAllAvailable()
        assert sink.ids() == ids_of(range(5))
        assert steady.exception() is None
        assert runner.poll() is False
        assert runner.switch_count == 1
        runner.stop()

        # A later start of the same job (the backlog is done) goes straight to the steady trigger.
        again = BacklogAwareRunner(starter, job, client, CATCH_UP, STEADY)
        again.start()
        assert again.phase == "steady" and again.switch_count == 0
        assert starter.seen_at_start[-1][0] == STEADY
        again.stop()
    finally:
        runner.stop()
        spark.streams.removeListener(listener)


def test_restarted_driver_keeps_the_original_boundary(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path
) -> None:
    job = f"restart-{uuid.uuid4().hex[:8]}"
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    for i in range(4):
        write_file(source, i)
    # Driver 1 (its own process and JVM) marks boundary 3, commits batch 0 and dies mid-backlog.
    driver = subprocess.Popen(
        [
            sys.executable,
            str(APPS / "backlog_driver.py"),
            client.target,
            str(source),
            str(checkpoint),
            job,
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    try:
        out, err = driver.communicate(timeout=150)
    finally:
        # Its JVM runs in the same (new) session: end that group, which only our child leads.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 17, f"driver 1 exited with {driver.returncode}\n{out}\n{err[-3000:]}"
    reply = json.loads(out.strip().splitlines()[-1])
    assert reply["boundaries"] == [[STREAM, 0, 3]]
    driver1_ids: list[int] = reply["batch0_ids"]
    assert len(driver1_ids) == 3  # one file: batch 0 of a one-file-per-batch backlog
    before = client.get_backlog_status(job)
    assert before.processing_backlog
    assert [(p.boundary, p.position) for p in before.partitions] == [(3, 0)]

    # More data arrived meanwhile; driver 2 would now see a larger backlog (boundary 5)...
    for i in range(4, 6):
        write_file(source, i)
    listener = backlog_listener(client, checkpoint, job, boundary=5)
    spark.streams.addListener(listener)
    sink = Sink()
    starter = QueryStarter(spark, source, checkpoint, sink)
    runner = BacklogAwareRunner(starter, job, client, CATCH_UP, STEADY, poll_interval_s=0.1)
    try:
        runner.start()
        steady = runner.await_steady(timeout_s=90)
        # ...but MarkBacklog kept driver 1's boundary: the first mark wins.
        mark = listener.backlog_mark(job)
        assert mark is not None
        assert [(p.stream, p.boundary) for p in mark.partitions] == [(STREAM, 3)]
        assert runner.switch_count == 1
        assert [t for t, _ in starter.seen_at_start] == [CATCH_UP, STEADY]
        status = client.get_backlog_status(job)
        assert not status.processing_backlog
        assert [(p.boundary, p.finished) for p in status.partitions] == [(3, True)]
        assert status.partitions[0].position >= 3
        # Driver 2 resumed right after driver 1's committed batch 0: every other file once (the
        # catch-up query may have been stopped at the boundary, before the newer files).
        steady.processAllAvailable()
        assert steady.exception() is None
        assert sorted(driver1_ids + sink.ids()) == ids_of(range(6))
    finally:
        runner.stop()
        spark.streams.removeListener(listener)
