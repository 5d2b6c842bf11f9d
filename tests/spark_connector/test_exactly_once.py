"""Exactly-once foreachBatch: a file-source streaming driver SIGKILLed at chosen and random points.

Each driver is its own process group (``jobs/exactly_once_job.py``); a kill takes Python and the JVM
down together, like a lost driver machine. Kill points come from the job's ``EO_PAUSE`` hook (the job
announces the point in its events file and waits there), plus kills after random delays. The control
run kills the unwrapped job between the sink write and Spark's commit of batch 0 and must show the
duplicates that the wrapped job never has.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, NotFound, Offset
from snapcoord.spark_connector.attempts import decode
from snapcoord.spark_connector.epochs import Fenced
from snapcoord.spark_connector.exactly_once import exactly_once
from snapcoord.spark_connector.sinks import PartitionedFileSink, RollbackSink

pytestmark = pytest.mark.spark

JOB = Path(__file__).parent / "jobs" / "exactly_once_job.py"
RECORDS_PER_FILE = 10
EVENT_TIMEOUT_S = 150.0


@dataclass
class Driver:
    """Starts, watches and kills one driver process of the job."""

    root: Path
    mode: str
    target: str = ""
    lives: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.input = self.root / "input"
        self.input.mkdir(parents=True)
        self.table = self.root / "table"
        self.events = self.root / "events.log"
        self.events.touch()

    def publish(self, first_file: int, count: int) -> None:
        """Input files of unique ids, each made visible by an atomic rename."""
        for i in range(first_file, first_file + count):
            tmp = self.root / f"tmp-{i}.json"
            lines = (
                json.dumps({"id": i * RECORDS_PER_FILE + j, "bucket": f"b{(i + j) % 3}"})
                for j in range(RECORDS_PER_FILE)
            )
            tmp.write_text("\n".join(lines) + "\n")
            os.replace(tmp, self.input / f"in-{i:03d}.json")

    def input_ids(self) -> list[int]:
        ids = []
        for f in sorted(self.input.glob("*.json")):
            ids += [json.loads(line)["id"] for line in f.read_text().splitlines() if line]
        return ids

    def start(self, pause: str = "") -> subprocess.Popen[bytes]:
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, EO_PAUSE=pause)
        argv = [
            sys.executable, str(JOB), "--input", str(self.input), "--checkpoint", str(self.root / "chk"),
            "--table", str(self.table), "--events", str(self.events), "--mode", self.mode,
            "--target", self.target,
        ]  # fmt: skip
        log = (self.root / f"driver-{len(self.lives)}.log").open("wb")
        self.lives.append(pause or "run")
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def event_lines(self, pid: int) -> list[str]:
        prefix = f"{pid} "
        return [ln[len(prefix) :] for ln in self.events.read_text().splitlines() if ln.startswith(prefix)]

    def wait_for(self, proc: subprocess.Popen[bytes], pred: Callable[[str], bool]) -> str | None:
        """The first event line of ``proc`` matching ``pred``; None if the process exited first."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.event_lines(proc.pid):
                if pred(line):
                    return line
            if proc.poll() is not None:
                assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{self.log_tail()}"
                return None
            time.sleep(0.05)
        raise AssertionError(f"no matching event within {EVENT_TIMEOUT_S}s:\n{self.log_tail()}")

    def kill(self, proc: subprocess.Popen[bytes]) -> bool:
        """SIGKILL the driver's whole process group; False when it had already exited."""
        alive = proc.poll() is None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return alive and proc.returncode == -signal.SIGKILL

    def run_to_completion(self) -> None:
        proc = self.start()
        try:
            assert self.wait_for(proc, lambda ln: ln.startswith("done")) is not None
            assert proc.wait(timeout=60) == 0, self.log_tail()
        finally:
            if proc.poll() is None:
                self.kill(proc)

    def table_ids(self) -> Counter[int]:
        sink = PartitionedFileSink(self.table, partition_by=["bucket"], name="eo-table")
        return Counter(int(r["id"]) for r in sink.read_json_records())

    def log_tail(self) -> str:
        logs = sorted(self.root.glob("driver-*.log"), key=lambda p: int(p.stem.split("-")[1]))
        return logs[-1].read_text(errors="replace")[-4000:] if logs else "(no log)"


def _kill_schedule(rng: random.Random) -> Iterator[str]:
    """Pause specs (``point:nth``) or ``delay:<seconds>``: the first three land before the first commit,
    then a shuffled mix with several kills between the sink write and the commit log, then random ones
    (for as long as the caller asks: a delay kill does not count when the driver was already done)."""
    yield from ["batch_start:1", "mid_write:1", "after_write:1"]
    mixed = ["after_write", "after_write", "after_write", "mid_write", "batch_start", "delay", "delay"]
    rng.shuffle(mixed)
    while True:
        kind = mixed.pop() if mixed else rng.choice(["after_write", "mid_write", "batch_start", "delay"])
        # nth <= 2: every life gets two fresh input files, so its pause point is always reached.
        yield f"delay:{rng.uniform(3.0, 12.0):.1f}" if kind == "delay" else f"{kind}:{rng.randint(1, 2)}"


