"""Logs: the JSON format (one object per line), ``auto``'s choice, and the per-RPC line's fields,
checked on a real ``snapcoord serve`` on ZooKeeper + S3 by parsing every line it wrote."""

from __future__ import annotations

import io
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.access import TEAM_A_TOKEN, principals, write_auth_file
from harness.coordinator import CoordinatorProcess, snapcoord_command
from snapcoord.client import CoordinatorClient, NotFound, Offset, PermissionDenied, TaskSnapshot
from snapcoord.coordinator import __version__
from snapcoord.coordinator.observability import logging_setup
from snapcoord.coordinator.transport import call_log
from snapcoord.v1 import common_pb2, lease_pb2, producer_pb2, snapshot_pb2

# -- the formatter ------------------------------------------------------------------------------


def _record(message: str, *args: object, **extra: Any) -> logging.LogRecord:
    record = logging.getLogger("snapcoord.test").makeRecord(
        "snapcoord.test", logging.WARNING, __file__, 1, message, args, None, extra=extra
    )
    return record


def test_a_json_line_has_the_base_fields_and_lifts_only_known_extras() -> None:
    line = logging_setup.JsonFormatter().format(
        _record("two\nlines %s", "here", method="snapcoord.v1.X/Y", app_id="a1", color="blue")
    )
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "two\nlines here"
    assert out["level"] == "WARNING"
    assert out["logger"] == "snapcoord.test"
    assert out["pid"] == os.getpid()
    assert out["time"].endswith("Z") and out["time"][10] == "T"
    assert out["method"] == "snapcoord.v1.X/Y" and out["app_id"] == "a1"
    assert "color" not in out  # not a structured field: a library's attributes never leak


def test_a_json_line_carries_the_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.getLogger("t").makeRecord(
            "t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    out = json.loads(logging_setup.JsonFormatter().format(record))
    assert "RuntimeError: boom" in out["exception"] and "Traceback" in out["exception"]


def test_auto_is_text_on_a_terminal_and_json_elsewhere(tmp_path: Path) -> None:
    controller, terminal = os.openpty()
    try:
        with os.fdopen(terminal, "w", closefd=False) as tty:
            assert logging_setup.resolve_format("auto", tty) == "text"
            assert logging_setup.resolve_format("json", tty) == "json"
    finally:
        os.close(controller)
        os.close(terminal)
    with (tmp_path / "log").open("w") as file:
        assert logging_setup.resolve_format("auto", file) == "json"
        assert logging_setup.resolve_format("text", file) == "text"
    assert logging_setup.resolve_format("auto", io.StringIO()) == "json"


# -- which ids a request names ------------------------------------------------------------------


def test_request_ids_come_from_id_fields_only() -> None:
    report = snapshot_pb2.ReportTaskSnapshotRequest(
        app_id="app-1",
        generation=7,
        task=snapshot_pb2.TaskSnapshot(
            task_id="t-3",
            committed_offsets=[common_pb2.Offset(stream="orders", partition=0, offset=42)],
            checkpoints={"state": b"SECRET-CHECKPOINT"},
        ),
    )
    assert call_log.request_ids(report) == {"app_id": "app-1", "generation": 7, "task_id": "t-3"}
    register = producer_pb2.RegisterProducerOffsetsRequest(
        producer_id="p-1", offsets=[common_pb2.Offset(stream="s", partition=1, offset=9)], ttl_ms=5
    )
    assert call_log.request_ids(register) == {"producer_id": "p-1"}
    # A list of snapshots is not one id: only the lease is named.
    acquire = lease_pb2.AcquireSnapshotsRequest(
        lease_id="l-1", snapshots=[common_pb2.SnapshotRef(app_id="x", generation=1)]
    )
    assert call_log.request_ids(acquire) == {"lease_id": "l-1"}
    assert call_log.request_ids(b"raw bytes") == {}


def test_an_oversized_request_id_is_recorded_as_its_prefix_and_length() -> None:
    huge = "abc" + "x" * (4 * 1024 * 1024 - 3)
    ids = call_log.request_ids(snapshot_pb2.CreateSnapshotRequest(app_id=huge))
    assert ids == {"app_id": f"abc{'x' * 61}…(4194304 chars)"}
    longest = "y" * call_log.MAX_RECORDED_ID_CHARS
    assert call_log.request_ids(lease_pb2.GetLeaseRequest(lease_id=longest)) == {"lease_id": longest}
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("snapcoord.rpc")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        call_log.log_finished("m", grpc.StatusCode.INVALID_ARGUMENT, 0.001, ids)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    line = stream.getvalue()
    assert "app_id=abcx" in line and "(4194304 chars)" in line and len(line) < 200


def test_the_level_follows_who_has_to_act() -> None:
    assert call_log.level_for(grpc.StatusCode.OK) == logging.DEBUG
    assert call_log.level_for(grpc.StatusCode.NOT_FOUND) == logging.INFO
    assert call_log.level_for(grpc.StatusCode.INVALID_ARGUMENT) == logging.INFO
    assert call_log.level_for(grpc.StatusCode.UNAVAILABLE) == logging.WARNING
    assert call_log.level_for(grpc.StatusCode.INTERNAL) == logging.WARNING


# -- a real server ------------------------------------------------------------------------------

TOKEN = "tok-DO-NOT-LOG-4f2a"


def _json_lines(proc: CoordinatorProcess) -> list[dict[str, Any]]:
    text = proc.stderr_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, proc.tails()
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}\n{proc.tails()}") from None
    for obj in parsed:
        assert {"time", "level", "logger", "message", "pid"} <= obj.keys(), obj
    return parsed


