"""The backlog-aware runner, on a real coordinator (ZooKeeper + SeaweedFS) and real PySpark: catch-up
trigger until the coordinator says the backlog is done, steady trigger after it, and back to
catch-up when the query falls behind by more than the bound or restarts after downtime; an
unfinished boundary survives a driver restart; a final report lost to an outage is delivered. The
same over a Kafka topic, where the boundaries are the broker's end offsets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from harness.batch_sink import Sink
from harness.coordinator import CoordinatorProcess
from harness.faults import TcpProxy
from harness.kafka import KafkaBroker, json_topic
from harness.locations import TestDir
from harness.process import wait_until
from harness.spark_connect import start_with_retries
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.backlog.runner import BacklogAwareRunner, last_batch_time_ms
from snapcoord.spark_connector.backlog.tracker import BacklogBound
from snapcoord.spark_connector.storage import LocalStorage

pytestmark = pytest.mark.spark

CATCH_UP: dict[str, Any] = {"availableNow": True}
STEADY: dict[str, Any] = {"processingTime": "200 milliseconds"}
STREAM = "events-files"
APPS = Path(__file__).parent / "apps"
SFTP_NO_CACHE = "fs.sftp.impl.disable.cache"


@pytest.fixture(scope="module")
def client(zk_coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(zk_coordinator.target, timeout_s=10) as c:
        yield c


def write_file(directory: Path, index: int) -> None:
    """File ``index`` holds ids index*10 .. index*10+2; published atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}-{index}.tmp"
    staging.write_text("".join(json.dumps({"id": index * 10 + k}) + "\n" for k in range(3)))
    os.replace(staging, directory / f"f{index:03d}.json")


def ids_of(files: range) -> list[int]:
    return sorted(i * 10 + k for i in files for k in range(3))


class QueryStarter:
    """``start_query`` for the runner: one file per batch (or ``read(spark)``), same checkpoint every
    time; records what the sink had seen when each trigger was started."""

    def __init__(
        self,
        spark: SparkSession,
        source: Path,
        checkpoint: Path | str,
        sink: Sink,
        read: Callable[[SparkSession], DataFrame] | None = None,
    ) -> None:
        self.spark, self.source, self.checkpoint, self.sink = spark, source, checkpoint, sink
        self.read = read
        self.seen_at_start: list[tuple[dict[str, Any], list[int]]] = []

    def __call__(self, trigger: Mapping[str, Any]) -> StreamingQuery:
        self.seen_at_start.append((dict(trigger), self.sink.ids()))
        if self.read is not None:
            df = self.read(self.spark)
        else:
            df = self.spark.readStream.schema("id INT").option("maxFilesPerTrigger", 1).json(str(self.source))
        return (
            df.writeStream.queryName("events")
            .option("checkpointLocation", str(self.checkpoint))
            .foreachBatch(self.sink)
            .trigger(**trigger)
            .start()
        )


def files_latest(directory: Path) -> list[Offset]:
    """The file source's latest offset with one file per batch: its log offset after reading every
    file of ``directory`` is the file count - 1 (a stand-in for Kafka's latest offsets)."""
    count = len(list(directory.glob("f*.json")))
    return [Offset(STREAM, 0, count - 1)] if count else []


def runner_for(
    starter: QueryStarter,
    client: CoordinatorClient,
    job: str,
    bound: BacklogBound | None = None,
    call_timeout_s: float = 2.0,
) -> BacklogAwareRunner:
    return BacklogAwareRunner(
        starter,
        job,
        client,
        CATCH_UP,
        STEADY,
        bound=bound,
        # A Kafka source reports the broker's latest offsets itself; files need the stand-in.
        latest_offsets=None if starter.read is not None else (lambda: files_latest(starter.source)),
        stream_names=[STREAM],
        checkpoint_location=str(starter.checkpoint),
        poll_interval_s=0.1,
        call_timeout_s=call_timeout_s,
    )


def test_switches_once_after_the_backlog(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path
) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    for i in range(4):  # the backlog: 4 files, one per batch -> file-source log offsets 0..3
        write_file(source, i)
    sink = Sink()
    starter = QueryStarter(spark, source, checkpoint, sink)
    runner = runner_for(starter, client, job)
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
        assert runner.poll() is False  # one file behind is within any bound: no switch
        assert runner.switch_count == 1
        runner.stop()

        # A later start of the same job (caught up, no downtime bound) goes straight to steady.
        again = runner_for(starter, client, job)
        again.start()
        assert again.phase == "steady" and again.switch_count == 0
        assert starter.seen_at_start[-1][0] == STEADY
        again.stop()
    finally:
        runner.stop()