def test_killed_driver_writes_every_record_exactly_once(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    seed = int(os.environ.get("EO_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    with CoordinatorProcess(tmp_path / "coordinator", args=args) as coord:
        driver = Driver(tmp_path / "wrapped", "wrapped", coord.target)
        files = 2
        driver.publish(0, files)
        kills: list[str] = []
        for spec in _kill_schedule(rng):
            if len(kills) >= 10:
                break
            assert len(driver.lives) < 16, f"seed={seed}: only {len(kills)} kills landed: {kills}"
            driver.publish(files, 2)  # more input arrives between restarts
            files += 2
            kind, _, arg = spec.partition(":")
            if kind == "delay":
                proc = driver.start()
                time.sleep(float(arg))
                if driver.kill(proc):
                    kills.append(spec)
                continue
            proc = driver.start(pause=spec)
            line = driver.wait_for(proc, lambda ln: ln.startswith("pause "))
            assert line is not None, f"seed={seed}: the driver finished before its pause point {spec}"
            assert driver.kill(proc)
            kills.append(f"{spec} (batch {line.split()[-1]})")
        driver.run_to_completion()

        rollbacks = [ln for ln in driver.events.read_text().splitlines() if " rolled back " in ln]
        context = f"seed={seed} kills={kills} rollbacks={len(rollbacks)}"
        assert len(kills) >= 10, context
        assert sum(k.startswith("after_write") for k in kills) >= 3, context
        expected = Counter(driver.input_ids())
        assert len(expected) == files * RECORDS_PER_FILE
        got = driver.table_ids()
        assert got == expected, (
            f"{context}: missing {sorted(expected - got)[:20]}, extra {sorted(got - expected)[:20]}"
        )

        # Every kill after a registered write left output that the batch's re-run had to roll back (a
        # delay kill landing between a rollback and its event can hide at most one of them).
        must_roll_back = sum(k.startswith(("after_write", "mid_write")) for k in kills)
        delays = sum(k.startswith("delay") for k in kills)
        assert len(rollbacks) >= must_roll_back - delays, context

        with CoordinatorClient(coord.target) as client:
            left = [p.producer_id for p in client.list_producer_offsets(page_size=1000).items]
        assert [p for p in left if p.startswith("eo-test.")] == [], f"records left behind: {left}"


def test_same_kill_without_the_wrapper_duplicates_a_batch(tmp_path: Path) -> None:
    driver = Driver(tmp_path / "plain", "plain")
    driver.publish(0, 4)
    proc = driver.start(pause="after_write:1")
    line = driver.wait_for(proc, lambda ln: ln.startswith("pause "))
    assert line == "pause after_write 0"
    assert driver.kill(proc)
    driver.run_to_completion()

    expected = Counter(driver.input_ids())
    got = driver.table_ids()
    assert set(got) == set(expected)  # nothing lost...
    duplicated = sorted(i for i, c in got.items() if c > 1)
    assert len(duplicated) == RECORDS_PER_FILE, got  # ...but batch 0 (one input file) landed twice
    assert all(got[i] == 2 for i in duplicated)


# -- the protocol and the wrapper without Spark's streaming engine --------------------------------------


class _ListSink:
    """A toy sink of the protocol: an append-only list with its length as the one position."""

    def __init__(self) -> None:
        self.rows: list[str] = []

    def positions(self) -> list[Offset]:
        return [Offset("list", 0, len(self.rows))]

    def rollback_to(self, positions: list[Offset]) -> None:
        del self.rows[positions[0].offset :]


@dataclass
class _Query:
    lastProgress: dict[str, object] | None  # the StreamingQuery attribute finish() reads


def test_wrapper_rolls_back_a_rerun_batch_and_deletes_committed_records(tmp_path: Path) -> None:
    sink = _ListSink()
    assert isinstance(sink, RollbackSink)
    with CoordinatorProcess(tmp_path / "coordinator") as coord, CoordinatorClient(coord.target) as client:

        def write(df: list[str], batch_id: int) -> None:
            sink.rows.extend(df)

        first = exactly_once(sink, coord.target, query_name="toy", batch_function=write)
        first(["a", "b"], 0)
        first(["c"], 1)  # batch 0 committed: its record goes
        with pytest.raises(NotFound):
            client.get_producer_offsets("toy.b0")
        assert decode(client.get_producer_offsets("toy.b1").offsets).sink_positions == (Offset("list", 0, 2),)
        sink.rows.append("partial")  # a crashed attempt of batch 1 wrote more than "c"

        second = exactly_once(
            sink, lambda: CoordinatorClient(coord.target), query_name="toy", batch_function=write
        )
        second(["c"], 1)  # the restarted driver re-runs batch 1
        assert sink.rows == ["a", "b", "c"]
        assert second.rollbacks == 1
        second(["d"], 2)
        assert sink.rows == ["a", "b", "c", "d"]

        # finish() drops the last record only when the query's last progress proves batch 2 committed.
        executed = {"batchId": 2, "durationMs": {"addBatch": 5, "triggerExecution": 9}}
        idle_before = {"batchId": 2, "durationMs": {"triggerExecution": 1}}  # stopped inside batch 2
        idle_after = {"batchId": 3, "durationMs": {"triggerExecution": 1}}
        assert not second.finish(_Query(None))
        assert not second.finish(_Query(idle_before))
        assert not second.finish(_Query({"batchId": 1, "durationMs": {"addBatch": 5}}))
        assert decode(client.get_producer_offsets("toy.b2").offsets).sink_positions == (Offset("list", 0, 3),)
        assert second.finish(_Query(idle_after))
        assert not second.finish(_Query(executed))  # already gone
        client.register_producer_offsets("toy.b2", [Offset("list", 0, 3)])
        assert second.finish(_Query(executed))
        with pytest.raises(NotFound):
            client.get_producer_offsets("toy.b2")
        second.close()
        first.close()


def _ids(sink: PartitionedFileSink) -> list[int]:
    return sorted(int(r["id"]) for r in sink.read_json_records())


def test_partitioned_file_sink_commits_fences_and_rolls_back_one_attempt(
    tmp_path: Path, spark: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    table = tmp_path / "t"
    sink = PartitionedFileSink(table, partition_by=["bucket"])
    df = spark.createDataFrame([(i, f"b{i % 2}") for i in range(6)], "id long, bucket string")
    assert sink.positions() == [Offset("t", 0, 0), Offset("t", 1, 0)]
    assert sink.committed_files() == [] and sink.read(spark).count() == 0
    sink.fence(1)
    sink.write(df, 0)
    mark = sink.positions()
    assert mark == [Offset("t", 0, 1), Offset("t", 1, 1)]
    sink.write(df.filter("id < 3"), 1)
    assert _ids(sink) == [0, 0, 1, 1, 2, 2, 3, 4, 5]
    assert {r["bucket"] for r in sink.read_json_records()} == {"b0", "b1"}
    assert [c.batch_id for c in sink.commits()] == [0, 1]

    # Files without a commit (a write that died before its commit point) are never read.
    (table / "bucket=b0" / f"part-{9:012d}-e{1:012d}-{'a' * 12}-00000.json").write_text('{"id": 99}\n')
    assert _ids(sink) == [0, 0, 1, 1, 2, 2, 3, 4, 5]
    assert sorted(r["id"] for r in sink.read(spark).collect()) == [0, 0, 1, 1, 2, 2, 3, 4, 5]
    assert sink.read(spark).columns == ["id", "bucket"]

    # A restarted driver (epoch 2) rescans, fences, and rolls back epoch 1's attempt from `mark`.
    fresh = PartitionedFileSink(table, partition_by=["bucket"])
    fresh.fence(2)
    assert fresh.positions() == [Offset("t", 0, 10), Offset("t", 1, 2)]
    fresh.rollback_to(mark)
    assert _ids(fresh) == list(range(6))
    assert not (table / "bucket=b0" / f"part-{9:012d}-e{1:012d}-{'a' * 12}-00000.json").exists()
    attempt = fresh.positions()
    assert attempt == [Offset("t", 0, 2), Offset("t", 1, 2)]  # the junk file's number is free again
    fresh.write(df.filter("id >= 4"), 1)
    assert _ids(fresh) == [0, 1, 2, 3, 4, 4, 5, 5]

    # The old driver is a zombie: its writes fail at the fence check...
    with pytest.raises(Fenced):
        sink.write(df, 2)
    with pytest.raises(Fenced):
        sink.rollback_to(mark)
    # ...and one that passed its check just before the fence commits into the fenced range: the
    # commit file exists, but no reader sees it.
    monkeypatch.setattr(sink, "check_epoch", lambda: None)
    sink.write(df, 2)
    assert len(list((table / "_commits").glob(f"*-e{1:012d}.json"))) == 2
    assert _ids(fresh) == [0, 1, 2, 3, 4, 4, 5, 5]
    assert _ids(PartitionedFileSink(table, partition_by=["bucket"])) == [0, 1, 2, 3, 4, 4, 5, 5]

    # A rollback by epoch 2 of an attempt of epoch 2 removes that attempt and the zombie's dead
    # files, and keeps epoch 1's committed batch 0 below the position.
    fresh.rollback_to(attempt)
    assert _ids(fresh) == list(range(6))
    assert sorted(p.name for p in (table / "_commits").iterdir()) == [f"{0:012d}-e{1:012d}.json"]
    assert len(fresh.committed_files()) == len(list(table.glob("bucket=*/part-*")))  # no dead files
    with pytest.raises(Fenced):
        fresh.rollback_to([Offset("t", 0, 0), Offset("t", 1, 3)])  # a newer epoch's attempt
    with pytest.raises(ValueError, match="do not name this sink"):
        fresh.rollback_to([Offset("other", 0, 0)])
