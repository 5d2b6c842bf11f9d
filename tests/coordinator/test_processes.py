"""``snapcoord serve --processes N``: N worker processes share the gRPC port (SO_REUSEPORT), each
with its own ZooKeeper session; one serving line; SIGTERM drains them all."""

from __future__ import annotations

import logging
import os
import re
import signal
import urllib.request
from pathlib import Path

import grpc
import pytest

from harness.coordinator import CoordinatorProcess
from harness.process import wait_until
from snapcoord.coordinator import config, server
from snapcoord.coordinator.cpus import usable_cpus
from snapcoord.coordinator.processes import process_count
from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        found |= {int(x) for x in text.split()}
    return found


def _handled(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("grpc_server_handled_total{") and "ProducerOffsetService" in line
    )


def test_two_processes_share_the_port_and_drain_on_sigterm(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    args = ["--processes", "2", "--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    with CoordinatorProcess(tmp_path, args=args, start_timeout_s=180) as proc:
        assert proc.stdout_lines() == [proc.serving_line]  # one line for the set
        workers = _children(proc._proc.pid)  # type: ignore[union-attr]
        assert len(workers) >= 2, workers  # (the multiprocessing resource tracker may be a third)
        # Each worker has its own metrics port (--metrics-port 0: any free one), named in the log.
        wait_until(lambda: "serving with 2 processes" in proc.stderr_text(), timeout=30, what="the log line")
        metrics = re.findall(r"metrics=(127\.0\.0\.1:\d+)", proc.stderr_text().split("serving with 2", 1)[1])
        assert len(set(metrics[:2])) == 2, metrics
        offsets = [common_pb2.Offset(stream="s", partition=0, offset=7)]
        # The kernel spreads connections over the workers: with 16 connections, both get some.
        channels = [
            grpc.insecure_channel(proc.target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(16)
        ]
        try:
            for i, channel in enumerate(channels):
                stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
                request = producer_pb2.RegisterProducerOffsetsRequest(producer_id=f"p{i}", offsets=offsets)
                assert stub.RegisterProducerOffsets(request, timeout=60).registered
            for i, channel in enumerate(channels):  # each reads what another process may have written
                stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
                got = stub.GetProducerOffsets(
                    producer_pb2.GetProducerOffsetsRequest(producer_id=f"p{15 - i}")
                )
                assert list(got.offsets) == offsets
        finally:
            for channel in channels:
                channel.close()
        served = [_handled(f"http://{m}/metrics") for m in metrics[:2]]
        assert all(n > 0 for n in served), served
        assert sum(served) == 32
        assert proc.terminate() == 0
    # Every worker (and multiprocessing's helper) is gone with the supervisor.
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), timeout=30, what="workers gone"
    )


def test_more_than_one_process_needs_zookeeper(tmp_path: Path) -> None:
    cfg = config.load({"processes": "2", "data_dir": str(tmp_path / "data")}, {})
    with pytest.raises(ValueError, match="--processes=2 needs ZooKeeper metadata"):
        server.run(cfg)
    assert not (tmp_path / "data").exists()  # refused before opening anything


def test_a_dead_worker_stops_the_set_with_exit_1(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    """A worker killed outright: the supervisor stops the other and fails, so that whatever
    supervises it restarts the whole set instead of it serving on fewer processes unnoticed."""
    args = ["--processes", "2", "--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    with CoordinatorProcess(tmp_path, args=args, start_timeout_s=180) as proc:
        workers = _children(proc._proc.pid)  # type: ignore[union-attr]
        wait_until(lambda: "serving with 2 processes" in proc.stderr_text(), timeout=30, what="the log line")
        served = re.findall(r"\[worker (\d+)\]", proc.stderr_text())
        victim = int(served[0])
        assert victim in workers
        os.kill(victim, signal.SIGKILL)
        assert proc.wait_exit(timeout_s=120) == 1
        assert "exited (code -9): stopping the others" in proc.stderr_text()
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), timeout=60, what="workers gone"
    )


# --- --processes auto -----------------------------------------------------------------------------


def _register_one(target: str) -> None:
    """One write through the coordinator at ``target``: it serves, stores included."""
    with grpc.insecure_channel(target) as channel:
        stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
        offsets = [common_pb2.Offset(stream="s", partition=0, offset=3)]
        request = producer_pb2.RegisterProducerOffsetsRequest(producer_id="auto", offsets=offsets)
        assert stub.RegisterProducerOffsets(request, timeout=60).registered


def test_process_count_resolves_auto_and_keeps_an_explicit_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    zk = {"metadata": "zk://127.0.0.1:2181/x"}
    caplog.set_level(logging.INFO, logger="snapcoord.coordinator.processes")
    cpus = usable_cpus()
    assert process_count(config.load({**zk, "processes": "auto"}, {})) == cpus.count
    assert f"--processes auto: {cpus}" in caplog.text
    assert process_count(config.load({**zk, "processes": "3"}, {})) == 3
    assert process_count(config.load({"processes": "1", "data_dir": str(tmp_path)}, {})) == 1


def test_auto_with_embedded_metadata_is_one_process_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="snapcoord.coordinator.processes")
    cfg = config.load({"processes": "auto", "data_dir": str(tmp_path / "data")}, {})
    assert process_count(cfg) == 1
    assert "--processes auto: 1, as the embedded metadata store serves one process" in caplog.text
    # ... whereas an explicit count is still refused, not quietly lowered.
    with pytest.raises(ValueError, match="--processes=2 needs ZooKeeper metadata"):
        process_count(config.load({"processes": "2", "data_dir": str(tmp_path / "data")}, {}))


