"""Logs: the JSON format (one object per line), ``auto``'s choice, and the per-RPC line's fields,
checked on a real ``snapcoord serve`` on ZooKeeper + S3 by parsing every line it wrote."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, NotFound, Offset, TaskSnapshot
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
