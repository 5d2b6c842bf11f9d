"""The exactly-once runs of ``harness.eo_driver`` for Spark's built-in file sink: drivers of the job in
``--mode filesink`` (``writeStream.format("json").option("path", table)``, no ``foreachBatch``), killed
inside a write and after a random delay, a zombie, and a checkpoint reset, all on one table.

Spark's file sink is exactly-once by itself: entry ``N`` of the table's sink log (``_spark_metadata``)
is batch ``N``'s commit, created only if absent, and a batch at or below the log's latest is skipped.
Every Spark reader reads the files the log lists. So what a kill can leave, the part files of a write
that never reached the log, no reader sees; a re-run batch is skipped or written once; a zombie's late
entry is refused. The runs check that on the table as a reader sees it (``visible_ids``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlparse

from harness.eo_driver import EVENT_TIMEOUT_S, RECORDS_PER_FILE, Batches, Driver, Reader
from harness.kafka import KafkaBroker
from snapcoord.spark_connector.sink.spark_sink_log import SinkLogError, SparkSinkLog
from snapcoord.spark_connector.storage.local import LocalStorage


def visible_batches(table: Path) -> Batches:
    """The ids in every file the table's sink log lists now, as one batch (what every Spark reader of
    the table reads at the log's latest batch)."""
    ids: list[int] = []
    log = SparkSinkLog(LocalStorage(table))
    try:
        files = log.files_at()
    except SinkLogError as e:  # an entry listed a moment ago is gone: only a log cleanup does that
        raise FileNotFoundError(str(e)) from e
    for f in files:
        text = Path(unquote(urlparse(f.path).path)).read_text(encoding="utf-8")
        ids += [int(json.loads(line)["id"]) for line in text.splitlines() if line]
    return [(f"log at {log.latest_batch_id()}", ids)] if ids else []


def visible_ids(table: Path) -> Counter[int]:
    return Counter(i for _, ids in visible_batches(table) for i in ids)


def file_sink_kills_zombie_and_reset(tmp_path: Path, kafka: KafkaBroker) -> None:
    """Four lives of a query from a topic into Spark's file sink, then a reset: killed inside batch 1's
    write, killed after a random delay, a zombie stalled inside batch 5's write while a fourth driver
    takes over and drains the topic, then a reset of the checkpoint. The table shows every record once
    at every moment; the zombie's late batch is refused; the reset's replayed batches are skipped."""
    seed = int(os.environ.get("EO_SEED", random.randrange(1 << 30)))
    delay = random.Random(seed).uniform(0.5, 6.0)
    driver = Driver(tmp_path / "filesink", "filesink", kafka=kafka)
    reader = Reader(lambda: visible_batches(driver.table))
    reader.start()
    release = tmp_path / "release-zombie"
    driver.publish(0, 2)
    # Batch k is input file k: all of a life's records are in the topic before it starts, and ten a
    # batch split five and five over the two partitions.
    first = driver.start(pause=f"record:{1 * RECORDS_PER_FILE}")
    procs = [first, driver.start(standby=True)]
    try:
        assert driver.wait_for(first, lambda ln: ln.startswith("pause ")) == "pause record 10"
        assert driver.kill(first)
        assert visible_ids(driver.table) == Counter(range(RECORDS_PER_FILE))  # batch 0 only

        driver.publish(2, 2)
        driver.go(procs[1])
        zombie = driver.start(pause=f"record:{5 * RECORDS_PER_FILE}", release=release, standby=True)
        procs.append(zombie)
        time.sleep(delay)
        killed = driver.kill(procs[1])  # False: it drained the topic first

        driver.publish(4, 2)
        driver.go(zombie)
        takeover = driver.start(standby=True)
        reset = driver.start(standby=True)
        procs += [takeover, reset]
        assert driver.wait_for(zombie, lambda ln: ln.startswith("pause ")) == "pause record 50"
        driver.run_to_completion(takeover)
        drained = visible_ids(driver.table)
        assert drained == Counter(driver.input_ids()), f"seed={seed} killed={killed}"

        # The zombie's write of batch 5 ends; its sink log entry 5 exists already: the query fails.
        release.touch()
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while zombie.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert zombie.returncode == 1, driver.log_tail(zombie)
        failure = [ln for ln in driver.event_lines(zombie.pid) if ln.startswith("failed ")]
        assert failure and "batch 5" in failure[0], driver.event_lines(zombie.pid)
        assert visible_ids(driver.table) == drained

        # Reset: the new query re-reads the topic from its earliest offsets. Its batches 0-5 read the
        # records of the old run's batches 0-5 (ten a batch again), which the sink skips as committed.
        shutil.rmtree(driver.checkpoint)
        driver.publish(6, 2)
        driver.run_to_completion(reset)
    finally:
        for proc in procs:
            if proc.poll() is None:
                driver.kill(proc)
        reader.done.set()
        reader.join(timeout=60)

    context = f"seed={seed} delay={delay:.1f} killed={killed}"
    assert visible_ids(driver.table) == Counter(driver.input_ids()), context
    assert SparkSinkLog(LocalStorage(driver.table)).latest_batch_id() == 7, context
    assert reader.problems == [], context
    assert reader.snapshots > 10, (reader.snapshots, context)