def test_serve_with_auto_on_embedded_metadata_serves_from_one_process(tmp_path: Path) -> None:
    """SNAPCOORD_PROCESSES=auto (the environment's way) on the embedded store: a plain coordinator,
    no supervisor and no workers, whatever the machine's CPUs."""
    args = ["--data-dir", str(tmp_path / "data")]
    with CoordinatorProcess(tmp_path, args=args, env={"SNAPCOORD_PROCESSES": "auto"}) as proc:
        assert proc.stdout_lines() == [proc.serving_line]
        assert _children(proc.pid) == set()
        log = proc.stderr_text()
        assert "--processes auto: 1, as the embedded metadata store serves one process" in log
        assert "serving with" not in log
        assert '"processes": 1' in log  # the effective config logs the resolved count
        _register_one(proc.target)
        assert proc.terminate() == 0


def test_serve_with_auto_on_zookeeper_starts_one_worker_per_usable_cpu(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> None:
    """The count is this machine's (computed here by the same function, not hard-coded): one
    worker per usable CPU, each serving (its own metrics port), one serving line."""
    expected = usable_cpus().count
    args = ["--processes", "auto", "--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    with CoordinatorProcess(tmp_path, args=args, start_timeout_s=60 + 60 * expected) as proc:
        assert proc.stdout_lines() == [proc.serving_line]
        assert f"--processes auto: {expected} (CPU affinity" in proc.stderr_text()
        if expected > 1:
            serving = f"serving with {expected} processes"
            wait_until(lambda: serving in proc.stderr_text(), timeout=30, what="the log line")
            after = proc.stderr_text().split(serving, 1)[1].splitlines()[0]
            assert len(set(re.findall(r"metrics=(127\.0\.0\.1:\d+)", after))) == expected
            workers = set(map(int, re.findall(r"\[worker (\d+)\]", proc.stderr_text())))
            assert len(workers) == expected
            assert workers <= _children(proc.pid)
        else:  # a one-CPU machine: the plain coordinator
            assert "serving with" not in proc.stderr_text()
            assert _children(proc.pid) == set()
        _register_one(proc.target)
        assert proc.terminate() == 0
