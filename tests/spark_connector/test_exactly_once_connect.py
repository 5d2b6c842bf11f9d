"""``exactly_once`` under Spark Connect: the writer travels to a real local Connect server as pickled
configuration and runs in the server's Python worker against a real coordinator (ZooKeeper + S3).

One Connect server (``spark_connect_server``, session scope) serves every test here. The streaming
tests drive it from client processes (``jobs/exactly_once_connect_job.py``) that build their session
with ``SparkSession.builder.remote(url)``, as users do.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from harness.coordinator import CoordinatorProcess
from harness.process import wait_until
from harness.spark_connect import SparkConnectServer, start_with_retries
from snapcoord.client import CoordinatorClient, NotFound, Offset
from snapcoord.spark_connector import ExecutorContextError
from snapcoord.spark_connector.backlog.listener import SnapcoordListener
from snapcoord.spark_connector.backlog.runner import BacklogAwareRunner
from snapcoord.spark_connector.sink.attempts import decode
from snapcoord.spark_connector.sink.commit_log import Commit
from snapcoord.spark_connector.sink.epochs import Fenced
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink
from snapcoord.spark_connector.sink.writer import ExactlyOnceWriter, exactly_once

pytestmark = pytest.mark.spark

JOB = Path(__file__).parent / "jobs" / "exactly_once_connect_job.py"
RECORDS_PER_FILE = 10
JOB_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def coordinator(zk_coordinator: CoordinatorProcess) -> str:
    return zk_coordinator.target


class _ListSink:
    """A toy sink of the protocol (picklable): an append-only list, its length the one position."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def positions(self) -> list[Offset]:
        return [Offset("list", 0, len(self.rows))]

    def rollback_to(self, positions: Sequence[Offset]) -> None:
        del self.rows[positions[0].offset :]

    def write(self, df: list[str], batch_id: int) -> None:
        self.rows.extend(df)


def _sink_positions(client: CoordinatorClient, producer_id: str) -> tuple[Offset, ...]:
    """The sink positions of a batch record (without the attempt the wrapper stores with them)."""
    return decode(client.get_producer_offsets(producer_id).offsets).sink_positions


def _cloudpickle(obj: object) -> bytes:
    """What Spark Connect's ``foreachBatch`` does with the function (pyspark's vendored cloudpickle)."""
    data: bytes = cloudpickle.dumps(obj)  # type: ignore[no-untyped-call]
    return data


# -- pickling ----------------------------------------------------------------------------------------------


def test_writer_from_an_address_unpickles_into_a_working_writer(coordinator: str) -> None:
    name = f"pickled-{uuid.uuid4().hex[:8]}"
    writer = exactly_once(
        _ListSink(), coordinator, query_name=name, ttl_ms=600_000, checkpoint_location="/chk/x"
    )
    writer(["a"], 0)  # this process now holds a live client and a run: neither may travel
    assert writer.last_batch_id == 0 and writer.epoch is not None
    writer.rollbacks = writer.stale_records = 7  # counters of this process's run

    copy = pickle.loads(pickle.dumps(writer))
    assert isinstance(copy, ExactlyOnceWriter)
    # Configuration only: every per-process and per-run attribute is what a new writer has.
    fresh = exactly_once(_ListSink(), coordinator, query_name=name)
    assert copy.__dict__.keys() == fresh.__dict__.keys()
    for key in copy.__dict__.keys() - set(ExactlyOnceWriter._CONFIGURATION) - {"_lock"}:
        assert getattr(copy, key) == getattr(fresh, key), key
    assert copy._lock is not writer._lock
    assert (copy.query_name, copy.ttl_ms, copy.checkpoint_location) == (name, 600_000, "/chk/x")
    assert (copy.epoch, copy.last_batch_id, copy.rollbacks, copy.stale_records) == (None, None, 0, 0)
    sink = copy.sink
    assert isinstance(sink, _ListSink) and sink is not writer.sink and sink.rows == ["a"]

    # The copy is a restarted driver: an attempt of batch 0 wrote more than its output, and the copy
    # re-runs batch 0 with its own client, rolls the sink back to the stored position, and goes on.
    sink.rows.append("partial")
    copy(["a"], 0)
    assert sink.rows == ["a"] and copy.rollbacks == 1
    assert copy.epoch is not None and copy.epoch > writer.epoch  # the copy claimed its own run
    copy(["b"], 1)
    assert sink.rows == ["a", "b"]
    with CoordinatorClient(coordinator) as client:
        with pytest.raises(NotFound):
            client.get_producer_offsets(f"{name}.b0")
        assert _sink_positions(client, f"{name}.b1") == (Offset("list", 0, 1),)
    copy.close()
    writer.close()


