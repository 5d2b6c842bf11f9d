"""Every other benchmark of ``bench/`` runs once with small sizes, so that none can rot unseen.

``test_bench_smoke.py`` covers ``hot_rpcs`` (the performance table), ``test_bench_upload_smoke.py``
``upload_checkpoint`` and ``tests/failures/test_soak.py`` the soak. No timing is asserted (the
machine is shared and noisy): each run must exit 0 and print its last figure. Long modes (the
default sizes, ``leases``' expiry lag, which waits out a 60 s janitor interval) stay outside CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.benchmarks import BENCH, run_bench

#: (script, arguments, a line its last figure prints)
SMALL = [
    ("access_control", (), "RegisterProducerOffsets, mTLS + auth file"),
    ("backlog_progress", (), "ReportProgress 10 of 10000 (gRPC)"),
    ("backlog_grow", ("--n", "2"), "MarkBacklog reset, 9900"),
    ("cpu_per_call", ("--calls", "20", "--rounds", "1"), "RenewLease"),
    ("combine", ("--seconds", "0.3", "--clients", "1,4"), "combined / raw kazoo"),
    ("leases", ("--n", "5", "--expiry-samples", "0"), "AcquireSnapshots, 100 snapshot(s)"),
    ("producer_offsets", ("--n", "20"), "GetProducerOffsets (gRPC)"),
    ("snapshots", ("--n", "10", "--tasks", "4"), "per report ms"),
    ("storage_overhead", ("--n", "20"), "LocalBlobStore.get 256 B"),
    ("stream_checkpoints", ("--mb", "1", "--tasks", "2"), "out: ReadCheckpoint"),
    ("latency", ("--smoke",), "| exactly_once, per batch |"),
    ("middleware_floor", ("--smoke",), "| GetCurrentSnapshot, cached, admission on / off | 16 |"),
    ("scale_out", ("--smoke",), "| 2 replicas |"),
    # Against this same checkout: the run proves the side-by-side machinery, not a difference.
    ("compare_versions", ("--other", str(BENCH.parent), "--seconds", "0.2", "--rounds", "1",
                          "--only", "GetProducerOffsets"), "GetProducerOffsets"),
]  # fmt: skip

#: The Spark benchmarks' own --smoke modes (a local PySpark driver, or a Spark Connect server).
SPARK = [
    ("spark_snapshot_restore", " s | ok |"),  # a row is printed only once the restored query resumed
    ("spark_backlog", "stops that interrupted a batch"),
    ("spark_wrapper_overhead", "health check, 0.5 s apart"),
    ("spark_storage_throughput", "every copy read back byte-identical: ok"),
    ("spark_sink_remote", "exactly_once's own time per batch"),
    ("spark_savepoint_s3a", "the restored query resumed from the snapshot's state: ok"),
    # In bench/.venv-delta (Delta Lake's Spark): the Delta row proves all three sinks ran.
    ("spark_sink_s3a", "| 1,000 | delta |"),
]

#: Benchmarks that have their smoke test elsewhere.
ELSEWHERE = {"hot_rpcs", "upload_checkpoint", "soak", "random_faults"}

#: Modules of ``bench/`` that are not benchmarks: shared plumbing, and the delay proxy that
#: ``latency`` starts.
NOT_BENCHMARKS = {"common", "delay_proxy"}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.stem for p in Path(BENCH).glob("*.py")} - NOT_BENCHMARKS
    covered = {s for s, _, _ in SMALL} | {s for s, _ in SPARK} | ELSEWHERE
    assert scripts == covered, f"benchmarks without a smoke run: {sorted(scripts - covered)}"


@pytest.mark.parametrize(("script", "args", "last"), SMALL, ids=[s for s, _, _ in SMALL])
@pytest.mark.process
def test_benchmark_runs_with_small_sizes(script: str, args: tuple[str, ...], last: str) -> None:
    stdout = run_bench(script, *args, timeout_s=900)
    assert last in stdout, f"{last!r} missing from bench/{script}.py's output:\n{stdout[-4000:]}"


@pytest.mark.spark
@pytest.mark.parametrize(("script", "last"), SPARK, ids=[s for s, _ in SPARK])
def test_spark_benchmark_smoke(script: str, last: str) -> None:
    stdout = run_bench(script, "--smoke", timeout_s=1200)
    assert last in stdout, f"{last!r} missing from bench/{script}.py's output:\n{stdout[-4000:]}"
