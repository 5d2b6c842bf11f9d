"""The connector on a real Spark standalone cluster whose executors cannot reach the coordinator.

A master and two workers (``harness.spark_cluster``) run in a network namespace that reaches only the
driver's ports and the S3 server; the executors the workers fork run there too, in JVMs of their own.
Each test's driver is a process of the root namespace (``jobs/cluster_job.py``), where the
coordinator runs. Checkpoints and tables are on ``s3a://`` (hadoop-aws on the driver's and the
executors' class path); the input is JSON-lines files on the local disk, one per batch.

So the design's promise that only the driver talks to the coordinator is tested, not assumed: a
coordinator call made inside a task fails there, while ``exactly_once``, savepoints and the backlog
runner, which call it from the driver only, work end to end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import s3a
from harness.coordinator import CoordinatorProcess
from harness.json_input import ids_of, publish
from harness.locations import TestDir
from harness.seaweed import SeaweedS3Server
from harness.spark_cluster import SparkCluster
from snapcoord.spark_connector import PartitionedFileSink

# Two driver starts and seven batches in one test, each batch several Spark jobs scheduled on executors
# of another JVM: minutes on a loaded 2-core machine, beyond the suite's default 300 s.
pytestmark = [pytest.mark.spark, pytest.mark.process, pytest.mark.timeout(1800)]

JOB = Path(__file__).parent / "jobs" / "cluster_job.py"
DRIVER_TIMEOUT_S = 900  # a driver start, executors launched by two workers, and its batches, on 2 busy cores


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedS3Server) -> Iterator[SparkCluster]:
    """The module's cluster; its namespace reaches the S3 server (and the drivers' ports) only."""
    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), reachable=[s3_server.port]) as c:
        yield c


@pytest.fixture
def store(request: pytest.FixtureRequest, s3_server: SeaweedS3Server) -> Iterator[TestDir]:
    with s3a.s3a_dir(s3_server, request.node.name) as d:
        yield d


class Drivers:
    """Runs drivers of ``jobs/cluster_job.py`` on the module's cluster, one at a time, for one test."""

    def __init__(
        self, cluster: SparkCluster, s3_server: SeaweedS3Server, coordinator: CoordinatorProcess, logs: Path
    ) -> None:
        self.cluster, self.s3_server, self.coordinator, self.logs = cluster, s3_server, coordinator, logs

    def run(self, log: str, steps: str, **options: str | int) -> dict[str, Any]:
        """Run one driver to its end; returns its JSON line. A driver that fails or hangs fails the
        test with its log."""
        conf = {
            **self.cluster.driver_conf(),
            **s3a.spark_conf(self.s3_server),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.streaming.stopTimeout": "5s",
        }
        argv = [sys.executable, str(JOB), "--conf", json.dumps(conf), "--target", self.coordinator.target]
        argv += ["--steps", steps]
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        path = self.logs / log
        with path.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code = proc.wait(timeout=DRIVER_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        text = path.read_text(errors="replace")
        lines = [line for line in text.splitlines() if line.startswith("{")]
        assert code == 0 and lines, f"driver exited {code}:\n{text[-6000:]}"
        result: dict[str, Any] = json.loads(lines[-1])
        assert result["master"] == self.cluster.master_url
        return result


@pytest.fixture
def drivers(
    cluster: SparkCluster, s3_server: SeaweedS3Server, zk_coordinator: CoordinatorProcess, tmp_path: Path
) -> Drivers:
    return Drivers(cluster, s3_server, zk_coordinator, tmp_path)


def table_ids(s3_server: SeaweedS3Server, store: TestDir, name: str) -> Counter[int]:
    """Every committed record's id, read through s3fs (not the Hadoop FileSystem the job used)."""
    sink = PartitionedFileSink(
        store.uri_of("table"), partition_by=["bucket"], name=name, storage_options=s3a.s3fs_options(s3_server)
    )
    return Counter(int(r["id"]) for r in sink.read_json_records())


def test_the_namespace_reaches_s3_and_the_driver_but_not_the_coordinator(
    cluster: SparkCluster, s3_server: SeaweedS3Server, zk_coordinator: CoordinatorProcess
) -> None:
    coordinator_port = int(zk_coordinator.target.rpartition(":")[2])
    assert cluster.probe(coordinator_port) == "ECONNREFUSED"
    assert cluster.probe(s3_server.port) == "connected"
    assert cluster.probe(cluster.driver_port) == "connected"
    assert cluster.probe(cluster.block_manager_port) == "connected"
    # From the root namespace the coordinator is there: the refusal is the namespace's doing.
    socket.create_connection(("127.0.0.1", coordinator_port), timeout=10).close()
    workers = cluster.alive_workers()
    assert len(workers) == 2 and all(w["host"] == "127.0.0.1" for w in workers)
    assert cluster.master_json()["status"] == "ALIVE"


def test_a_coordinator_call_inside_a_task_fails_on_the_executors(
    cluster: SparkCluster, drivers: Drivers
) -> None:
    """The same call answers on the driver (NOT_FOUND: the coordinator was reached) and is refused
    inside both tasks, which ran in executor JVMs inside the cluster's namespace."""
    result = drivers.run("driver.log", "executor_call")
    found = result["executor_call"]
    assert found["driver"]["outcome"].startswith("NOT_FOUND"), found
    assert found["driver"]["netns"] == os.stat("/proc/self/ns/net").st_ino
    assert len(found["tasks"]) == 2
    for task in found["tasks"]:
        assert task["outcome"].startswith("UNAVAILABLE") and "Connection refused" in task["outcome"], found
        assert task["netns"] == os.stat(cluster.node.netns_path).st_ino  # the cluster's namespace
        assert task["jvm"] == "org.apache.spark.executor.CoarseGrainedExecutorBackend"  # not the driver


def test_exactly_once_across_a_restart_and_a_savepoint_round_trip(
    drivers: Drivers, s3_server: SeaweedS3Server, store: TestDir, tmp_path: Path
) -> None:
    """Driver 1 writes three batches through ``exactly_once`` and takes a savepoint; driver 2 (a
    restart on the same checkpoint) writes two more, restores the savepoint into a new checkpoint,
    which cuts the sink back to it, and runs the restored query: every record ends up there once."""
    name, app = f"eo-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    source = tmp_path / "in"
    common: dict[str, str | int] = {
        "input": str(source), "checkpoint": store.uri_of("cp"), "restored": store.uri_of("restored"),
        "table": store.uri_of("table"), "name": name, "app": app,
    }  # fmt: skip
    publish(source, 0, 3)
    first = drivers.run("driver-1.log", "eo,snapshot", **common)
    assert first["eo"] == [0, 1, 2]
    assert first["snapshot"]["state"] == "COMPLETED"
    assert table_ids(s3_server, store, name) == ids_of(range(3))
    assert store.storage.exists("cp/commits/2")

    publish(source, 3, 2)
    generation = first["snapshot"]["generation"]
    second = drivers.run("driver-2.log", "eo,restore,eo_restored", generation=generation, **common)
    assert second["eo"] == [3, 4]  # the restart resumed after batch 2: nothing read twice
    # The restore cut the sink back to the savepoint, keeping all of it; the restored query wrote
    # batches 3 and 4 again.
    assert second["restore"]["batch_id"] == 2
    assert Counter(second["restore"]["kept"]) == ids_of(range(3))
    assert second["eo_restored"] == [3, 4]
    assert table_ids(s3_server, store, name) == ids_of(range(5))


def test_the_backlog_runner_switches_once_the_backlog_is_done(
    drivers: Drivers, s3_server: SeaweedS3Server, store: TestDir, tmp_path: Path
) -> None:
    name, job = f"bl-{uuid.uuid4().hex[:6]}", f"job-{uuid.uuid4().hex[:6]}"
    source = tmp_path / "in"
    publish(source, 0, 3)  # the backlog: file-source log offsets 0..2
    result = drivers.run(
        "driver.log", "backlog",
        input=str(source), checkpoint=store.uri_of("cp"), table=store.uri_of("table"), name=name, job=job,
    )  # fmt: skip
    found = result["backlog"]
    assert found["switches"] == ["steady"]
    assert Counter(found["at_switch"]) == ids_of(range(3))  # the switch came after the whole backlog
    assert found["processing_backlog"] is False
    assert found["partitions"] == [["events-files", 0, 2, True]]
    assert table_ids(s3_server, store, name) == ids_of(range(4))  # file 3 came after the switch, once
