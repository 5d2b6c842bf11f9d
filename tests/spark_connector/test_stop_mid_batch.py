"""Stopping a Python ``foreachBatch`` query on PySpark 4.3.0 mid-batch kills the stream execution
thread with ``java.lang.StackOverflowError`` (see ``jobs/stop_mid_batch_job.py`` for why). The stop
still returns and the query reports no exception; the batch it cut is written to the sink but not
committed in Spark's checkpoint, the state a crash between the two leaves. ``exactly_once`` rolls that
attempt back when the batch runs again, so the table holds every record once.

``BacklogAwareRunner`` switches by the same ``query.stop()`` and reads ``query.exception()`` after
it: with no exception reported it starts the other trigger from the checkpoint, as after any stop
(a stop that ends in a reported failure is logged and restarted too: ``test_backlog_runner_stop``).

The driver is a process of its own so that the JVM's stderr, where the error is printed, is the
test's to read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess

pytestmark = [pytest.mark.spark, pytest.mark.process]

JOB = Path(__file__).parent / "jobs" / "stop_mid_batch_job.py"
FILES = 4


def test_a_stop_that_overflows_the_stream_thread_loses_and_repeats_nothing(
    tmp_path: Path, zk_coordinator: CoordinatorProcess
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for n in range(FILES):
        (source / f"in-{n}.json").write_text(
            "".join(f'{{"id": {10 * n + i}, "bucket": "b{i % 2}"}}\n' for i in range(4))
        )
    argv = [
        sys.executable, str(JOB), "--input", str(source), "--checkpoint", str(tmp_path / "cp"),
        "--table", str(tmp_path / "table"), "--target", zk_coordinator.target, "--stops", "2",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(lines[-1])
    assert "java.lang.StackOverflowError" in proc.stderr, "no stop overflowed the stream thread"
    assert all(not stop["active"] for stop in result["stops"])
    assert result["final_exception"] == "None"
    assert result["ids"] == sorted(10 * n + i for n in range(FILES) for i in range(4))
