"""The status-code table and the retry loop, without a network (a fake clock drives the backoff)."""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable

import grpc
import pytest

from snapcoord.client import (
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    RetryPolicy,
    SnapcoordError,
    SnapshotFenced,
    Unavailable,
)
from snapcoord.client._retry import IDEMPOTENT, NOT_RETRIED, call_with_retry
from snapcoord.client.errors import ERROR_BY_CODE, error_for_status


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


def test_fenced_only_for_report_task_snapshot() -> None:
    message = "generation 3 of app 'a' is fenced: the current generation is 5"
    fenced = error_for_status(grpc.StatusCode.FAILED_PRECONDITION, message, "ReportTaskSnapshot")
    assert isinstance(fenced, SnapshotFenced)
    assert fenced.current_generation == 5
    other = error_for_status(grpc.StatusCode.FAILED_PRECONDITION, message, "DeleteSnapshot")
    assert type(other) is FailedPrecondition
    unnamed = error_for_status(grpc.StatusCode.FAILED_PRECONDITION, "changed", "ReportTaskSnapshot")
    assert isinstance(unnamed, SnapshotFenced) and unnamed.current_generation is None


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
        ("ReportProgress", Unavailable("down")),  # not idempotent
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


def test_the_retry_tables_do_not_overlap() -> None:
    assert not set(IDEMPOTENT) & set(NOT_RETRIED)
    assert "ReportProgress" in NOT_RETRIED
