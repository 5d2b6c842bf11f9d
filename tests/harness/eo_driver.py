"""Drivers of the exactly-once job (``tests/spark_connector/jobs/exactly_once_job.py``), each its own
process group, killed at the job's pause points or after random delays, and the two runs the suites
make of them: a kill schedule, and a zombie driver followed by a checkpoint reset.

Each driver is its own process group; a kill takes Python and the JVM down together, like a lost
driver machine. Kill points come from the job's ``EO_PAUSE`` hook (the job announces the point in
its events file and waits there). The next driver boots as a standby while the current one runs
(``Driver.start(..., standby=True)``: its Spark session comes up, then it waits for ``Driver.go``
before it touches the checkpoint, the table or the coordinator), so a life costs the run its
batches rather than a JVM start. While the drivers die, a reader in the test process reads the
table's committed batches over and over and must never see a partial batch or a record twice. The
input is files, or a Kafka topic (``harness.kafka``): the same runs check both sources.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.coordinator import CoordinatorProcess
from harness.jars import jar_set
from harness.kafka import KafkaBroker
from snapcoord.client import CoordinatorClient
from snapcoord.spark_connector.sink.partitioned import PartitionedFileSink

JOB = Path(__file__).resolve().parents[1] / "spark_connector" / "jobs" / "exactly_once_job.py"
RECORDS_PER_FILE = 10
EVENT_TIMEOUT_S = 300.0  # a driver start under a loaded 2-core CI box took over 150 s


@dataclass
class Driver:
    """Starts, watches and kills one driver process of the job.

    With ``kafka`` the input is a topic of two partitions instead of a directory: "file" ``i`` is ten
    records, five in each partition, and a batch reads ten (``--max-offsets``), which Spark's Kafka
    source splits in proportion to what each partition has: five of each, so a batch is still one
    whole file."""

    root: Path
    mode: str
    target: str = ""
    kafka: KafkaBroker | None = None
    lives: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.input = self.root / "input"
        self.input.mkdir(parents=True)
        self.table = self.root / "table"
        self.events = self.root / "events.log"
        self.events.touch()
        self.topic = f"eo-{uuid.uuid4().hex[:8]}"
        self.sent: list[int] = []  # the ids produced to the topic
        self.logs: dict[int, Path] = {}  # each driver's output, by pid
        self.go_files: dict[int, Path] = {}  # each standby's go file, by pid
        if self.kafka is not None:
            self.kafka.create_topic(self.topic, partitions=2)

    def publish(self, first_file: int, count: int) -> None:
        """Input files of unique ids, each made visible by an atomic rename (or produced to the topic)."""
        for i in range(first_file, first_file + count):
            ids = [i * RECORDS_PER_FILE + j for j in range(RECORDS_PER_FILE)]
            records = [{"id": n, "bucket": f"b{(i + j) % 3}"} for j, n in enumerate(ids)]
            if self.kafka is not None:
                self.kafka.produce(self.topic, [(j % 2, json.dumps(r)) for j, r in enumerate(records)])
                self.sent += ids
                continue
            tmp = self.root / f"tmp-{i}.json"
            tmp.write_text("\n".join(json.dumps(r) for r in records) + "\n")
            os.replace(tmp, self.input / f"in-{i:03d}.json")

    def input_ids(self) -> list[int]:
        if self.kafka is not None:
            return list(self.sent)
        ids = []
        for f in sorted(self.input.glob("*.json")):
            ids += [json.loads(line)["id"] for line in f.read_text().splitlines() if line]
        return ids

    @property
    def checkpoint(self) -> Path:
        return self.root / "chk"

    def start(
        self, pause: str = "", *, release: Path | None = None, finish: bool = True, standby: bool = False
    ) -> subprocess.Popen[bytes]:
        """A driver process pausing at ``pause`` (``point:nth``, none: no pause); with ``release``, it
        goes on once that file exists. A ``standby`` boots its Spark session, then waits for ``go``."""
        go = self.root / f"go-{len(self.lives)}"
        env = dict(
            os.environ,
            SPARK_LOCAL_IP="127.0.0.1",
            PYSPARK_PYTHON=sys.executable,
            EO_PAUSE=pause,
            EO_RELEASE=str(release or ""),
            EO_GO=str(go) if standby else "",
        )
        argv = [
            sys.executable, str(JOB), "--input", str(self.input), "--checkpoint", str(self.checkpoint),
            "--table", str(self.table), "--events", str(self.events), "--mode", self.mode,
            "--target", self.target,
        ]  # fmt: skip
        if not finish:
            argv.append("--no-finish")
        if self.kafka is not None:
            jars = ",".join(str(j) for j in jar_set("spark-kafka"))
            argv += ["--kafka", self.kafka.bootstrap, "--topic", self.topic, "--jars", jars]
        log_path = self.root / f"driver-{len(self.lives)}.log"
        self.lives.append(pause or "run")
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.logs[proc.pid] = log_path
        if standby:
            self.go_files[proc.pid] = go
        return proc

    def go(self, proc: subprocess.Popen[bytes]) -> None:
        """Let a standby driver start its query."""
        self.go_files[proc.pid].touch()

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
                assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{self.log_tail(proc)}"
                return None
            time.sleep(0.05)
        raise AssertionError(f"no matching event within {EVENT_TIMEOUT_S}s:\n{self.log_tail(proc)}")

    def kill(self, proc: subprocess.Popen[bytes]) -> bool:
        """SIGKILL the driver's whole process group; False when it had already exited."""
        alive = proc.poll() is None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return alive and proc.returncode == -signal.SIGKILL

    def run_to_completion(self, proc: subprocess.Popen[bytes] | None = None, *, finish: bool = True) -> int:
        """Run a driver until the input is drained (``proc``: a standby started without a pause, let go
        here); returns its pid (for its event lines)."""
        if proc is None:
            proc = self.start(finish=finish)
        else:
            self.go(proc)
        try:
            assert self.wait_for(proc, lambda ln: ln.startswith("done")) is not None
            assert proc.wait(timeout=60) == 0, self.log_tail(proc)
        finally:
            if proc.poll() is None:
                self.kill(proc)
        return proc.pid

    def sink(self) -> PartitionedFileSink:
        return PartitionedFileSink(self.table, partition_by=["bucket"], name="eo-table")

    def table_ids(self) -> Counter[int]:
        return Counter(int(r["id"]) for r in self.sink().read_json_records())

    def log_tail(self, proc: subprocess.Popen[bytes]) -> str:
        log = self.logs.get(proc.pid)
        return log.read_text(errors="replace")[-4000:] if log is not None else "(no log)"