def test_last_batch_time_is_the_newest_offsets_entrys(tmp_path: Path) -> None:
    checkpoint = LocalStorage(tmp_path / "cp")
    assert last_batch_time_ms(checkpoint) is None  # never ran
    for batch, ms in [(0, 1000), (1, 2000), (2, 3000)]:
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": ms, "conf": {}}
        checkpoint.write_bytes(f"offsets/{batch}", f"v1\n{json.dumps(meta)}\n{{}}\n".encode())
    checkpoint.write_bytes("offsets/.2.crc", b"crc")
    assert last_batch_time_ms(checkpoint) == 3000


def test_switches_both_ways_on_lag_and_after_downtime(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path, remote: TestDir
) -> None:
    """Catch-up, steady; a burst puts the query more than the bound behind: catch-up (the mark
    reset to the new latest offset), steady; stopped, down for longer than the downtime bound while
    data arrives, restarted: catch-up again, steady. Every record reaches the sink exactly once.
    The checkpoint is on sftp: the runner reads the time of its last batch there."""
    job = f"both-{uuid.uuid4().hex[:8]}"
    source, checkpoint = tmp_path / "in", remote.uri_of("cp")
    for i in range(3):
        write_file(source, i)
    sink = Sink()
    starter = QueryStarter(spark, source, checkpoint, sink)
    bound = BacklogBound(max_lag=2, max_downtime_s=1.0)
    # Each switch stops the query, which can interrupt Hadoop's sftp mid-call; its pool hands that
    # channel out again and the next run's calls on it fail. Each run gets FileSystems (and pools)
    # of its own, as docs/spark-storage.md advises for sftp checkpoints of queries that get stopped.
    spark.conf.set(SFTP_NO_CACHE, "true")
    runner = runner_for(starter, client, job, bound)
    try:
        runner.start()
        runner.await_steady(timeout_s=90)
        assert [s.to_phase for s in runner.switches] == ["steady"]

        # A burst: 5 files at once, read one per batch by the steady query -> 4 behind after its
        # first batch, more than max_lag=2: backlog again, with the burst's end as the boundary.
        for i in range(3, 8):
            write_file(source, i)
        runner.await_phase("catch_up", timeout_s=90)
        assert runner.tracker is not None and runner.tracker.resets == 1
        assert [p.boundary for p in client.get_backlog_status(job).partitions] == [7]
        runner.await_steady(timeout_s=90)
        assert [s.to_phase for s in runner.switches] == ["steady", "catch_up", "steady"]
        assert not client.get_backlog_status(job).processing_backlog
        assert sink.ids() == ids_of(range(8))
        runner.stop()

        # Downtime: data arrives while the query is stopped for longer than max_downtime_s (a
        # condition on the checkpoint's last batch time, not a sleep of a guessed length).
        for i in range(8, 11):
            write_file(source, i)
        last = last_batch_time_ms(remote.storage.child("cp"))
        assert last is not None
        wait_until(lambda: time.time() * 1000 - last > 1500, timeout=30, what="the downtime bound to pass")
        restarted = runner_for(starter, client, job, bound)
        restarted.start()
        assert restarted.phase == "catch_up"  # although the job had caught up before the stop
        restarted.await_steady(timeout_s=90)
        assert [s.to_phase for s in restarted.switches] == ["steady"]
        assert restarted.tracker is not None and restarted.tracker.resets == 1
        status = client.get_backlog_status(job)
        assert [(p.boundary, p.finished) for p in status.partitions] == [(10, True)]
        assert sink.ids() == ids_of(range(11))
        assert [t for t, _ in starter.seen_at_start] == [CATCH_UP, STEADY, CATCH_UP, STEADY, CATCH_UP, STEADY]
        restarted.stop()
    finally:
        runner.stop()
        spark.conf.unset(SFTP_NO_CACHE)


