"""``snapcoord serve --processes N``: N worker processes share the gRPC port (SO_REUSEPORT), each
with its own ZooKeeper session; one serving line; SIGTERM drains them all."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from harness.coordinator import CoordinatorProcess
from harness.process import wait_until
from snapcoord.coordinator.config import settings
from snapcoord.coordinator.config.environment import embedded_store_warnings
from snapcoord.coordinator.server.app import run
from snapcoord.coordinator.server.cpus import usable_cpus
from snapcoord.coordinator.server.processes import process_count
from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc

PRODUCER_SERVICE = producer_pb2.DESCRIPTOR.services_by_name["ProducerOffsetService"].full_name


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        found |= {int(x) for x in text.split()}
    return found


def _scrape(metrics_url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        text = r.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def _handled(samples: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    """ProducerOffsetService calls in grpc_server_handled_total."""
    return sum(
        v
        for labels, v in samples.get("grpc_server_handled_total", [])
        if labels.get("grpc_service") == PRODUCER_SERVICE
    )


def _handled_in(counter_file: Path) -> float:
    """ProducerOffsetService calls one worker counted, from its own multiprocess file."""
    merged: list[Metric] = list(MultiProcessCollector.merge([str(counter_file)]))  # type: ignore[no-untyped-call]
    return sum(
        float(s.value)
        for m in merged
        for s in m.samples
        if s.name == "grpc_server_handled_total" and s.labels.get("grpc_service") == PRODUCER_SERVICE
    )


def _janitor_leader(metrics_url: str) -> float | None:
    found = _scrape(metrics_url).get("snapcoord_janitor_leader", [])
    return max((v for _, v in found), default=None)


def _stale_counts(directory: Path) -> None:
    """What a crashed earlier run leaves: 1000 ProducerOffsetService calls in a counter file."""
    script = (
        "from prometheus_client import CollectorRegistry\n"
        "from snapcoord.coordinator.observability.metrics import GrpcServerMetrics\n"
        "m = GrpcServerMetrics(CollectorRegistry())\n"
        f"labels = ('unary', '{PRODUCER_SERVICE}', 'GetProducerOffsets', 'OK')\n"
        "m.handled.labels(*labels).inc(1000)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    assert list(directory.glob("counter_*.db"))


def test_two_processes_share_the_port_and_one_metrics_endpoint(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> None:
    """Calls spread over both workers are all counted on the one --metrics-port; one janitor
    leader shows there, whichever worker holds it; SIGTERM drains both and removes the files."""
    temp = tmp_path / "tmp"  # where the supervisor's metrics directory goes (TMPDIR)
    temp.mkdir()
    # An operator's leftover PROMETHEUS_MULTIPROC_DIR with counts in it: never read.
    stale = tmp_path / "stale"
    stale.mkdir()
    _stale_counts(stale)
    env = {"TMPDIR": str(temp), "PROMETHEUS_MULTIPROC_DIR": str(stale)}
    args = ["--processes", "2", "--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    with CoordinatorProcess(tmp_path, args=args, env=env, start_timeout_s=180) as proc:
        assert proc.stdout_lines() == [proc.serving_line]  # one line for the set, one metrics port
        workers = _children(proc._proc.pid)  # type: ignore[union-attr]
        assert len(workers) >= 2, workers  # (the multiprocessing resource tracker may be a third)
        wait_until(lambda: "serving with 2 processes" in proc.stderr_text(), timeout=30, what="the log line")
        served = proc.stderr_text().split("serving with 2 processes", 1)[1].splitlines()[0]
        assert served.count("metrics=disabled") == 2, served  # the workers serve none of their own
        worker_pids = set(map(int, re.findall(r"\[worker (\d+)\]", proc.stderr_text())))
        assert len(worker_pids) == 2 and worker_pids <= workers
        [directory] = temp.glob("snapcoord-metrics-*")
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
        # Both workers served some of the calls (each one's own file, read as the library does) ...
        per_worker = {pid: _handled_in(directory / f"counter_{pid}.db") for pid in worker_pids}
        assert all(n > 0 for n in per_worker.values()), per_worker
        # ... and the one endpoint counts all 32, none of the stale 1000.
        assert _handled(_scrape(proc.metrics_url)) == 32
        # One janitor leader among the workers, seen on that endpoint (the election takes a moment).
        wait_until(lambda: _janitor_leader(proc.metrics_url) == 1, timeout=120, what="a janitor leader")
        rss = {labels["process"] for labels, _ in _scrape(proc.metrics_url)["process_resident_memory_bytes"]}
        assert rss == {"supervisor", "worker-0", "worker-1"}
        assert proc.terminate() == 0
    # Every worker (and multiprocessing's helper) is gone with the supervisor, and so are the files.
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), timeout=30, what="workers gone"
    )
    assert list(temp.iterdir()) == []
    assert list(stale.glob("counter_*.db"))  # the operator's directory is not ours to remove


def test_more_than_one_process_needs_zookeeper(tmp_path: Path) -> None:
    """Refused as a config error (check-config says so too), and by run for a config built otherwise."""
    embedded = {"processes": "2", "data_dir": str(tmp_path / "data")}
    with pytest.raises(settings.ConfigError, match="--processes=2 needs ZooKeeper metadata"):
        settings.load(embedded, {})
    cfg = settings.load({"data_dir": str(tmp_path / "data")}, {})
    cfg = replace(cfg, grpc=replace(cfg.grpc, processes=2))
    with pytest.raises(ValueError, match="--processes=2 needs ZooKeeper metadata"):
        run(cfg)
    assert not (tmp_path / "data").exists()  # refused before opening anything


def test_a_dead_worker_stops_the_set_with_exit_1(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    """A worker killed outright: the supervisor stops the other and fails, so that whatever
    supervises it restarts the whole set instead of it serving on fewer processes unnoticed; the
    metrics directory goes with it (a restart starts from a new one)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    args = ["--processes", "2", "--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    with CoordinatorProcess(tmp_path, args=args, env={"TMPDIR": str(temp)}, start_timeout_s=180) as proc:
        workers = _children(proc._proc.pid)  # type: ignore[union-attr]
        wait_until(lambda: "serving with 2 processes" in proc.stderr_text(), timeout=30, what="the log line")
        [directory] = temp.glob("snapcoord-metrics-*")
        served = re.findall(r"\[worker (\d+)\]", proc.stderr_text())
        victim = int(served[0])
        assert victim in workers
        assert (directory / f"gauge_livemax_{victim}.db").exists()
        os.kill(victim, signal.SIGKILL)
        assert proc.wait_exit(timeout_s=120) == 1
        assert "exited (code -9): stopping the others" in proc.stderr_text()
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), timeout=60, what="workers gone"
    )
    assert list(temp.iterdir()) == []


