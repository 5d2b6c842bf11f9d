"""A streaming query's checkpoint, table and snapshots carry across Spark connector versions, both
ways: the previous release's connector (built from its commit, in its own venv; its modules were
flat) and this tree's take turns on one query. CHANGELOG 0.4.0 moved the connector's modules and
says its behaviour is unchanged, so each continues what the other wrote and restores the other's
snapshots.

Each turn is a driver process of one connector version (``connector_job.py``: one Spark session,
local[2], for the turn's steps, paused after each for the test to look at the table): the
release's runs its venv's Python, with this tree's pyspark and py4j on its path (the release venv
holds the connector's code, not PySpark; ``PYSPARK_PYTHON`` makes any Python task run the same).
One query through ``exactly_once`` into a ``PartitionedFileSink``, against this tree's coordinator
on ZooKeeper and S3, one input file per batch:

1. the release runs batches 0 and 1 and takes snapshot S1 of the stopped query;
2. the tree continues the same checkpoint and table (batches 2 and 3: every record once, nothing
   lost, nothing doubled) and snapshots it (S2); it restores S1 into a new checkpoint: the sink
   holds S1's commits, untouched, and nothing after them; the restored query runs on (batches 2
   to 4, every record once) and the tree snapshots it (S3);
3. the release continues the checkpoint the tree restored and ran (batch 5), restores S3 (the
   tree's snapshot) into another one, the sink cut back to S3's commits, runs batch 5 again from it,
   every record once, and snapshots it (S4).

Three driver starts (each a JVM) in all: the module's time is mostly theirs.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import py4j
import pyspark
import pytest

from harness.coordinator import CoordinatorProcess
from harness.process import wait_until
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector import PartitionedFileSink
from snapcoord.spark_connector.savepoints.app_snapshots import BATCH_ID_KEY
from upgrades.installed import InstalledRelease
from upgrades.releases import ROOT

pytestmark = [pytest.mark.spark, pytest.mark.process, pytest.mark.timeout(1800)]

JOB = Path(__file__).resolve().parent / "connector_job.py"
RECORDS_PER_FILE = 10
#: A driver's start, a run of a few batches and its stop, on a loaded 2-core machine.
STEP_TIMEOUT_S = 600


@dataclass(frozen=True)
class Connector:
    """How to run a driver of one connector version: its Python and what its path adds."""

    version: str
    python: Path
    pythonpath: str
    #: Where its connector's modules are: a driver importing them from anywhere else fails the step.
    home: Path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        # Spark's Python tasks run the driver's interpreter (and path), not the PATH default.
        return env | {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(self.python)}


@pytest.fixture(scope="module")
def connectors(
    previous_release: InstalledRelease, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Connector]:
    """The previous release's connector and this tree's, by name ("release", "tree")."""
    spark_only = tmp_path_factory.mktemp("pyspark-path")
    for package in (pyspark, py4j):
        assert package.__file__ is not None
        (spark_only / package.__name__).symlink_to(Path(package.__file__).parent)
    release = Connector(
        previous_release.release.version,
        previous_release.python,
        str(spark_only),
        previous_release.site_packages(),
    )
    tree = Connector(
        (ROOT / "VERSION").read_text().strip(), Path(sys.executable), "", ROOT / "spark_connector"
    )
    return {"release": release, "tree": tree}


@pytest.fixture(scope="module")
def coordinator(
    tmp_path_factory: pytest.TempPathFactory, zk_hosts: str, s3_server: SeaweedS3Server
) -> Iterator[str]:
    """This tree's ``snapcoord serve`` on the shared ZooKeeper and S3, in a chroot of its own."""
    run = f"connector-across-{uuid.uuid4().hex[:8]}"
    args = ["--metadata", f"zk://{zk_hosts}/t/{run}", "--blobs", s3_server.uri(f"t/{run}")]
    with CoordinatorProcess(tmp_path_factory.mktemp("coordinator"), args=args) as process:
        yield process.target