def test_kafka_boundaries_are_the_brokers_end_offsets_switch_both_ways_and_grow(
    spark: SparkSession, client: CoordinatorClient, tmp_path: Path, kafka: KafkaBroker
) -> None:
    """A topic of two partitions read ten records a batch, with no ``latest_offsets``: the runner's
    tracker marks from the Kafka source's latest offsets, which Spark asks of the broker. Catch-up
    through the backlog, steady; a burst more than the bound behind: catch-up, steady; stopped while
    records arrive, restarted after the downtime bound: catch-up, steady; a partition added while it
    runs is read, marked and reported. Each record once."""
    job = f"kafka-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(job, partitions=2)
    kafka.produce_ids(job, range(40))  # 20 a partition: four batches of backlog
    stream = f"{STREAM}:{job}"
    sink, checkpoint = Sink(), tmp_path / "cp"
    starter = QueryStarter(
        spark,
        tmp_path / "unused",
        checkpoint,
        sink,
        read=lambda s: json_topic(s, kafka.bootstrap, job, "id INT", max_offsets_per_trigger=10),
    )
    bound = BacklogBound(max_lag=5, max_downtime_s=1.0)

    def boundaries() -> list[tuple[str, int, int, bool]]:
        status = client.get_backlog_status(job)
        return [(p.stream, p.partition, p.boundary, p.finished) for p in status.partitions]

    first = runner_for(starter, client, job, bound)
    again: BacklogAwareRunner | None = None
    try:
        first.start()
        first.await_steady(timeout_s=120)
        # The first batch ended at 5 a partition; the boundary is the broker's end, 20 a partition.
        assert kafka.end_offsets(job) == {0: 20, 1: 20}
        assert boundaries() == [(stream, 0, 20, True), (stream, 1, 20, True)]
        assert starter.seen_at_start[1] == (STEADY, list(range(40)))

        # A burst of 20 a partition: the steady query's first batch over it leaves it 30 behind.
        kafka.produce_ids(job, range(40, 80))
        first.await_phase("catch_up", timeout_s=120)
        assert first.tracker is not None and first.tracker.resets == 1
        first.await_steady(timeout_s=120)
        marked = boundaries()
        # The new boundary is where the broker's end was when the lag was seen: past the batch
        # that saw it, at most the burst's end.
        assert [(s, p, f) for s, p, _, f in marked] == [(stream, 0, True), (stream, 1, True)]
        assert all(25 < b <= 40 for _, _, b, _ in marked), marked
        assert sink.ids() == list(range(80))
        first.stop()

        # Down for longer than max_downtime_s while records arrive: the restart starts in catch-up
        # with the broker's end offsets as the boundary.
        kafka.produce_ids(job, range(80, 100))
        last = last_batch_time_ms(LocalStorage(checkpoint))
        assert last is not None
        wait_until(lambda: time.time() * 1000 - last > 1500, timeout=30, what="the downtime bound to pass")
        again = runner_for(starter, client, job, bound)
        again.start()
        assert again.phase == "catch_up"
        again.await_steady(timeout_s=120)
        assert boundaries() == [(stream, 0, 50, True), (stream, 1, 50, True)]
        assert sink.ids() == list(range(100))
        assert [t for t, _ in starter.seen_at_start] == [CATCH_UP, STEADY, CATCH_UP, STEADY, CATCH_UP, STEADY]

        # The topic grows by a partition while the query runs: Spark's source reads it from its
        # earliest offset, the tracker adds it to the mark at the broker's end offset for it as of
        # the batch that showed it first, the reports bring it to that boundary; nothing is lost.
        kafka.add_partitions(job, 3)
        kafka.produce(job, [(2, json.dumps({"id": n})) for n in range(100, 130)])
        tracker = again.tracker
        assert tracker is not None

        def read_and_reported() -> bool:
            again.poll()  # the runner feeds its tracker when polled
            marked = boundaries()
            return sink.ids() == list(range(130)) and len(marked) == 3 and marked[2][3]

        try:
            wait_until(read_and_reported, timeout=180, what="the new partition to be read and reported")
        except TimeoutError as e:
            state = f"{boundaries()} added={tracker.added} phase={again.phase} errors={tracker.errors}"
            raise AssertionError(f"{state} last={tracker.last_batch}") from e
        again.await_steady(timeout_s=120)
        # The partition reached the mark by a grow (``tracker.added``) or inside a reset: a switch to
        # catch-up that the new records' lag set off marks every partition at the broker's end.
        assert [(o.stream, o.partition) for o in tracker.added] in ([], [(stream, 2)]), tracker.added
        # Either way its boundary is the broker's end for it when a batch showed it: 0 if that was
        # before the records above reached it (the partition exists before they do), at most 30; a
        # grow's, or 30 where the grow left it more than max_lag behind and the tracker marked again.
        marked = boundaries()
        assert marked[:2] == [(stream, 0, 50, True), (stream, 1, 50, True)]
        allowed = {30, *(o.offset for o in tracker.added)} if tracker.added else set(range(31))
        assert all(0 <= o.offset <= 30 for o in tracker.added), tracker.added
        assert marked[2][:2] == (stream, 2) and marked[2][2] in allowed and marked[2][3], marked
        assert kafka.end_offsets(job) == {0: 50, 1: 50, 2: 30}
    finally:
        for runner in (again, first):
            if runner is not None:
                runner.stop()