def test_a_taken_metrics_port_fails_the_start_before_any_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor binds --metrics-port first: a taken one is refused at once, naming it, with
    no worker started and no metrics directory left behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    children = _children(os.getpid())  # (the harness's servers, if running)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = settings.load(
            {
                "processes": "2",
                "metadata": "zk://127.0.0.1:1/unused",
                "host": "127.0.0.1",
                "metrics_port": str(port),
            },
            {},
        )
        with pytest.raises(OSError, match=f"cannot bind metrics to 127.0.0.1:{port}"):
            run(cfg)
    assert _children(os.getpid()) == children
    assert list(tmp_path.iterdir()) == []


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
    caplog.set_level(logging.INFO, logger="snapcoord.coordinator.server.processes")
    cpus = usable_cpus()
    assert process_count(settings.load({**zk, "processes": "auto"}, {})) == cpus.count
    assert f"--processes auto: {cpus}" in caplog.text
    assert process_count(settings.load({**zk, "processes": "3"}, {})) == 3
    assert process_count(settings.load({"processes": "1", "data_dir": str(tmp_path)}, {})) == 1


def test_auto_with_embedded_metadata_is_one_process_and_says_why(tmp_path: Path) -> None:
    cfg = settings.load({"processes": "auto", "data_dir": str(tmp_path / "data")}, {})
    assert process_count(cfg) == 1
    (warning,) = embedded_store_warnings(cfg.storage.metadata_uri, cfg.storage.blobs_uri, "auto", {})
    assert warning.startswith("--processes auto runs 1 process: the embedded metadata store serves one")
    # ... whereas an explicit count is still refused, not quietly lowered.
    with pytest.raises(ValueError, match="--processes=2 needs ZooKeeper metadata"):
        process_count(replace(cfg, grpc=replace(cfg.grpc, processes=2)))