def test_writer_from_a_factory_pickles_with_cloudpickle(coordinator: str) -> None:
    name = f"factory-{uuid.uuid4().hex[:8]}"
    writer = exactly_once(_ListSink(), lambda: CoordinatorClient(coordinator), query_name=name)
    copy = pickle.loads(_cloudpickle(writer))  # what Spark Connect's foreachBatch does
    copy(["a"], 0)
    assert isinstance(copy.client, CoordinatorClient)
    with CoordinatorClient(coordinator) as client:
        assert _sink_positions(client, f"{name}.b0") == (Offset("list", 0, 0),)
    copy.close()


def test_writer_from_a_live_client_refuses_pickling_and_says_what_to_pass(coordinator: str) -> None:
    with CoordinatorClient(coordinator) as client:
        writer = exactly_once(_ListSink(), client, query_name="live-client")
        for dumps in (pickle.dumps, _cloudpickle):
            with pytest.raises(ExecutorContextError) as info:
                dumps(writer)
            message = str(info.value)
            assert "live CoordinatorClient" in message
            assert "Spark Connect" in message
            assert "pass the coordinator's address" in message and "factory" in message


def test_pickled_file_sink_rescans_instead_of_trusting_a_cached_position(tmp_path: Path) -> None:
    sink = PartitionedFileSink(tmp_path / "t", partition_by=["bucket"])
    assert sink.positions() == [Offset("t", 0, 0), Offset("t", 1, 0)]  # cached from now on
    # Another process (an earlier query run) committed writes 0..4 since.
    other = PartitionedFileSink(tmp_path / "t", partition_by=["bucket"])
    for seq in range(5):
        other._create_entry(Commit(seq, 0, seq, ()), [])
    copy = pickle.loads(pickle.dumps(sink))
    # A stale 0 would later roll back to 0: data loss.
    assert copy.positions() == [Offset("t", 0, 5), Offset("t", 1, 0)]
    assert (copy.location, copy.partition_by, copy.name) == (sink.location, sink.partition_by, sink.name)


def test_pickled_file_sink_copy_cannot_act_as_the_senders_epoch(spark: Any, tmp_path: Path) -> None:
    """A copy of a fenced sink must not be the run that fenced it: with the sender's epoch, its
    rollback would delete that run's in-flight (renamed, not yet committed) files, and its writes
    would pass the fence. The copy starts at epoch 0, which a fenced table refuses."""
    table = tmp_path / "t"
    sink = PartitionedFileSink(table, partition_by=["bucket"])
    sink.fence(3)
    df = spark.createDataFrame([(i, f"b{i % 2}") for i in range(4)], "id long, bucket string")
    sink.write(df, 0)
    mark = sink.positions()
    assert mark == [Offset("t", 0, 2), Offset("t", 1, 3)]  # entry 0: the fence's empty batch
    copy = pickle.loads(_cloudpickle(sink))  # e.g. shipped with a foreachBatch function mid-run
    assert copy.epoch == 0

    # Epoch 3's next write is in flight: its part files written, its log entry not yet.
    in_flight = table / "bucket=b0" / f"_w-s2-e3-a{'b' * 12}-p0" / "part-00000-in-flight.json"
    in_flight.parent.mkdir()
    in_flight.write_text('{"id": 10}\n')
    on_disk = sorted(table.rglob("*"))
    with pytest.raises(Fenced):
        copy.rollback_to(mark)
    with pytest.raises(Fenced):
        copy.write(df, 1)
    assert in_flight.exists()  # a copy holding epoch 3 would have deleted it as uncommitted
    assert sorted(int(r["id"]) for r in copy.read_json_records()) == [0, 1, 2, 3]
    assert sorted(table.rglob("*")) == on_disk  # the copy deleted nothing

    # The sender, still epoch 3, commits nothing new and rolls back its own attempt as before.
    sink.rollback_to(mark)
    assert not in_flight.exists() and sorted(int(r["id"]) for r in sink.read_json_records()) == [0, 1, 2, 3]