def _rpc_lines(lines: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
    return [obj for obj in lines if obj["logger"] == "snapcoord.rpc" and obj.get("method") == method]


def test_json_logs_of_a_real_server_on_zookeeper_and_s3(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri, "--log-format", "json", "--log-level", "DEBUG"]
    with CoordinatorProcess(tmp_path, args=args) as proc:
        with CoordinatorClient(proc.target, token=TOKEN) as client:
            client.register_producer_offsets("prod-1", [Offset("orders", 0, 987654321)])
            with pytest.raises(NotFound):
                client.get_producer_offsets("prod-missing")
            snapshot = client.create_snapshot("app-9", ["t1"])
            client.report_task_snapshot(
                "app-9",
                snapshot.generation,
                TaskSnapshot("t1", (Offset("orders", 0, 5),), {"store": b"CHECKPOINT-PAYLOAD-77"}),
            )
        assert proc.terminate() == 0
    lines = _json_lines(proc)
    pids = {obj["pid"] for obj in lines}
    assert len(pids) == 1

    (register,) = _rpc_lines(lines, "snapcoord.v1.ProducerOffsetService/RegisterProducerOffsets")
    assert register["code"] == "OK" and register["level"] == "DEBUG"
    assert register["producer_id"] == "prod-1"
    assert isinstance(register["latency_ms"], float) and register["latency_ms"] >= 0
    assert "trace_id" not in register  # tracing is off

    (missing,) = _rpc_lines(lines, "snapcoord.v1.ProducerOffsetService/GetProducerOffsets")
    assert missing["code"] == "NOT_FOUND" and missing["level"] == "INFO"
    assert missing["producer_id"] == "prod-missing"

    (create,) = _rpc_lines(lines, "snapcoord.v1.SnapshotService/CreateSnapshot")
    assert create["app_id"] == "app-9" and "generation" not in create  # the request names none

    (report,) = _rpc_lines(lines, "snapcoord.v1.SnapshotService/ReportTaskSnapshot")
    assert report["code"] == "OK"
    assert (report["app_id"], report["generation"], report["task_id"]) == ("app-9", snapshot.generation, "t1")

    stopped = [obj for obj in lines if obj["message"] == "stopped"]
    assert stopped and stopped[0]["level"] == "INFO"
    # Never payloads or secrets: not the bearer token, not an offset, not a checkpoint.
    text = proc.stderr_text()
    for secret in (TOKEN, "987654321", "CHECKPOINT-PAYLOAD-77", "Q0hFQ0tQT0lOVC1QQVlMT0FELTc3"):
        assert secret not in text


@pytest.mark.process
def test_auto_writes_json_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    """No flag: the default (an empty variable counts as unset) is auto, and stderr is a file."""
    with CoordinatorProcess(tmp_path, env={"SNAPCOORD_LOG_FORMAT": ""}) as proc:
        with CoordinatorClient(proc.target) as client, pytest.raises(NotFound):
            client.get_lease("no-such-lease")
        assert proc.terminate() == 0
    lines = _json_lines(proc)
    (missing,) = _rpc_lines(lines, "snapcoord.v1.LeaseService/GetLease")
    assert missing["lease_id"] == "no-such-lease" and missing["code"] == "NOT_FOUND"
    starting = [obj for obj in lines if obj["message"].startswith("snapcoord ")]
    assert '"shutdown_grace_ms": 10000' in starting[0]["message"]  # the effective config, intact


@pytest.mark.process
def test_text_logs_name_the_call_too(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path, args=["--log-format", "text"]) as proc:
        with CoordinatorClient(proc.target) as client, pytest.raises(NotFound):
            client.get_lease("lease-x")
        assert proc.terminate() == 0
    text = proc.stderr_text()
    assert "INFO snapcoord.rpc: snapcoord.v1.LeaseService/GetLease NOT_FOUND " in text
    assert "lease_id=lease-x" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


# -- JSON mode: nothing but JSON lines ----------------------------------------------------------


def _every_line_json(text: str, what: str) -> list[dict[str, Any]]:
    parsed = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"{what}: not a JSON line: {line!r}\n{text}") from None
        assert isinstance(obj, dict), line
        parsed.append(obj)
    return parsed


