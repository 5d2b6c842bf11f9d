"""The status-code and reason tables, the details decoder and the retry loop, without a network
(a fake clock drives the backoff). test_error_details.py has the round trips through a server."""

from __future__ import annotations

import itertools
import pickle
import re
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from snapcoord.client import (
    CorruptRecord,
    DeadlineExceeded,
    Expired,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    LeaseHeld,
    NewerFormat,
    NotFound,
    RetryPolicy,
    SnapcoordError,
    SnapshotFenced,
    SnapshotInProgress,
    TableFenced,
    Unavailable,
    Unimplemented,
    Unsupported,
)
from snapcoord.client._retry import IDEMPOTENT, NOT_RETRIED, RETRIED_LEVELS, call_with_retry
from snapcoord.client.errors import (
    DETAILS_KEY,
    DOMAIN,
    ERROR_BY_CODE,
    ERROR_BY_REASON,
    INTRODUCED_IN,
    error_for_status,
    error_info,
)
from snapcoord.v1 import error_details_pb2

ROOT = Path(__file__).resolve().parents[2]
FP = grpc.StatusCode.FAILED_PRECONDITION


def test_every_status_code_but_ok_maps_to_a_class_that_keeps_code_and_details() -> None:
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        assert code in ERROR_BY_CODE, code
        error = error_for_status(code, f"details of {code.name}", "GetLease")
        assert isinstance(error, SnapcoordError)
        assert (error.code, error.details, error.method) == (code.name, f"details of {code.name}", "GetLease")
    assert type(error_for_status(grpc.StatusCode.OUT_OF_RANGE, "x")) is InvalidArgument
    assert type(error_for_status(grpc.StatusCode.UNKNOWN, "x")) is Internal


@pytest.mark.parametrize(
    ("reason", "code", "cls"),
    [
        ("SNAPSHOT_FENCED", FP, SnapshotFenced),
        ("SNAPSHOT_NOT_CREATED", FP, SnapshotFenced),
        ("REPORT_CONFLICT", FP, SnapshotFenced),
        ("LEASE_HELD", FP, LeaseHeld),
        ("SNAPSHOT_IN_PROGRESS", FP, SnapshotInProgress),
        ("EXPIRED", grpc.StatusCode.NOT_FOUND, Expired),
        ("CORRUPT_RECORD", grpc.StatusCode.DATA_LOSS, CorruptRecord),
        ("NEWER_FORMAT", grpc.StatusCode.FAILED_PRECONDITION, NewerFormat),
        ("TABLE_FENCED", FP, TableFenced),
    ],
)
def test_the_reason_picks_a_subclass_of_the_codes_class(
    reason: str, code: grpc.StatusCode, cls: type[SnapcoordError]
) -> None:
    error = error_for_status(code, "msg", "AnyRpc", reason=reason, metadata={"app_id": "a"})
    assert type(error) is cls
    assert isinstance(error, ERROR_BY_CODE[code])
    assert (error.reason, error.metadata, error.code) == (reason, {"app_id": "a"}, code.name)
    assert ERROR_BY_REASON[reason] is cls


def test_fenced_current_generation_comes_from_metadata_not_the_message() -> None:
    fenced = error_for_status(
        FP, "the current generation is 9", reason="SNAPSHOT_FENCED", metadata={"current_generation": "5"}
    )
    assert isinstance(fenced, SnapshotFenced) and fenced.current_generation == 5
    unnamed = error_for_status(FP, "the current generation is 9", reason="REPORT_CONFLICT")
    assert isinstance(unnamed, SnapshotFenced) and unnamed.current_generation is None
    # Without details the message is not parsed: a plain FailedPrecondition, as ERROR_BY_CODE says.
    bare = error_for_status(FP, "generation 3 is fenced: the current generation is 5", "ReportTaskSnapshot")
    assert type(bare) is FailedPrecondition
    assert (bare.reason, bare.metadata) == (None, {})


def test_table_fenced_fence_epoch_comes_from_metadata() -> None:
    fenced = error_for_status(
        FP, "fenced at 9", "ClaimCommit", reason="TABLE_FENCED", metadata={"fence_epoch": "7"}
    )
    assert isinstance(fenced, TableFenced) and isinstance(fenced, FailedPrecondition)
    assert fenced.fence_epoch == 7
    copy = pickle.loads(pickle.dumps(fenced))
    assert type(copy) is TableFenced and copy.fence_epoch == 7
    assert error_for_status(FP, "x", "FenceTable", reason="TABLE_FENCED").fence_epoch is None  # type: ignore[attr-defined]