def test_a_final_report_lost_to_an_outage_is_delivered(
    spark: SparkSession, zk_coordinator: CoordinatorProcess, client: CoordinatorClient, tmp_path: Path
) -> None:
    """The coordinator is unreachable while an AvailableNow catch-up runs to its end: no progress
    event will come again, yet the runner delivers the mark and the last report (same report id)
    once the path is back, and only then goes steady."""
    job = f"lost-{uuid.uuid4().hex[:8]}"
    source, checkpoint = tmp_path / "in", tmp_path / "cp"
    for i in range(3):
        write_file(source, i)
    sink = Sink()
    starter = QueryStarter(spark, source, checkpoint, sink)
    assert zk_coordinator.grpc_port is not None
    with (
        TcpProxy("127.0.0.1", zk_coordinator.grpc_port) as proxy,
        CoordinatorClient(proxy.address, timeout_s=10) as through_proxy,
    ):
        runner = runner_for(starter, through_proxy, job, call_timeout_s=0.5)
        try:
            proxy.cut()
            query = runner.start()
            query.awaitTermination(120)  # the whole backlog, while nothing reaches the coordinator
            assert not query.isActive and sink.ids() == ids_of(range(3))
            assert runner.poll() is False and runner.phase == "catch_up"
            assert runner.tracker is not None and runner.tracker.pending and runner.tracker.errors > 0
            proxy.restore()
            runner.await_steady(timeout_s=60)
            assert not runner.tracker.pending
            status = client.get_backlog_status(job)
            assert [(p.boundary, p.position, p.finished) for p in status.partitions] == [(2, 2, True)]
            # The last report went with its batch's id: sent again, it answers what it finished.
            last = runner.tracker.last_batch
            assert last is not None and last.report_id.endswith(".2")
            again = client.report_progress(job, last.end, report_id=last.report_id)
            assert again.newly_finished == (Offset(STREAM, 0, 2),)
        finally:
            runner.stop()


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
    sink = Sink()
    starter = QueryStarter(spark, source, checkpoint, sink)
    runner = runner_for(starter, client, job)
    try:
        runner.start()
        steady = runner.await_steady(timeout_s=90)
        # ...but MarkBacklog kept driver 1's boundary: the first mark wins.
        assert runner.tracker is not None and runner.tracker.mark is not None
        assert [(p.stream, p.boundary) for p in runner.tracker.mark.partitions] == [(STREAM, 3)]
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


def test_switches_both_ways_under_spark_connect(
    spark_connect: Any, client: CoordinatorClient, tmp_path: Path
) -> None:
    """Under Spark Connect the runner drives the server's query from this client process, reading
    its progress with ``recentProgress`` (no listener): catch-up, steady, a burst past the lag
    bound, catch-up, steady. Spark's file sink (exactly once by its own log) holds every record once."""
    job = f"connect-{uuid.uuid4().hex[:8]}"
    source, checkpoint, out = tmp_path / "in", tmp_path / "cp", tmp_path / "out"
    for i in range(3):
        write_file(source, i)

    def start(trigger: Mapping[str, Any]) -> Any:  # a Connect StreamingQuery
        return start_with_retries(
            lambda: (
                spark_connect.readStream.schema("id INT")
                .option("maxFilesPerTrigger", 1)
                .json(str(source))
                .writeStream.queryName("events-connect")
                .format("json")
                .option("path", str(out))
                .option("checkpointLocation", str(checkpoint))
                .trigger(**trigger)
                .start()
            )
        )

    runner = BacklogAwareRunner(
        start,
        job,
        client,
        CATCH_UP,
        STEADY,
        bound=BacklogBound(max_lag=2),
        latest_offsets=lambda: files_latest(source),
        stream_names=[STREAM],
        checkpoint_location=str(checkpoint),
        poll_interval_s=0.1,
    )
    try:
        runner.start()
        runner.await_steady(timeout_s=120)
        for i in range(3, 8):
            write_file(source, i)
        runner.await_phase("catch_up", timeout_s=120)
        runner.await_steady(timeout_s=120)
        assert [s.to_phase for s in runner.switches] == ["steady", "catch_up", "steady"]
        assert runner.triggers == [CATCH_UP, STEADY, CATCH_UP, STEADY]
        status = client.get_backlog_status(job)
        assert [(p.boundary, p.finished) for p in status.partitions] == [(7, True)]
        assert runner.tracker is not None and runner.tracker.errors == 0
    finally:
        runner.stop()
    written = spark_connect.read.schema("id INT").json(str(out)).collect()
    assert sorted(int(r["id"]) for r in written) == ids_of(range(8))
