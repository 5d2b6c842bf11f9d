"""``shared_metrics``: the metrics of several real processes on one endpoint (prometheus_client's
multiprocess mode), and what happens to them when a process dies and when the set stops."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from snapcoord.coordinator.config.settings import MetricsConfig
from snapcoord.coordinator.server.shared_metrics import MULTIPROC_DIR_ENV, SharedMetrics

# A process using the coordinator's own metric classes, as a worker does: it sets the janitor
# gauge to its first argument, counts one handled call, says "ready" and waits for stdin to close.
_PROCESS = """
import sys
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, GrpcServerMetrics, new_registry
registry = new_registry()
CoordinatorMetrics(registry).janitor_leader.set(float(sys.argv[1]))
GrpcServerMetrics(registry).handled.labels("unary", "S", "M", "OK").inc()
print("ready", flush=True)
sys.stdin.read()
"""

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def values(samples: Samples, name: str) -> list[float]:
    return [v for _, v in samples.get(name, [])]


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where mkdtemp puts the metrics directory, so that a test can see it come and go."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.delenv(MULTIPROC_DIR_ENV, raising=False)
    return path


@pytest.fixture
def shared(temp_dir: Path) -> Iterator[SharedMetrics]:
    metrics = SharedMetrics.start(MetricsConfig(host="127.0.0.1", port=0, tls_cert="", tls_key=""))
    try:
        yield metrics
    finally:
        metrics.close()


def start_process(leader: int) -> subprocess.Popen[str]:
    # Inherits os.environ, which SharedMetrics.start pointed at its directory: as a spawned worker.
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROCESS, str(leader)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.process
def test_one_endpoint_sums_counters_and_drops_a_dead_leader(shared: SharedMetrics, temp_dir: Path) -> None:
    assert os.environ[MULTIPROC_DIR_ENV] == shared.directory
    assert Path(shared.directory).parent == temp_dir
    leader, follower = start_process(1), start_process(0)
    try:
        shared.worker_started(0, leader.pid)
        shared.worker_started(1, follower.pid)
        before = scrape(shared.exporter.port)
        assert values(before, "grpc_server_handled_total") == [2.0]  # one per process, summed
        assert values(before, "snapcoord_janitor_leader") == [1.0]  # the max, not the sum or a series each
        rss = {labels["process"] for labels, _ in before["process_resident_memory_bytes"]}
        assert rss == {"supervisor", "worker-0", "worker-1"}
        assert "python_info" in before
        assert "python_gc_objects_collected_total" not in before  # the supervisor's own: left out

        leader.kill()
        leader.wait(timeout=30)
        # Until the supervisor reports the exit, the dead leader's 1 is still in its file:
        assert values(scrape(shared.exporter.port), "snapcoord_janitor_leader") == [1.0]
        shared.worker_exited(leader.pid)
        after = scrape(shared.exporter.port)
        assert values(after, "snapcoord_janitor_leader") == [0.0]  # the live follower's
        assert values(after, "grpc_server_handled_total") == [2.0]  # the dead one's calls still count
        rss = {labels["process"] for labels, _ in after["process_resident_memory_bytes"]}
        assert rss == {"supervisor", "worker-1"}
    finally:
        for proc in (leader, follower):
            proc.kill()
            proc.wait(timeout=30)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            proc.stdout.close()


@pytest.mark.process
def test_close_removes_the_directory_and_restores_the_environment(
    temp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MULTIPROC_DIR_ENV, "/an/operator/value")
    shared = SharedMetrics.start(MetricsConfig(host="127.0.0.1", port=0, tls_cert="", tls_key=""))
    assert os.environ[MULTIPROC_DIR_ENV] == shared.directory != "/an/operator/value"
    proc = start_process(0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.stdout.close()
    assert list(Path(shared.directory).glob("*.db"))  # the process wrote there
    shared.close()
    assert list(temp_dir.iterdir()) == []
    assert os.environ[MULTIPROC_DIR_ENV] == "/an/operator/value"
    # A second start gets a new, empty directory: nothing of the first run is counted again.
    again = SharedMetrics.start(MetricsConfig(host="127.0.0.1", port=0, tls_cert="", tls_key=""))
    try:
        assert again.directory != shared.directory
        assert "grpc_server_handled_total" not in scrape(again.exporter.port)
    finally:
        again.close()


def test_a_taken_port_fails_the_start_and_leaves_nothing_behind(temp_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot bind metrics to 127.0.0.1:{port}"):
            SharedMetrics.start(MetricsConfig(host="127.0.0.1", port=port, tls_cert="", tls_key=""))
    assert list(temp_dir.iterdir()) == []
    assert MULTIPROC_DIR_ENV not in os.environ


# A supervisor's SharedMetrics in a process of its own: prints its directory, closes on stdin EOF.
_SUPERVISOR = """
import sys
from snapcoord.coordinator.config.settings import MetricsConfig
from snapcoord.coordinator.server.shared_metrics import SharedMetrics
shared = SharedMetrics.start(MetricsConfig("127.0.0.1", 0, "", ""))
print(shared.directory, flush=True)
sys.stdin.read()
shared.close()
"""


def start_supervisor(temp_dir: Path) -> tuple[subprocess.Popen[str], Path]:
    env = {**os.environ, "TMPDIR": str(temp_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


@pytest.mark.process
def test_a_start_removes_what_a_killed_supervisor_left_and_nothing_live(temp_dir: Path) -> None:
    killed, abandoned = start_supervisor(temp_dir)
    live, kept = start_supervisor(temp_dir)
    starting = temp_dir / "snapcoord-metrics-starting"  # no lock file (yet): never removed
    starting.mkdir()
    other = temp_dir / "unrelated"
    other.mkdir()
    try:
        assert abandoned.parent == kept.parent == temp_dir
        assert (abandoned / "supervisor.lock").exists()
        killed.kill()  # no close(): its directory stays behind
        killed.wait(timeout=30)
        assert abandoned.is_dir()
        shared = SharedMetrics.start(MetricsConfig(host="127.0.0.1", port=0, tls_cert="", tls_key=""))
        try:
            assert not abandoned.exists()
            assert kept.is_dir() and (kept / "supervisor.lock").exists()  # its supervisor lives
            assert starting.is_dir() and other.is_dir()
            assert Path(shared.directory).is_dir()
        finally:
            shared.close()
        assert not Path(shared.directory).exists()
        assert live.stdin is not None
        live.stdin.close()  # the live one exits cleanly and removes its own
        assert live.wait(timeout=30) == 0
        assert not kept.exists()
        assert sorted(p.name for p in temp_dir.iterdir()) == ["snapcoord-metrics-starting", "unrelated"]
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