def test_shipped_writer_still_refuses_to_run_inside_a_task(
    spark_connect: Any, coordinator: str, tmp_path: Path
) -> None:
    """Picklable is not runnable anywhere: captured in a pandas UDF it fails on the executor."""
    name = f"in-task-{uuid.uuid4().hex[:8]}"
    writer = exactly_once(PartitionedFileSink(tmp_path / "t"), coordinator, query_name=name)

    def probe(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd  # type: ignore[import-untyped]

        for _ in batches:
            try:
                writer(None, 0)
                outcome = "ran"
            except ExecutorContextError as e:
                outcome = str(e)
            yield pd.DataFrame({"outcome": [outcome]})

    rows = spark_connect.range(0, 4, 1, 2).mapInPandas(probe, "outcome string").collect()
    assert rows, "the probe ran in no task"
    for row in rows:
        assert "exactly_once batch function must run on the Spark driver" in row.outcome
    with CoordinatorClient(coordinator) as client, pytest.raises(NotFound):
        client.get_producer_offsets(f"{name}.b0")


# -- streaming through the Connect server ------------------------------------------------------------


def _publish(directory: Path, first: int, count: int) -> None:
    """Input files of unique ids, each made visible by an atomic rename."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + count):
        tmp = directory.parent / f".tmp-{i}.json"
        lines = (
            json.dumps({"id": i * RECORDS_PER_FILE + j, "bucket": f"b{j % 3}"})
            for j in range(RECORDS_PER_FILE)
        )
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, directory / f"in-{i:03d}.json")


def _run_job(
    server: SparkConnectServer, coordinator: str, root: Path, name: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    argv = [
        sys.executable, str(JOB), "--remote", server.url, "--target", coordinator,
        "--input", str(root / "input"), "--checkpoint", str(root / "chk"), "--table", str(root / "table"),
        "--query-name", name, *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    context = (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n"
        f"--- server log {server.log_path} ---\n{server.log_tail()}"
    )
    assert lines, context
    return proc.returncode, json.loads(lines[-1])


def _table_ids(root: Path) -> Counter[int]:
    sink = PartitionedFileSink(root / "table", partition_by=["bucket"], name="connect-table")
    return Counter(int(r["id"]) for r in sink.read_json_records())


def _records(coordinator: str, name: str) -> dict[str, tuple[Offset, ...]]:
    with CoordinatorClient(coordinator) as client:
        items = client.list_producer_offsets(page_size=1000).items
    return {
        p.producer_id: decode(p.offsets).sink_positions
        for p in items
        if p.producer_id.startswith(f"{name}.b")  # batch records, not epoch claims
    }


def _at(seq: int, epoch: int) -> tuple[Offset, ...]:
    """The table's positions before write ``seq`` of run ``epoch``."""
    return (Offset("connect-table", 0, seq), Offset("connect-table", 1, epoch))


def _expected(files: int) -> Counter[int]:
    return Counter(range(files * RECORDS_PER_FILE))


def test_batch_rerun_after_a_crash_leaves_each_record_once(
    spark_connect_server: SparkConnectServer, coordinator: str, tmp_path: Path
) -> None:
    name = f"connect-crash-{uuid.uuid4().hex[:8]}"
    _publish(tmp_path / "input", 0, 3)
    marker = tmp_path / "crashed-once"
    crash = ("--fail-once-at-batch", "1", "--marker", str(marker))

    code, result = _run_job(spark_connect_server, coordinator, tmp_path, name, *crash)
    assert code == 3 and "simulated crash after the sink write of batch 1" in str(result["error"]), result
    assert result["session"] == "pyspark.sql.connect.session.SparkSession"
    assert result["batches"] == [0] and marker.exists()
    # Batch 1's output is already in the table, and Spark has not committed batch 1: a plain re-run
    # would write it a second time.
    assert _table_ids(tmp_path) == _expected(2)
    assert _records(coordinator, name) == {f"{name}.b1": _at(2, 1)}  # log entry 0: the fence's

    code, result = _run_job(spark_connect_server, coordinator, tmp_path, name, *crash)
    assert (code, result["error"]) == (0, None), result
    assert result["batches"] == [1, 2]  # batch 1 re-ran with the same id
    assert _table_ids(tmp_path) == _expected(3)  # each record once: the re-run rolled batch 1 back
    # The re-run (epoch 2) fenced at 3, above batch 1's voided entry 2, and rewrote batch 1 as 4.
    assert _records(coordinator, name) == {f"{name}.b2": _at(5, 2)}


def test_checkpoint_reset_under_connect_loses_nothing(
    spark_connect_server: SparkConnectServer, coordinator: str, tmp_path: Path
) -> None:
    """The worker identifies the run by ``<checkpoint>/metadata``: after a reset, the new query's
    batch 0 meets the old query's record of batch 0 as its *first* batch, which without the query id
    would look like its own unfinished attempt and roll back the old run's committed output."""
    name = f"connect-reset-{uuid.uuid4().hex[:8]}"
    _publish(tmp_path / "input", 0, 1)
    code, result = _run_job(spark_connect_server, coordinator, tmp_path, name)
    assert (code, result["error"], result["batches"]) == (0, None, [0]), result
    assert _records(coordinator, name) == {f"{name}.b0": _at(1, 1)}  # stays: no finish() under Connect
    old_query_id = json.loads((tmp_path / "chk" / "metadata").read_text().splitlines()[0])["id"]

    # Reset: the checkpoint goes; the source no longer holds file 0 (retention), new files arrive.
    shutil.rmtree(tmp_path / "chk")
    (tmp_path / "input" / "in-000.json").unlink()
    _publish(tmp_path / "input", 1, 2)
    code, result = _run_job(spark_connect_server, coordinator, tmp_path, name)
    assert (code, result["error"], result["batches"]) == (0, None, [0, 1]), result
    assert json.loads((tmp_path / "chk" / "metadata").read_text().splitlines()[0])["id"] != old_query_id
    assert _table_ids(tmp_path) == _expected(3)  # file 0's committed batch survived the stale record
    assert _records(coordinator, name) == {f"{name}.b1": _at(4, 2)}  # entries 0, 2: the fences'


def test_connect_writer_without_checkpoint_location_refuses_to_run(
    spark_connect_server: SparkConnectServer, coordinator: str, tmp_path: Path
) -> None:
    name = f"connect-no-chk-{uuid.uuid4().hex[:8]}"
    _publish(tmp_path / "input", 0, 1)
    code, result = _run_job(spark_connect_server, coordinator, tmp_path, name, "--no-checkpoint-location")
    assert code == 3 and "pass checkpoint_location=" in str(result["error"]), result
    assert _table_ids(tmp_path) == Counter() and _records(coordinator, name) == {}


def test_streaming_through_connect_with_listener_and_backlog_runner(
    spark_connect_server: SparkConnectServer, coordinator: str, tmp_path: Path
) -> None:
    """Several micro-batches through the Connect server land exactly once, while PySpark >= 4
    delivers listener events to the client: ``SnapcoordListener`` runs there (it is never pickled)
    and ``BacklogAwareRunner`` drives the Connect queries from there."""
    name = f"runner-{uuid.uuid4().hex[:8]}"
    job = f"job-{name}"
    _publish(tmp_path / "input", 0, 3)  # the backlog: one batch per file, file-source offsets 0..2
    checkpoint = tmp_path / "chk"
    sink = PartitionedFileSink(tmp_path / "table", partition_by=["bucket"], name="connect-table")
    writer = exactly_once(sink, coordinator, query_name=name, checkpoint_location=str(checkpoint))
    spark_connect = spark_connect_server.session()

    def start_query(trigger: Mapping[str, Any]) -> Any:
        return start_with_retries(
            lambda: (
                spark_connect.readStream.schema("id long, bucket string")
                .option("maxFilesPerTrigger", 1)
                .json(str(tmp_path / "input"))
                .writeStream.queryName(name)
                .foreachBatch(writer)
                .option("checkpointLocation", str(checkpoint))
                .trigger(**trigger)
                .start()
            )
        )

    with CoordinatorClient(coordinator, timeout_s=10) as client:
        listener = SnapcoordListener(
            client,
            {name: f"{job}-listener"},
            latest_offsets={name: lambda: [Offset("files", 0, 2)]},
            stream_names={name: ["files"]},
        )
        spark_connect.streams.addListener(listener)
        runner = BacklogAwareRunner(
            start_query,
            job,
            client,
            {"availableNow": True},
            {"processingTime": "200 milliseconds"},
            latest_offsets=lambda: [Offset("files", 0, 2)],
            stream_names=["files"],
        )
        try:
            runner.run(timeout_s=120)
            assert (runner.switch_count, runner.triggers[-1]) == (1, {"processingTime": "200 milliseconds"})
            status = client.get_backlog_status(job)
            assert not status.processing_backlog
            assert [(p.stream, p.boundary, p.position) for p in status.partitions] == [("files", 2, 2)]
            # The listener, in this client process, saw the same batches and kept its own job.
            wait_until(lambda: listener.last_batch(name) is not None, timeout=60, what="a client-side event")
            wait_until(
                lambda: not client.get_backlog_status(f"{job}-listener").processing_backlog,
                timeout=60,
                what="the listener's job to catch up",
            )
            last = listener.last_batch(name)
            assert last is not None and last.end == (Offset("files", 0, 2),)
            assert listener.errors == 0
        finally:
            runner.stop()
            # Not streams.removeListener: PySpark's Connect client joins its event thread there, and
            # we saw that join hang; stopping the session ends the listener bus as well.
            spark_connect.stop()
    assert _table_ids(tmp_path) == _expected(3)
    # The writer ran in the server's worker and talked to the coordinator from there: each batch
    # deleted its predecessor's record; the last one stays for a re-run of batch 2.
    assert _records(coordinator, name) == {f"{name}.b2": _at(3, 1)}  # log entry 0: the fence's