@pytest.mark.process
def test_serve_with_auto_on_embedded_metadata_serves_from_one_process(tmp_path: Path) -> None:
    """SNAPCOORD_PROCESSES=auto (the environment's way) on the embedded store: a plain coordinator,
    no supervisor and no workers, whatever the machine's CPUs."""
    args = ["--data-dir", str(tmp_path / "data")]
    with CoordinatorProcess(tmp_path, args=args, env={"SNAPCOORD_PROCESSES": "auto"}) as proc:
        assert proc.stdout_lines() == [proc.serving_line]
        assert _children(proc.pid) == set()
        log = proc.stderr_text()
        assert "WARNING snapcoord: --processes auto runs 1 process: the embedded metadata store" in log
        assert "serving with" not in log
        assert '"processes": 1' in log  # the effective config logs the resolved count
        _register_one(proc.target)
        assert proc.terminate() == 0


def test_serve_with_auto_on_zookeeper_starts_one_worker_per_usable_cpu(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> None:
    """The count is this machine's (computed here by the same function, not hard-coded): one
    worker per usable CPU, each serving, one serving line (naming the one metrics port)."""
    expected = usable_cpus().count
    args = ["--processes", "auto", "--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    with CoordinatorProcess(tmp_path, args=args, start_timeout_s=60 + 60 * expected) as proc:
        assert proc.stdout_lines() == [proc.serving_line]
        assert f"--processes auto: {expected} (CPU affinity" in proc.stderr_text()
        if expected > 1:
            serving = f"serving with {expected} processes"
            wait_until(lambda: serving in proc.stderr_text(), timeout=30, what="the log line")
            after = proc.stderr_text().split(serving, 1)[1].splitlines()[0]
            assert after.count("metrics=disabled") == expected  # one endpoint, the supervisor's
            workers = set(map(int, re.findall(r"\[worker (\d+)\]", proc.stderr_text())))
            assert len(workers) == expected
            assert workers <= _children(proc.pid)
        else:  # a one-CPU machine: the plain coordinator
            assert "serving with" not in proc.stderr_text()
            assert _children(proc.pid) == set()
        _register_one(proc.target)
        assert _handled(_scrape(proc.metrics_url)) == 1  # whichever process served it
        assert proc.terminate() == 0


def test_json_logs_of_two_processes_are_json_lines_from_each(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> None:
    """With --log-format json the workers log JSON too (their stderr is the supervisor's, whose
    reader passes JSON lines through): every line on stdout and stderr parses, the serving line
    included, and the set's one metrics endpoint reports the build once."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    args = ["--processes", "2", "--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    env = {"TMPDIR": str(temp), "SNAPCOORD_LOG_FORMAT": "json"}
    with CoordinatorProcess(tmp_path, args=args, env=env, start_timeout_s=180) as proc:
        _register_one(proc.target)
        build = _scrape(proc.metrics_url)["snapcoord_build_info"]
        assert [(labels["revision"], value) for labels, value in build] == [("unknown", 1.0)], build
        assert proc.terminate() == 0
    (serving,) = [json.loads(line) for line in proc.stdout_lines()]
    assert serving["grpc"] == f"127.0.0.1:{proc.grpc_port}"
    assert serving["metrics"] == f"127.0.0.1:{proc.metrics_port}"
    lines = []
    for line in proc.stderr_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}\n{proc.tails()}") from None
    pids = {obj["pid"] for obj in lines}
    assert len(pids) >= 3, pids  # the supervisor and both workers
    assert any(obj["message"].startswith("serving with 2 processes") for obj in lines)