def test_unimplemented_names_the_release_an_rpc_needs() -> None:
    assert set(INTRODUCED_IN) == {"FenceTable", "ClaimCommit", "GetCommitClaims"}
    for rpc, version in INTRODUCED_IN.items():
        error = error_for_status(grpc.StatusCode.UNIMPLEMENTED, "Method not found!", rpc)
        assert type(error) is Unsupported and isinstance(error, Unimplemented)
        assert error.required_version == version == "0.4.0"
        assert f"snapcoord {version} or newer" in str(error) and "Method not found!" in str(error)
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is Unsupported and copy.required_version == version
    # An RPC of the first release keeps the plain class: the server lacks it for another reason.
    assert type(error_for_status(grpc.StatusCode.UNIMPLEMENTED, "x", "GetLease")) is Unimplemented
    # Only UNIMPLEMENTED means "older coordinator".
    assert type(error_for_status(grpc.StatusCode.NOT_FOUND, "x", "ClaimCommit")) is NotFound


def test_a_reason_never_changes_the_kind_of_error() -> None:
    # LEASE_HELD's class is a FailedPrecondition: with another code the code's class wins.
    odd = error_for_status(grpc.StatusCode.NOT_FOUND, "x", reason="LEASE_HELD")
    assert type(odd) is NotFound and odd.reason == "LEASE_HELD"
    # A reason this client does not know (a newer server) is kept, on the code's class.
    new = error_for_status(grpc.StatusCode.INVALID_ARGUMENT, "x", reason="SOMETHING_NEW", metadata={"k": "v"})
    assert type(new) is InvalidArgument and (new.reason, new.metadata) == ("SOMETHING_NEW", {"k": "v"})


def _trailer(*details: tuple[str, bytes], code: int = 9, message: str = "m") -> list[tuple[str, bytes]]:
    status = error_details_pb2.Status(code=code, message=message)
    for type_url, value in details:
        any_ = status.details.add()
        any_.type_url, any_.value = type_url, value
    return [("other-bin", b"\x00"), (DETAILS_KEY, status.SerializeToString())]


def _info(domain: str = DOMAIN) -> bytes:
    info = error_details_pb2.ErrorInfo(reason="LEASE_HELD", domain=domain, metadata={"generation": "2"})
    return info.SerializeToString()


def test_error_info_is_read_by_type_url_and_domain() -> None:
    info = error_info(_trailer(("type.googleapis.com/google.rpc.ErrorInfo", _info())))
    assert info is not None and (info.reason, dict(info.metadata)) == ("LEASE_HELD", {"generation": "2"})
    # Another detail first, then ours.
    retry_info = ("type.googleapis.com/google.rpc.RetryInfo", b"\x0a\x02\x08\x01")
    info = error_info(_trailer(retry_info, ("x/google.rpc.ErrorInfo", _info())))
    assert info is not None and info.reason == "LEASE_HELD"
    assert error_info(_trailer(("type.googleapis.com/google.rpc.ErrorInfo", _info("envoy.proxy")))) is None
    assert error_info(_trailer(("type.googleapis.com/google.rpc.DebugInfo", _info()))) is None
    assert error_info([(DETAILS_KEY, b"\xff\xff\xff garbage")]) is None
    assert error_info(None) is None and error_info(()) is None


def test_errors_pickle_with_their_attributes() -> None:
    error = error_for_status(grpc.StatusCode.NOT_FOUND, "no lease 'x'", "GetLease")
    error.attempts = 3
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is NotFound
    assert (copy.code, copy.details, copy.method, copy.attempts) == (
        "NOT_FOUND",
        "no lease 'x'",
        "GetLease",
        3,
    )
    assert str(copy) == str(error) == "NOT_FOUND: no lease 'x' (GetLease, 3 attempts)"

    fenced = error_for_status(FP, "fenced", "ReportTaskSnapshot", reason="SNAPSHOT_FENCED",
                              metadata={"current_generation": "4"})  # fmt: skip
    copy = pickle.loads(pickle.dumps(fenced))
    assert type(copy) is SnapshotFenced
    assert (copy.reason, copy.metadata, copy.current_generation) == ("SNAPSHOT_FENCED", fenced.metadata, 4)
    assert str(copy) == "FAILED_PRECONDITION [SNAPSHOT_FENCED]: fenced (ReportTaskSnapshot)"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _always(
    error: SnapcoordError, clock: FakeClock, cost_s: float = 0.01
) -> tuple[list[float], Callable[[float], object]]:
    timeouts: list[float] = []

    def attempt(remaining_s: float) -> object:
        timeouts.append(remaining_s)
        clock.now += cost_s
        raise error

    return timeouts, attempt


