"""``snapcoord`` as operators run it: a real process, its serving line, health, SIGTERM, exit codes."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.coordinator import CoordinatorProcess, snapcoord_command
from snapcoord.coordinator import __version__, cli
from snapcoord.coordinator.config.options import OPTIONS
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.storage.backends import open_metadata_store
from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING_LINE = re.compile(r"snapcoord serving grpc=127\.0\.0\.1:(\d+) metrics=127\.0\.0\.1:(\d+)")


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*snapcoord_command(), *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


@pytest.mark.process
def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"snapcoord {__version__}"
    assert __version__ == (Path(__file__).resolve().parents[2] / "VERSION").read_text().strip()


def test_serve_help_lists_every_flag_with_env_and_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wide enough that argparse wraps no line: it may break one inside a hyphenated word
    # ("file://<data-" / "dir>"), which joining the lines back with spaces would not undo.
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for opt in OPTIONS:
        assert f"{opt.flag} {opt.metavar}" in text
        assert f"(env {opt.env}; default {opt.shown_default})" in text


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    assert "serve" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--port", "http"], {}, "--port='http'"),
        (["--shutdown-grace", "30"], {}, "--shutdown-grace='30'"),
        ([], {"SNAPCOORD_METRICS_PORT": "-5"}, "SNAPCOORD_METRICS_PORT='-5'"),
        ([], {"SNAPCOORD_METADATA": "mysql://db"}, "SNAPCOORD_METADATA='mysql://db'"),
        (["--unknown-flag"], {}, "unrecognized arguments: --unknown-flag"),
        (["--lease-max-snapshots", "1000"], {}, "--lease-max-snapshots=1000 and --lease-max-holders=4"),
        (
            [],
            {"SNAPCOORD_METADTA": "zk://zk1:2181/sc"},
            "unknown environment variable SNAPCOORD_METADTA; did you mean SNAPCOORD_METADATA?",
        ),
        (["--config", "missing.yaml"], {}, "config file missing.yaml: cannot read it"),
    ],
)
@pytest.mark.process
def test_bad_values_exit_2_naming_the_setting(
    tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    result = run_cli("serve", *args, env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "snapcoord-data").exists()  # nothing was started


@pytest.mark.process
def test_serve_prints_the_ports_serves_and_drains_on_sigterm(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path, args=["--shutdown-grace", "1m"]) as proc:
        assert proc.stdout_lines() == [proc.serving_line]  # exactly one line on stdout
        assert proc.serving_line is not None
        m = SERVING_LINE.fullmatch(proc.serving_line)
        assert m is not None, proc.serving_line
        assert (int(m[1]), int(m[2])) == (proc.grpc_port, proc.metrics_port)
        print(f"\nstart-to-SERVING, embedded stores: {proc.serving_after_s:.2f}s")

        with grpc.insecure_channel(proc.target) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for service in ("", "snapcoord.v1.SnapshotService"):
                assert (
                    stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == SERVING
                )
            with urllib.request.urlopen(proc.metrics_url, timeout=10) as r:
                metrics = r.read().decode()
            assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="Check"' in metrics

            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=120)
            assert next(watch).status == SERVING
            proc.send_signal(signal.SIGTERM)
            assert next(watch).status == NOT_SERVING
            assert list(watch) == []  # the drain ends the watch instead of waiting out the grace
        assert proc.wait_exit(timeout_s=60) == 0

    log = proc.stderr_text()
    assert "SIGTERM: draining (grace 60.0s)" in log
    assert log.rstrip().endswith("stopped"), proc.tails()
    effective = json.loads(re.search(r"effective config: (\{.*\})", log)[1])  # type: ignore[index]
    assert effective["grpc"]["shutdown_grace_ms"] == 60_000
    assert (tmp_path / "data" / "metadata").is_dir()
    assert (tmp_path / "data" / "blobs").is_dir()


def test_a_drained_server_deletes_the_upload_intents_it_made_ahead(
    tmp_path: Path, zk_uri: str, s3_uri: str
) -> None:
    """Registrations take upload intents from a pool made in batches; the drain deletes the ones no
    registration used, instead of leaving them to the orphan sweep."""

    def pooled() -> list[str]:
        return [n for b in metadata.children(intents.ROOT) for n in metadata.children(f"{intents.ROOT}/{b}")]

    metadata = open_metadata_store(zk_uri)
    try:
        # Offsets in S3 (none inline in their records): each registration takes an upload intent.
        args = ["--metadata", zk_uri, "--blobs", s3_uri, "--producer-inline-max-bytes", "0"]
        with CoordinatorProcess(tmp_path, args=args) as proc:
            with grpc.insecure_channel(proc.target) as ch:
                stub = producer_pb2_grpc.ProducerOffsetServiceStub(ch)
                for i in range(4):  # batches of 1, 2 and 4: three left unused
                    offsets = [common_pb2.Offset(stream="s", partition=0, offset=i)]
                    request = producer_pb2.RegisterProducerOffsetsRequest(
                        producer_id=f"p{i}", offsets=offsets
                    )
                    assert stub.RegisterProducerOffsets(request, timeout=30).registered
            assert pooled(), "the pool holds intents no registration used yet"
            assert proc.terminate() == 0
        assert pooled() == []
        assert metadata.children("/producers/records") == ["p0", "p1", "p2", "p3"]
    finally:
        metadata.close()


@pytest.mark.process
def test_serve_without_metrics(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path, args=["--metrics-port", "-1"]) as proc:
        assert proc.serving_line is not None
        assert proc.serving_line.endswith(" metrics=disabled")
        assert proc.metrics_port is None
        assert proc.terminate() == 0


@pytest.mark.process
def test_sigint_also_exits_0(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path) as proc:
        proc.send_signal(signal.SIGINT)
        assert proc.wait_exit(timeout_s=60) == 0
    assert "SIGINT: draining" in proc.stderr_text()


@pytest.mark.parametrize(("flag", "what"), [("--port", "gRPC"), ("--metrics-port", "metrics")])
@pytest.mark.process
def test_a_taken_port_exits_1_with_a_clear_message(tmp_path: Path, flag: str, what: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        ports = {"--port": "0", "--metrics-port": "0", flag: str(port)}
        result = run_cli(
            "serve", "--host", "127.0.0.1", *(x for kv in ports.items() for x in kv),
            "--data-dir", str(tmp_path / "data"),
        )  # fmt: skip
    assert result.returncode == 1
    assert f"cannot bind {what} to 127.0.0.1:{port}" in result.stderr
    assert result.stdout == ""


def test_a_missing_bucket_fails_the_start_with_a_clear_message(tmp_path: Path, s3_server: object) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:12]}"
    result = run_cli(
        "serve", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "-1",
        "--data-dir", str(tmp_path / "data"), "--blobs", f"s3://{bucket}/snapcoord",
    )  # fmt: skip
    assert result.returncode == 1
    assert f"bucket {bucket} does not exist" in result.stderr
    assert result.stdout == ""  # never announced itself as serving


def test_serve_on_zookeeper_and_s3(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    """The production configuration, on real servers (s3_server exports AWS_* for boto3's chain)."""
    args = ["--metadata", zk_uri, "--blobs", s3_uri, "--zk-connect-timeout", "30s"]
    with CoordinatorProcess(tmp_path, args=args) as proc:
        print(f"\nstart-to-SERVING, ZooKeeper + S3: {proc.serving_after_s:.2f}s")
        assert proc.health("snapcoord.v1.LeaseService") == SERVING
        with grpc.insecure_channel(proc.target) as ch, pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/snapcoord.v1.LeaseService/GetLease")(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # served: an empty lease_id
        assert proc.terminate() == 0
    log = proc.stderr_text()
    assert zk_uri in log  # the effective config names the stores
    assert "stopped" in log
    assert not (tmp_path / "data").exists()  # nothing embedded was opened


# --- check-config and the config file ---------------------------------------------------------------


@pytest.mark.process
def test_check_config_prints_each_setting_where_it_came_from_and_no_secret(tmp_path: Path) -> None:
    config = tmp_path / "snapcoord.yaml"
    config.write_text("metadata: zk://snapcoord:s3cr3t@zk1:2181/sc\nmax-workers: 8\nport: 7000\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "SNAPCOORD_SHUTDOWN_GRACE": "30s",
        "SNAPCOORD_PORT": "6500",
        "SNAPCOORD_TOKEN": "a-client-token",  # the client's variable: not refused
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    }
    result = run_cli("check-config", "--config", str(config), "--port", "6000", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    settings_part, memory_part = result.stdout.split("# memory, derived", 1)
    rows = {line.split()[0]: line.split(None, 1)[1] for line in settings_part.splitlines()[1:]}
    assert set(rows) == {opt.flag for opt in OPTIONS}
    # Then the derived memory bounds, ending with the worst case (default budget, 256 calls).
    derived = memory_part.splitlines()[1:]
    assert derived[0] == "#   receive limit (--max-inline-payload + envelope): 8388608 bytes (8.0 MiB)"
    worst = 128 * 2**20 + 2**30 + 2 * 3 * 8 * 2**20 + 256 * 4 * 2**20
    assert (
        derived[-2]
        == f"#   worst case per process (payload budget + headroom): {worst} bytes ({worst / 2**20:.1f} MiB)"
    )
    assert rows["--port"] == "6000  (flag)"
    assert rows["--shutdown-grace"] == "30s  (environment SNAPCOORD_SHUTDOWN_GRACE)"
    assert rows["--max-workers"] == "8  (file)"
    assert rows["--metadata"] == "zk://snapcoord:***@zk1:2181/sc  (file)"
    assert rows["--host"] == "0.0.0.0  (default)"
    assert rows["--tls-cert"] == "(none)  (default)"
    assert rows["--blobs"] == f"{(tmp_path / 'snapcoord-data' / 'blobs').as_uri()}  (derived)"
    assert "s3cr3t" not in result.stdout + result.stderr
    # The blobs stay embedded under Kubernetes: said on stderr, not refused.
    assert "warning: running under Kubernetes on the embedded store (--blobs file://...)" in result.stderr
    assert list(tmp_path.iterdir()) == [config]  # nothing was opened or created


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("max_workers: 8\n", "line 1: unknown key 'max_workers'; did you mean max-workers?"),
        ("port: 1\nport: 2\n", "line 2: port is given twice"),
        ("payload-budget: [1GiB]\n", "payload-budget must be a single value"),
        ("payload-budget: 1G\n", "invalid payload-budget: '1G' in "),
        # One request message at the receive limit (4 MiB + 4 MiB envelope, 3 copies) never fits.
        (
            "payload-budget: 16MiB\n",
            "--payload-budget (16777216 bytes) is less than one request message at the receive limit",
        ),
    ],
)
@pytest.mark.process
def test_check_config_and_serve_refuse_a_bad_file_with_exit_2(
    tmp_path: Path, text: str, expected: str
) -> None:
    config = tmp_path / "snapcoord.yaml"
    config.write_text(text)
    env = {"PATH": "/usr/bin:/bin", "SNAPCOORD_CONFIG": str(config)}  # the variable names the file too
    for command in ("check-config", "serve"):
        result = run_cli(command, env=env, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        assert expected in result.stderr, (command, result.stderr)
        assert result.stdout == ""
    assert list(tmp_path.iterdir()) == [config]
