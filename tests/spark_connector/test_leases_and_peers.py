"""A restore job's lease keeps its snapshot through retention passes; only the driver talks to the
coordinator. Both against a real ``snapcoord serve`` process and a real local Spark."""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import udf
from pyspark.sql.streaming.query import StreamingQuery

from harness.coordinator import CoordinatorProcess
from harness.process import wait_until
from snapcoord.client import CoordinatorClient, NotFound, SnapshotState
from snapcoord.spark_connector.backlog.listener import SnapcoordListener
from snapcoord.spark_connector.savepoints.app_snapshots import SnapshotQuery, take_snapshot
from snapcoord.spark_connector.savepoints.restore import RestoreTarget, restore_snapshot

pytestmark = pytest.mark.spark


def write_rows(directory: Path, name: str, ids: list[int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}-{name}.tmp"
    staging.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    os.replace(staging, directory / f"{name}.json")


class Sink:
    """foreachBatch sink: ids and the pid of the Python process that computed each row's ``pid``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[int, int]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = [(int(r["id"]), int(r["pid"])) for r in df.collect()]
        with self._lock:
            self.rows.extend(rows)

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(i for i, _ in self.rows)

    def pids(self) -> set[int]:
        with self._lock:
            return {p for _, p in self.rows}


def start_query(spark: SparkSession, name: str, source: Path, checkpoint: Path, sink: Sink) -> StreamingQuery:
    # A Python UDF: every batch runs Python code in Spark's Python workers (the executors' side).
    worker_pid = udf(lambda _: os.getpid(), "int", useArrow=False)
    return (
        spark.readStream.schema("id INT")
        .json(str(source))
        .withColumn("pid", worker_pid("id"))
        .writeStream.queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(sink)
        .trigger(processingTime="100 milliseconds")
        .start()
    )


@pytest.fixture
def idle_events(spark: SparkSession) -> Iterator[None]:
    """Idle queries post an event every 100 ms (default 10 s), so snapshots of idle apps complete soon."""
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    yield
    spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


def retention_passes(coordinator: CoordinatorProcess) -> int:
    text = urllib.request.urlopen(coordinator.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        ours = 'step="snapshot-retention"' in line and 'outcome="ok"' in line
        if line.startswith("snapcoord_janitor_passes_total{") and ours:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_restore_lease_keeps_snapshot_through_retention(spark: SparkSession, tmp_path: Path) -> None:
    with (
        CoordinatorProcess(tmp_path / "coordinator", args=["--cleanup-interval", "200ms"]) as coordinator,
        CoordinatorClient(coordinator.target, timeout_s=10) as client,
    ):
        app = f"retained-{uuid.uuid4().hex[:8]}"
        client.set_retention_policy(app, keep_last_completed=1, completed_ttl_ms=3_600_000)
        source, checkpoint = tmp_path / "in", tmp_path / "cp"
        orders = [SnapshotQuery("orders", str(checkpoint))]
        sink = Sink()
        write_rows(source, "a", [1, 2, 3])
        query = start_query(spark, "orders", source, checkpoint, sink)
        try:
            query.processAllAvailable()
            first = take_snapshot(client, app, orders, timeout_s=60)
            write_rows(source, "b", [4, 5])
            query.processAllAvailable()
            assert query.exception() is None

            # The restore job leases the older snapshot; then the app takes a newer one, which
            # makes the older one a retention victim (keep_last_completed=1).
            with client.lease(f"restore-{app}", [first.ref], duration_s=30) as keeper:
                assert keeper.lease is not None and keeper.unavailable == ()
                second = take_snapshot(client, app, orders, timeout_s=60)
                assert second.generation == first.generation + 1
                passes = retention_passes(coordinator)
                wait_until(
                    lambda: retention_passes(coordinator) >= passes + 3, timeout=60, what="3 retention passes"
                )
                held = client.get_snapshot(app, first.generation)
                assert held.state is SnapshotState.COMPLETED  # survived the passes

                # The restore job itself: resume "orders" from the leased snapshot.
                query.stop()
                target = RestoreTarget("orders", str(tmp_path / "restored"))
                restore_snapshot(client, app, first.generation, [target])
                restored_sink = Sink()
                restored = start_query(spark, "orders-restore", source, tmp_path / "restored", restored_sink)
                try:
                    restored.processAllAvailable()
                    assert restored.exception() is None
                finally:
                    restored.stop()
                assert restored_sink.ids() == [4, 5]
                assert keeper.healthy

            # The job exited (lease dropped): the next retention pass collects the snapshot.
            def collected() -> bool:
                try:
                    client.get_snapshot(app, first.generation)
                except NotFound:
                    return True
                return False

            wait_until(collected, timeout=60, interval=0.1, what="the older snapshot to be collected")
            assert client.get_snapshot(app, second.generation).state is SnapshotState.COMPLETED
        finally:
            query.stop()


# -- only the driver talks to the coordinator -----------------------------------------------------

_RPC_LOG = re.compile(r"rpc (snapcoord\.v1\.\S+) from (\S+)")


def _tcp_sockets() -> dict[int, tuple[int, int]]:
    """inode -> (local port, remote port) of every TCP socket of this network namespace."""
    sockets: dict[int, tuple[int, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            sockets[int(fields[9])] = (local_port, remote_port)
    return sockets


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or not ours to read
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def test_only_the_driver_connects(spark: SparkSession, idle_events: None, tmp_path: Path) -> None:
    """The coordinator logs the peer of every call (DEBUG). Every snapcoord.v1 call it saw must come
    from a connection this driver process holds open, and no other process on the machine holds a
    connection to the coordinator, although Spark ran Python code in worker processes each batch."""
    with (
        CoordinatorProcess(tmp_path / "coordinator", args=["--log-level", "DEBUG"]) as coordinator,
        CoordinatorClient(coordinator.target, timeout_s=10) as client,
    ):
        app = f"peers-{uuid.uuid4().hex[:8]}"
        names = ["orders", "payments"]
        checkpoints = {n: tmp_path / "cp" / n for n in names}
        listener = SnapcoordListener(client, {"orders": f"{app}-orders"})
        spark.streams.addListener(listener)
        sinks = {n: Sink() for n in names}
        for n in names:
            write_rows(tmp_path / "in" / n, "a", [1, 2, 3])
        queries = {n: start_query(spark, n, tmp_path / "in" / n, checkpoints[n], sinks[n]) for n in names}
        try:
            for n in names:
                queries[n].processAllAvailable()
            queries_ = [SnapshotQuery(n, str(checkpoints[n])) for n in names]
            snapshot = take_snapshot(client, app, queries_, timeout_s=60)
            assert snapshot.state is SnapshotState.COMPLETED
            assert sorted(t.task_id for t in snapshot.tasks) == names
            wait_until(
                lambda: listener.last_progress_result(f"{app}-orders"), timeout=30, what="backlog progress"
            )

            # Executors did run Python, in processes other than the driver.
            worker_pids = set().union(*(s.pids() for s in sinks.values()))
            assert worker_pids and os.getpid() not in worker_pids

            calls = _RPC_LOG.findall(coordinator.stderr_text())
            methods = {m for m, _ in calls}
            assert {
                "snapcoord.v1.SnapshotService/ReportTaskSnapshot",
                "snapcoord.v1.BacklogService/MarkBacklog",
                "snapcoord.v1.BacklogService/ReportProgress",
            } <= methods
            peers = {p for _, p in calls}
            assert all(p.startswith("ipv4:127.0.0.1:") for p in peers), peers
            peer_ports = {int(p.rsplit(":", 1)[1]) for p in peers}

            sockets = _tcp_sockets()
            assert coordinator.grpc_port is not None
            port = coordinator.grpc_port
            driver_ports = {
                sockets[i][0] for i in _socket_inodes(os.getpid()) if i in sockets and sockets[i][1] == port
            }
            assert peer_ports <= driver_ports, (peer_ports, driver_ports)
            # Nobody else (Python workers, the JVM, anything) holds a connection to the coordinator.
            client_inodes = {i for i, (_, remote) in sockets.items() if remote == port}
            owners = {
                int(pid)
                for pid in os.listdir("/proc")
                if pid.isdigit() and _socket_inodes(int(pid)) & client_inodes
            }
            assert owners == {os.getpid()}, owners
        finally:
            for q in queries.values():
                q.stop()
            spark.streams.removeListener(listener)
