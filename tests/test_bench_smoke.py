"""The benchmark runs: ``bench/hot_rpcs.py --smoke`` once, every row briefly, so that it cannot rot.

No timing is asserted (the machine is shared and noisy): only that every row of the performance
table was measured and printed, against its raw bound and against etcd.
"""

from __future__ import annotations

import re

import pytest

from harness.benchmarks import run_bench

pytestmark = pytest.mark.process

ROWS = (
    "RegisterProducerOffsets (10 offsets)",
    "GetProducerOffsets",
    "CreateSnapshot (4 tasks)",
    "ReportTaskSnapshot, 1 KiB checkpoint",
    "ReportTaskSnapshot, 1 MiB checkpoint",
    "GetCurrentSnapshot consistent=false (cached)",
    "GetCurrentSnapshot consistent=true",
    "GetCurrentSnapshot cached vs consistent, during reports",
    "GetSnapshot, 4 tasks x 1 KiB",
    "AcquireSnapshots(1) + RenewLease",
    "lease acquire + renew, no snapshots",
    "lease acquire + renew vs etcd grant + keepalive",
    "ReportProgress, 100 partitions",
    "ClaimCommit, a new number",
)


def _hot_rpcs(*args: str) -> str:
    return run_bench("hot_rpcs", "--smoke", *args)


def test_hot_rpcs_benchmark_smoke_prints_every_figure() -> None:
    stdout = _hot_rpcs()
    summary = stdout.split("## summary", 1)[1]
    for row in ROWS:
        line = next((x for x in summary.splitlines() if x.startswith(row + " ")), None)
        assert line is not None, f"{row!r} missing from the summary:\n{summary}"
        # c=1 and c=2 against one process, c=2 against --processes 2
        assert line[len(row) :].count("(") == 3, f"{row!r} lacks a ratio in a column: {line}"
    # The coordinator runs in its own process: its ZooKeeper requests are counted by ZooKeeper,
    # and a row with a storage bound has a ceiling (raw bound plus gRPC round trips) below 1.
    measured = stdout.split("## summary", 1)[0]
    line = next(x for x in measured.splitlines() if x.startswith("GetProducerOffsets "))
    ceiling, ours_req, raw_req = re.search(r" (\d\.\d\d) +(\d+\.\d)/(\d+\.\d) ", line).groups()  # type: ignore[union-attr]
    assert float(ours_req) >= 1.0 and float(raw_req) == 1.0, line
    assert 0 < float(ceiling) < 1, line
    for row in (
        "GetProducerOffsets, 2 processes",
        "lease acquire + renew, 2 processes",
        "lease acquire + renew, 2 processes vs etcd",
    ):
        assert any(x.startswith(row + " ") for x in summary.splitlines()), f"{row!r} missing:\n{summary}"
    scale = stdout.split("## scale:", 1)[1]
    for figure in ("janitor pass 1:", "janitor pass 2:", "server start to SERVING:"):
        assert figure in scale, f"{figure!r} missing:\n{scale}"
    completion = stdout.split("## completing one snapshot", 1)[1]
    assert any(x.split()[:1] == ["10"] for x in completion.splitlines()), completion


def test_hot_rpcs_only_runs_the_rows_it_names() -> None:
    stdout = _hot_rpcs("--only", "PROGRESS", "--processes", "1", "--no-etcd")
    summary = stdout.split("## summary", 1)[1].splitlines()[2:]
    assert [x.split(",")[0] for x in summary if x.strip()] == ["ReportProgress"], summary
    assert "## scale:" not in stdout and "## completing one snapshot" not in stdout