class Driver:
    """One driver process of ``connector_job`` running ``steps`` with one connector version (its own
    process group: a failed test kills Python and its JVM together). ``result()`` waits for the next
    step's result; ``go()`` lets the driver start the step after it."""

    def __init__(self, query: Query, connector: Connector, steps: Sequence[str]) -> None:
        self.connector = connector
        self.dir = query.root / f"driver-{len(list(query.root.glob('driver-*')))}"
        self.dir.mkdir()
        self.log = self.dir / "driver.log"
        argv = [str(connector.python), str(JOB), "--target", query.target, "--name", query.name]
        argv += ["--app", query.app, "--input", str(query.input), "--table", str(query.table)]
        argv += ["--dir", str(self.dir), *steps]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                argv, env=connector.env(), cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.steps = len(steps)
        self.done = 0

    def failure(self, what: str) -> AssertionError:
        tail = self.log.read_text(errors="replace")[-4000:]
        return AssertionError(f"{self.connector.version} driver {what}:\n{tail}")

    def _result(self, path: Path) -> dict[str, Any] | None:
        if path.exists():
            found: dict[str, Any] = json.loads(path.read_text())
            return found
        if self.process.poll() is not None:
            raise self.failure(f"exited {self.process.returncode} before {path.name}")
        return None

    def result(self) -> dict[str, Any]:
        """The next step's result, once the connector asked for (its version, its files) gave it."""
        path = self.dir / f"result-{self.done}.json"
        found = wait_until(lambda: self._result(path), timeout=STEP_TIMEOUT_S, interval=0.2, what=path.name)
        self.done += 1
        assert found["connector"] == self.connector.version, found
        assert Path(found["module"]).is_relative_to(self.connector.home), found["module"]
        return found

    def go(self) -> None:
        (self.dir / f"go-{self.done - 1}").touch()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                assert self.done == self.steps
                if self.process.wait(timeout=STEP_TIMEOUT_S) != 0:
                    raise self.failure(f"exited {self.process.returncode}")
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@dataclass
class Query:
    """One query's input, table and checkpoints, driven by drivers of either connector."""

    root: Path
    target: str
    name: str
    app: str

    @property
    def table(self) -> Path:
        return self.root / "table"

    @property
    def input(self) -> Path:
        return self.root / "input"

    def checkpoint(self, name: str) -> str:
        return str(self.root / name)

    def publish(self, first: int, count: int) -> None:
        """Input files ``first .. first+count-1``; file ``i`` holds ids ``10i .. 10i+9``."""
        self.input.mkdir(parents=True, exist_ok=True)
        for i in range(first, first + count):
            tmp = self.root / f".in-{i}.json"
            ids = range(i * RECORDS_PER_FILE, (i + 1) * RECORDS_PER_FILE)
            tmp.write_text("".join(json.dumps({"id": n}) + "\n" for n in ids))
            os.replace(tmp, self.input / f"in-{i:03d}.json")

    def driver(self, connector: Connector, *steps: str) -> Driver:
        return Driver(self, connector, steps)

    def sink(self) -> PartitionedFileSink:
        return PartitionedFileSink(self.table, name=self.name)

    def ids(self) -> Counter[int]:
        return Counter(int(r["id"]) for r in self.sink().read_json_records())

    def committed_content(self) -> dict[str, str]:
        """Every visible commit and the SHA-256 of each file it lists."""
        sink = self.sink()
        return {
            f"{c.file_name}:{f}": hashlib.sha256(sink.storage.read_bytes(f)).hexdigest()
            for c in sink.commits()
            for f in c.files
        }


def expected(files: int) -> Counter[int]:
    return Counter(range(files * RECORDS_PER_FILE))


def snapshot_of(result: dict[str, Any]) -> int:
    """The generation of a ``snapshot`` step's result, which must have completed."""
    assert result["state"] == "COMPLETED", result
    generation: int = result["generation"]
    return generation


def batch_of_snapshot(client: CoordinatorClient, query: Query, generation: int) -> int:
    """The batch id the snapshot recorded for ``query`` (its small key), checked against the
    committed offset it reported (the file source's log offset of that batch)."""
    keys = client.read_checkpoint(query.app, generation, query.name, BATCH_ID_KEY)
    batch = int(b"".join(keys).decode())
    (task,) = client.get_snapshot(query.app, generation).tasks
    assert task.committed_offsets == (Offset(f"{query.name}.0", 0, batch),)
    return batch


def test_one_query_carries_across_connector_versions_both_ways(
    connectors: dict[str, Connector], coordinator: str, tmp_path: Path
) -> None:
    release, tree = connectors["release"], connectors["tree"]
    query = Query(tmp_path, coordinator, f"q-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}")
    cp, r1, r2 = query.checkpoint("cp"), query.checkpoint("restored-1"), query.checkpoint("restored-2")
    snapshots: dict[str, int] = {}

    query.publish(0, 2)
    with query.driver(release, f"run:{cp}", f"snapshot:{cp}") as driver:
        assert driver.result()["batches"] == [0, 1]
        assert query.ids() == expected(2)
        driver.go()
        snapshots["S1"] = snapshot_of(driver.result())
    at_s1 = query.committed_content()

    query.publish(2, 2)
    steps = [f"run:{cp}", f"snapshot:{cp}", f"restore:{snapshots['S1']}:{r1}", f"run:{r1}", f"snapshot:{r1}"]
    with query.driver(tree, *steps) as driver:
        assert driver.result()["batches"] == [2, 3]  # the same checkpoint: batch 2 follows the release's 1
        assert query.ids() == expected(4)  # nothing lost, nothing doubled
        assert query.committed_content().items() >= at_s1.items()
        driver.go()
        snapshots["S2"] = snapshot_of(driver.result())
        driver.go()
        assert driver.result()["batch_id"] == 1  # the release's snapshot, restored
        assert query.committed_content() == at_s1  # its commits untouched, the later ones cut
        assert query.ids() == expected(2)
        query.publish(4, 1)
        driver.go()
        assert driver.result()["batches"] == [2, 3, 4]
        assert query.ids() == expected(5)  # each record exactly once
        assert query.committed_content().items() >= at_s1.items()
        driver.go()
        snapshots["S3"] = snapshot_of(driver.result())
    at_s3 = query.committed_content()

    query.publish(5, 1)
    steps = [f"run:{r1}", f"restore:{snapshots['S3']}:{r2}", f"run:{r2}", f"snapshot:{r2}"]
    with query.driver(release, *steps) as driver:
        assert driver.result()["batches"] == [5]  # the checkpoint the tree restored and ran
        assert query.ids() == expected(6)
        driver.go()
        assert driver.result()["batch_id"] == 4  # the tree's snapshot, restored
        assert query.committed_content() == at_s3
        assert query.ids() == expected(5)
        driver.go()
        assert driver.result()["batches"] == [5]
        assert query.ids() == expected(6)
        assert query.committed_content().items() >= at_s3.items()
        driver.go()
        snapshots["S4"] = snapshot_of(driver.result())

    with CoordinatorClient(coordinator, timeout_s=60) as client:
        batches = {s: batch_of_snapshot(client, query, generation) for s, generation in snapshots.items()}
    assert batches == {"S1": 1, "S2": 3, "S3": 4, "S4": 5}