def whole_files(ids: list[int]) -> bool:
    """True when ``ids`` are the records of one or more whole input files, each exactly once.

    A batch usually holds one file (``maxFilesPerTrigger=1``), but not always: Spark's file source
    logs a batch's files before the engine logs its offsets, so a driver killed between the two
    leaves a logged file that the next life's first batch reads together with a new one."""
    files = {i // RECORDS_PER_FILE for i in ids}
    return bool(ids) and sorted(ids) == [
        f * RECORDS_PER_FILE + j for f in sorted(files) for j in range(RECORDS_PER_FILE)
    ]


#: A reader's view of a table: its visible batches, each a name and the ids it holds.
Batches = list[tuple[str, list[int]]]


def committed_batches(sink: PartitionedFileSink) -> Callable[[], Batches]:
    """What a reader of ``sink`` sees: each committed batch and its ids."""

    def read() -> Batches:
        batches = []
        for commit in sink.commits():
            ids: list[int] = []
            for rel in commit.files:
                text = sink.storage.read_bytes(rel).decode("utf-8")
                ids += [int(json.loads(line)["id"]) for line in text.splitlines() if line]
            batches.append((str(commit), ids))
        return batches

    return read


class Reader(threading.Thread):
    """Reads every committed batch of the table in a loop (``batches``), as a concurrent consumer
    would, and records any snapshot with a partial batch (not made of whole input files) or a record
    seen twice."""

    def __init__(self, batches: Callable[[], Batches]) -> None:
        super().__init__(daemon=True)
        self.batches = batches
        self.done = threading.Event()
        self.snapshots = 0
        self.retries = 0  # a rollback removed a listed commit's files while we read them
        self.most_batches = 0
        self.problems: list[str] = []

    def run(self) -> None:
        while not self.done.wait(0.05):  # a pause between reads leaves the 2 cores to the drivers
            try:
                self.read_once()
            except Exception as e:  # reported by the test, never swallowed
                self.problems.append(f"reader failed: {e!r}")
                return

    def read_once(self) -> None:
        try:
            batches = self.batches()
        except FileNotFoundError:
            self.retries += 1
            return
        seen: Counter[int] = Counter()
        for name, ids in batches:
            if not whole_files(ids):
                self.problems.append(f"partial batch {name}: {sorted(ids)}")
            seen.update(ids)
        twice = sorted(i for i, n in seen.items() if n > 1)
        if twice:
            self.problems.append(f"records visible twice: {twice[:20]}")
        self.snapshots += 1
        self.most_batches = max(self.most_batches, len(batches))


#: Kill points in an order where each one is reached: ``mid_rollback`` follows kills that left
#: output to roll back; the ``:2`` points are in a life's second batch (every life gets two new files).
FIXED_KILLS = [
    "batch_start:1",  # before the first commit
    "mid_write:1",
    "after_write:1",
    "mid_rollback:1",  # removed the committed attempt's commit, not yet its files
    "after_register:2",  # registered, nothing written
    "staging:1",  # inside an executor's staging write
    "after_delete:2",  # N-1's record deleted, N's not registered
    "commit:1",  # passed the fence check, commit file not written
    "after_write:2",
]
#: Kills whose next life must find the record and roll back (a random delay kill can hide one).
LEAVES_A_RECORD = ("after_write", "mid_write", "mid_rollback", "after_register", "staging", "commit")


def run_kill_schedule(
    tmp_path: Path, zk_uri: str, s3_uri: str, kafka_source: KafkaBroker | None, schedule: list[str]
) -> None:
    """Kill a driver at each point of ``schedule`` in turn (``delay``: after a random delay), with more
    input between lives, then run to completion: every record is in the table exactly once, the reader
    never saw a partial batch, every kill that left a record was rolled back, nothing is left over."""
    seed = int(os.environ.get("EO_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    with CoordinatorProcess(tmp_path / "coordinator", args=args) as coord:
        driver = Driver(tmp_path / "wrapped", "wrapped", coord.target, kafka_source)
        files = 2
        driver.publish(0, files)
        reader = Reader(committed_batches(driver.sink()))
        reader.start()
        kills: list[str] = []
        # "delay" in the schedule: a kill after a random delay from the query's start (the seed is in
        # every failure message).
        schedule = [f"delay:{rng.uniform(0.5, 6.0):.1f}" if k == "delay" else k for k in schedule]

        def boot_spec(index: int) -> str:
            """The pause of the life that kills at ``schedule[index]``: none for a delay, or past the
            schedule's end (the life that runs to completion)."""
            spec = schedule[index] if index < len(schedule) else ""
            return "" if spec.startswith("delay") else spec

        def boot(index: int) -> subprocess.Popen[bytes]:
            """That life's driver, booted as a standby."""
            return driver.start(pause=boot_spec(index), standby=True)

        standby = boot(0)
        try:
            while len(kills) < len(schedule):
                spec = schedule[len(kills)] if len(driver.lives) < 16 else ""
                assert spec, f"seed={seed}: only {len(kills)} kills landed: {kills}"
                driver.publish(files, 2)  # more input arrives between restarts
                files += 2
                proc = standby
                driver.go(proc)
                standby = boot(len(kills) + 1)  # boots while this life runs to its kill
                kind, _, arg = spec.partition(":")
                if kind == "delay":
                    time.sleep(float(arg))
                    if driver.kill(proc):
                        kills.append(spec)
                    else:  # it finished first: try another delay, on a driver that does not pause
                        schedule[len(kills)] = f"delay:{rng.uniform(0.5, 3.0):.1f}"
                        if boot_spec(len(kills) + 1):  # the standby would pause: one that does not
                            driver.kill(standby)
                            standby = boot(len(kills))
                    continue
                line = driver.wait_for(proc, lambda ln: ln.startswith("pause "))
                assert line is not None, f"seed={seed}: the driver finished before its pause point {spec}"
                assert driver.kill(proc)
                kills.append(f"{spec} (batch {line.split()[-1]})")
            driver.run_to_completion(standby)
        finally:
            if standby.poll() is None:
                driver.kill(standby)
            reader.done.set()
            reader.join(timeout=60)

        rollbacks = [ln for ln in driver.events.read_text().splitlines() if " rolled back " in ln]
        context = f"seed={seed} kills={kills} rollbacks={len(rollbacks)}"
        assert len(kills) == len(schedule), context
        expected = Counter(driver.input_ids())
        assert len(expected) == files * RECORDS_PER_FILE
        got = driver.table_ids()
        assert got == expected, (
            f"{context}: missing {sorted(expected - got)[:20]}, extra {sorted(got - expected)[:20]}"
        )
        assert reader.problems == [], context
        assert reader.snapshots > 10 and reader.most_batches >= 2, (reader.snapshots, reader.most_batches)

        # Every kill after a registered attempt left a record that the next life rolled back.
        must_roll_back = sum(k.startswith(LEAVES_A_RECORD) for k in kills)
        delays = sum(k.startswith("delay") for k in kills)
        assert len(rollbacks) >= must_roll_back - delays, context
        # Nothing uncommitted is left on disk once the last run rolled back and finished.
        sink = driver.sink()
        assert len(sink.committed_files()) == len(list(driver.table.glob("bucket=*/_w-*/part-*"))), context

        with CoordinatorClient(coord.target) as client:
            left = [p.producer_id for p in client.list_producer_offsets(page_size=1000).items]
        assert [p for p in left if p.startswith("eo-test.b")] == [], f"batch records left behind: {left}"


def zombie_then_reset(tmp_path: Path, kafka_source: KafkaBroker | None) -> None:
    """Two run changes on one table, sharing driver processes: a second driver on the checkpoint of
    a stalled one, then a reset of that checkpoint (which re-reads a topic from its earliest offsets)."""
    with CoordinatorProcess(tmp_path / "coordinator") as coord:
        driver = Driver(tmp_path / "zombie", "wrapped", coord.target, kafka_source)
        driver.publish(0, 4)
        release = tmp_path / "release-zombie"
        # The zombie passes its fence check for batch 1 and stalls just before its commit file...
        zombie = driver.start(pause="commit:2", release=release)
        takeover = driver.start(finish=False, standby=True)  # boots while the zombie runs
        reset = driver.start(standby=True)
        try:
            assert driver.wait_for(zombie, lambda ln: ln.startswith("pause ")) == "pause commit 1"
            epoch_line = next(ln for ln in driver.event_lines(zombie.pid) if ln.startswith("epoch "))
            zombie_epoch = int(epoch_line.split()[1])
            # ...while a second driver on the same checkpoint takes over and finishes everything
            # (stopping without finish(): its last record stays for the reset below).
            driver.run_to_completion(takeover)
            assert driver.table_ids() == Counter(driver.input_ids())
            # Now the zombie wakes up and commits batch 1 into the range the new driver fenced.
            release.touch()
            deadline = time.monotonic() + EVENT_TIMEOUT_S
            while zombie.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert zombie.poll() is not None, "the zombie driver did not stop after it was fenced"

            zombie_events = driver.event_lines(zombie.pid)
            assert zombie.returncode != 0, zombie_events  # its next step hit the fence and failed the query
            assert "released commit 1" in zombie_events
            # The new driver's fence took the number the zombie's late batch 1 was to take: the zombie's
            # create failed, so its only batch in the log is batch 0 (before the takeover).
            zombie_entries = [
                (c.kind, c.batch_id) for c in driver.sink()._commits() if c.epoch == zombie_epoch
            ]
            assert zombie_entries == [("fence", None), ("data", 0)], zombie_entries
            visible_epochs = [c.epoch for c in driver.sink().commits()]
            assert visible_epochs.count(zombie_epoch) == 1 and len(visible_epochs) == 4, visible_epochs
            assert driver.table_ids() == Counter(driver.input_ids())
            with CoordinatorClient(coord.target) as client:
                assert client.get_producer_offsets("eo-test.b3")

            # Reset: delete the checkpoint and start again under the same name and sink. The new query
            # re-reads every input file (a reset replays the source), and its batch 3 meets the old
            # run's record: stale, logged, never a reason to delete the old run's committed batches.
            shutil.rmtree(driver.checkpoint)
            driver.publish(4, 2)
            reset_pid = driver.run_to_completion(reset)
        finally:
            for proc in (zombie, takeover, reset):
                if proc.poll() is None:
                    driver.kill(proc)

    got = driver.table_ids()
    replayed = {i for i in driver.input_ids() if i < 4 * RECORDS_PER_FILE}
    # Nothing committed is lost; the duplicates of a reset are exactly the replayed files, once each.
    assert set(got) == set(driver.input_ids())
    assert {i for i, n in got.items() if n == 2} == replayed
    assert max(got.values()) == 2
    reset_events = driver.event_lines(reset_pid)
    assert "stale 3" in reset_events, reset_events
    assert not any(ln.startswith("rolled back") for ln in reset_events), reset_events