def test_idempotent_calls_retry_unavailable_until_the_deadline() -> None:
    clock = FakeClock()
    timeouts, attempt = _always(Unavailable("down"), clock)
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, multiplier=2.0, jitter=0.2)
    with pytest.raises(Unavailable) as e:
        call_with_retry(
            attempt, method="GetLease", policy=policy, timeout_s=5.0, clock=clock, sleep=clock.sleep
        )
    assert e.value.attempts == len(timeouts) > 3
    assert clock.now <= 100.0 + 5.0  # never past the deadline
    # Every attempt got the time left until the overall deadline as its own timeout.
    assert timeouts[0] == pytest.approx(5.0)
    assert all(a > b for a, b in itertools.pairwise(timeouts))
    # Exponential, capped, and jitter only shortens.
    for n, slept in enumerate(clock.sleeps):
        cap = min(1.0, 0.1 * 2**n)
        assert cap * 0.8 <= slept <= cap


def test_success_after_retries_returns_the_value() -> None:
    clock = FakeClock()
    results: list[object] = [Unavailable("down"), Unavailable("down"), "ok"]

    def attempt(remaining_s: float) -> str:
        item = results.pop(0)
        if isinstance(item, Exception):
            raise item
        return str(item)

    result = call_with_retry(
        attempt, method="GetSnapshot", policy=RetryPolicy(), timeout_s=5, clock=clock, sleep=clock.sleep
    )
    assert result == "ok"
    assert len(clock.sleeps) == 2


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("NotAnRpc", Unavailable("down")),  # not known to be idempotent
        ("GetLease", NotFound("gone")),  # not a transient status
        ("GetLease", DeadlineExceeded("slow")),  # the time budget is spent
    ],
)
def test_no_retry(method: str, error: SnapcoordError) -> None:
    clock = FakeClock()
    timeouts, attempt = _always(error, clock)
    with pytest.raises(type(error)) as e:
        call_with_retry(
            attempt, method=method, policy=RetryPolicy(), timeout_s=5, clock=clock, sleep=clock.sleep
        )
    assert e.value.attempts == 1 and len(timeouts) == 1 and clock.sleeps == []


def test_max_attempts() -> None:
    clock = FakeClock()
    timeouts, attempt = _always(Unavailable("down"), clock)
    with pytest.raises(Unavailable):
        call_with_retry(
            attempt,
            method="GetLease",
            policy=RetryPolicy(max_attempts=2),
            timeout_s=60,
            clock=clock,
            sleep=clock.sleep,
        )
    assert len(timeouts) == 2


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(multiplier=0.5)


def test_the_retry_tables_come_from_the_protos_idempotency_levels() -> None:
    assert not set(IDEMPOTENT) & set(NOT_RETRIED)
    assert NOT_RETRIED == {"UploadCheckpoint": "IDEMPOTENCY_UNKNOWN"}  # ReportProgress: report_id
    assert set(IDEMPOTENT.values()) <= RETRIED_LEVELS
    for rpc, level in IDEMPOTENT.items():  # reads are NO_SIDE_EFFECTS, and only reads
        assert (level == "NO_SIDE_EFFECTS") == rpc.startswith(("Get", "List", "Read")), rpc


def test_every_idempotent_rpc_says_why_in_the_proto() -> None:
    """The "why" lives next to the option: each IDEMPOTENT is preceded by a comment, and an RPC
    left without a level explains that too."""
    protos = sorted((ROOT / "proto" / "snapcoord" / "v1").glob("*.proto"))
    marked = 0
    for proto in protos:
        lines = proto.read_text().splitlines()
        for n, line in enumerate(lines):
            if line.strip() == "option idempotency_level = IDEMPOTENT;":
                marked += 1
                assert lines[n - 1].strip().startswith("//"), f"{proto.name}:{n + 1} has no comment above"
    assert marked == sum(level == "IDEMPOTENT" for level in IDEMPOTENT.values())
    backlog = (ROOT / "proto" / "snapcoord" / "v1" / "backlog.proto").read_text()
    assert re.search(r"rpc ReportProgress\(.*\n(\s*//.*\n)*.*same report_id", backlog)


def test_the_client_readme_retry_table_matches_the_proto() -> None:
    readme = (ROOT / "client" / "README.md").read_text()
    table = readme.split("| RPC | idempotency_level | retried | why |", 1)[1].split("\n\n", 1)[0]
    rpcs = set(IDEMPOTENT) | set(NOT_RETRIED)
    seen: set[str] = set()
    for row in table.strip().splitlines()[1:]:
        names, level, retried, _why = (cell.strip().strip("*`") for cell in row.strip("|").split("|"))
        for name in (n.strip() for n in names.removesuffix(" (all services)").split(",")):
            # "Get*, List*" stand for every RPC with that prefix.
            matched = {r for r in rpcs if r.startswith(name[:-1])} if name.endswith("*") else {name}
            assert matched and matched <= rpcs, name
            for rpc in matched:
                assert (retried == "yes") == (rpc in IDEMPOTENT), rpc
                assert level == IDEMPOTENT.get(rpc, "(none)"), rpc
            seen |= matched
    assert seen == rpcs