@pytest.mark.process
def test_json_mode_prints_only_json_lines_with_the_audit_record_as_fields(tmp_path: Path) -> None:
    """A config file asks for JSON (the harness's SNAPCOORD_LOG_FORMAT=text is emptied, so the
    file's value applies); an allowed and a denied call leave audit lines; every line on stdout
    and stderr is a JSON object, and the metrics say which build runs."""
    auth = write_auth_file(tmp_path / "auth.json", principals())
    config = tmp_path / "snapcoord.yaml"
    config.write_text(f"log-format: json\nauth-file: {auth}\nshutdown-grace: 5s\n")
    env = {"SNAPCOORD_LOG_FORMAT": "", "SNAPCOORD_REVISION": "0123abc"}
    with CoordinatorProcess(tmp_path, args=["--config", str(config)], env=env) as proc:
        with CoordinatorClient(proc.target, token=TEAM_A_TOKEN) as client:
            client.register_producer_offsets("team-a-p1", [Offset("orders", 0, 7)])
            with pytest.raises(PermissionDenied):
                client.delete_producer_offsets("team-b-p1")
        with urllib.request.urlopen(proc.metrics_url, timeout=30) as r:
            metrics = r.read().decode()
        assert proc.terminate() == 0

    (serving,) = _every_line_json("\n".join(proc.stdout_lines()), "stdout")
    assert serving["message"] == (
        f"snapcoord serving grpc=127.0.0.1:{proc.grpc_port} metrics=127.0.0.1:{proc.metrics_port}"
    )
    assert (serving["grpc"], serving["level"]) == (f"127.0.0.1:{proc.grpc_port}", "INFO")

    lines = _every_line_json(proc.stderr_text(), "stderr")
    audit = [obj for obj in lines if obj["logger"] == "snapcoord.audit"]
    by_code = {obj["code"]: obj for obj in audit}
    assert set(by_code) == {"OK", "PERMISSION_DENIED"}, audit
    denied = by_code["PERMISSION_DENIED"]
    assert denied["audit"] == "rpc" and denied["principal"] == "team-a-driver"
    assert denied["method"] == "snapcoord.v1.ProducerOffsetService/DeleteProducerOffsets"
    assert denied["ids"] == {"producer_id": ["team-b-p1"]}
    assert isinstance(denied["latency_ms"], float | int) and denied["peer"].startswith("ipv")
    assert not denied["message"].startswith("{")  # the record is the line's fields, not a string
    assert by_code["OK"]["ids"] == {"producer_id": ["team-a-p1"]}
    assert TEAM_A_TOKEN not in proc.stderr_text()
    starting = next(obj for obj in lines if obj["message"].startswith("snapcoord "))
    assert '"shutdown_grace_ms": 5000' in starting["message"]  # from the file

    (build,) = [line for line in metrics.splitlines() if line.startswith("snapcoord_build_info{")]
    assert f'version="{__version__}"' in build and 'revision="0123abc"' in build
    assert f'python="{platform.python_version()}"' in build and build.endswith(" 1.0")


@pytest.mark.process
def test_json_mode_turns_grpcs_own_bind_error_into_json_lines(tmp_path: Path) -> None:
    """gRPC's C core writes "Failed to add port to server" straight to the stderr descriptor; in
    JSON mode it is read back and logged as a JSON line, next to the coordinator's own error."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [
            *snapcoord_command(), "serve", "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", "-1", "--data-dir", str(tmp_path / "data"), "--log-format", "json",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("SNAPCOORD_")}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = _every_line_json(done.stderr, "stderr")
    errors = [obj["message"] for obj in lines if obj["level"] == "ERROR"]
    assert any(f"cannot bind gRPC to 127.0.0.1:{port}" in m for m in errors), lines
    native = [obj for obj in lines if obj["logger"] == logging_setup.STDERR_LOGGER]
    assert any("Failed to add port" in obj["message"] and obj["level"] == "ERROR" for obj in native), lines
