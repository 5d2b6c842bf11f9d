"""Steps of a streaming query's life, driven by whichever Spark connector the Python running it
imports: a release's (its venv) or this tree's. ``test_connector_across_releases`` runs the steps
of one query alternately with two connector versions.

    python connector_job.py --target HOST:PORT --name NAME --app APP --input DIR --table DIR
                            --dir DIR STEP [STEP ...]

    run:CHECKPOINT          an availableNow run, one input file per batch, to the end, through
                            ``exactly_once`` into a ``PartitionedFileSink``
    snapshot:CHECKPOINT     ``take_snapshot`` of the (stopped) query
    restore:GEN:CHECKPOINT  ``restore_snapshot`` of generation GEN into a new checkpoint, the sink
                            cut back to the snapshot

After step ``i`` it writes ``result-<i>.json`` into ``--dir`` (the connector's version, the file
it was imported from, so the test knows which one ran, and the step's result), then waits for
``go-<i>`` there before the next step, so the test can look at the table between steps while one
Spark session (local[2], started by the first ``run``) serves them all. The job imports nothing
but the connector, its client, pyspark and the standard library: a release's venv has nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import re
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

#: The names the job uses, and the module of each in the connectors before 0.4.0 (flat modules);
#: from 0.4.0 on, the package root exports them all.
FLAT_MODULES = {
    "exactly_once": "exactly_once",
    "PartitionedFileSink": "sinks",
    "SnapshotQuery": "app_snapshots",
    "take_snapshot": "app_snapshots",
    "RestoreTarget": "restore",
    "restore_snapshot": "restore",
}
PACKAGES_SINCE = (0, 4, 0)
SCHEMA = "id INT"
#: How long the job waits for the test's ``go`` between steps.
GO_TIMEOUT_S = 1800


def connector_version() -> str:
    return version("snapcoord_spark")


def connector() -> dict[str, Any]:
    """The names of ``FLAT_MODULES`` from the installed connector, where its version keeps them."""
    release = tuple(int(n) for n in re.findall(r"\d+", connector_version())[:3])
    if release < PACKAGES_SINCE:
        return {
            n: getattr(importlib.import_module(f"snapcoord.spark_connector.{m}"), n)
            for n, m in FLAT_MODULES.items()
        }
    root = importlib.import_module("snapcoord.spark_connector")
    return {n: getattr(root, n) for n in FLAT_MODULES}


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.c = connector()
        self.spark: Any = None

    def sink(self) -> Any:
        return self.c["PartitionedFileSink"](self.args.table, name=self.args.name)

    def session(self) -> Any:
        if self.spark is None:
            from pyspark.sql import SparkSession

            self.spark = (
                SparkSession.builder.master("local[2]")
                .appName(f"connector-{connector_version()}")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .getOrCreate()
            )
        return self.spark

    def run(self, checkpoint: str) -> dict[str, Any]:
        a = self.args
        writer = self.c["exactly_once"](
            self.sink(), a.target, query_name=a.name, checkpoint_location=checkpoint
        )
        df = self.session().readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(a.input)
        query = (
            df.writeStream.queryName(a.name)
            .foreachBatch(writer)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            writer.finish(query)
        finally:
            query.stop()
            writer.close()
        return {"batches": [p.batchId for p in query.recentProgress if "addBatch" in (p.durationMs or {})]}

    def snapshot(self, checkpoint: str) -> dict[str, Any]:
        from snapcoord.client import CoordinatorClient

        with CoordinatorClient(self.args.target, timeout_s=60) as client:
            query = self.c["SnapshotQuery"](self.args.name, checkpoint, self.sink())
            taken = self.c["take_snapshot"](client, self.args.app, [query], timeout_s=120)
        return {"generation": taken.generation, "state": taken.state.name}

    def restore(self, generation: str, checkpoint: str) -> dict[str, Any]:
        from snapcoord.client import CoordinatorClient

        name = self.args.name
        with CoordinatorClient(self.args.target, timeout_s=60) as client:
            target = self.c["RestoreTarget"](name, checkpoint, self.sink())
            done = self.c["restore_snapshot"](client, self.args.app, int(generation), [target])[name]
        positions = [[p.stream, p.partition, p.offset] for p in done.sink_positions]
        return {"batch_id": done.batch_id, "query_id": done.query_id, "sink_positions": positions}

    def step(self, spec: str) -> dict[str, Any]:
        kind, _, rest = spec.partition(":")
        steps: dict[str, Callable[..., dict[str, Any]]] = {
            "run": self.run,
            "snapshot": self.snapshot,
            "restore": self.restore,
        }
        if kind not in steps or not rest:
            raise SystemExit(f"unknown step {spec!r}: run:CP, snapshot:CP or restore:GEN:CP")
        result: dict[str, Any] = steps[kind](*rest.split(":"))
        return result


def wait_for(go: Path) -> None:
    deadline = time.monotonic() + GO_TIMEOUT_S
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no {go.name} within {GO_TIMEOUT_S} s")
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--target", "--name", "--app", "--input", "--table", "--dir"):
        p.add_argument(flag, required=True)
    p.add_argument("steps", nargs="+")
    args = p.parse_args()
    job, out = Job(args), Path(args.dir)
    module = inspect.getfile(job.c["exactly_once"])
    try:
        for i, spec in enumerate(args.steps):
            if i:
                wait_for(out / f"go-{i - 1}")
            found = {"connector": connector_version(), "module": module, **job.step(spec)}
            tmp = out / f".result-{i}.json"
            tmp.write_text(json.dumps(found))
            tmp.replace(out / f"result-{i}.json")
    finally:
        if job.spark is not None:
            job.spark.stop()


if __name__ == "__main__":
    main()
