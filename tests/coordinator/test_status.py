"""The one exception -> status code table."""

from __future__ import annotations

import inspect

import grpc
import pytest

from snapcoord.coordinator import errors
from snapcoord.coordinator.status import GENERIC_INTERNAL_MESSAGE, status_for

C = grpc.StatusCode

# Every exception class in errors.py and the code a caller must see for it. A new class in
# errors.py fails test_every_error_class_has_an_expected_code until it is added here.
EXPECTED: dict[type[errors.SnapcoordError], grpc.StatusCode] = {
    errors.SnapcoordError: C.INTERNAL,
    errors.InvalidArgument: C.INVALID_ARGUMENT,
    errors.NotFound: C.NOT_FOUND,
    errors.AlreadyExists: C.ALREADY_EXISTS,
    errors.FailedPrecondition: C.FAILED_PRECONDITION,
    errors.Aborted: C.ABORTED,
    errors.Unavailable: C.UNAVAILABLE,
    errors.Unimplemented: C.UNIMPLEMENTED,
    errors.Internal: C.INTERNAL,
    errors.NodeExistsError: C.ALREADY_EXISTS,
    errors.NoNodeError: C.NOT_FOUND,
    errors.BadVersionError: C.ABORTED,
    errors.NotEmptyError: C.FAILED_PRECONDITION,
    errors.TransactionFailed: C.ABORTED,
    errors.BlobNotFound: C.NOT_FOUND,
    errors.StoreUnavailable: C.UNAVAILABLE,
    errors.CommitOutcomeUnknown: C.UNAVAILABLE,
}


def make(cls: type[errors.SnapcoordError], message: str) -> errors.SnapcoordError:
    """An instance of ``cls`` (TransactionFailed needs its extra arguments)."""
    if cls is errors.TransactionFailed:
        return errors.TransactionFailed(message, index=1, cause=errors.BadVersionError("v"))
    return cls(message)


def test_every_error_class_has_an_expected_code() -> None:
    defined = {
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj) and issubclass(obj, errors.SnapcoordError)
    }
    assert defined == set(EXPECTED)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_code_and_message(cls: type[errors.SnapcoordError]) -> None:
    status = status_for(make(cls, f"details of {cls.__name__}"))
    assert status.code == EXPECTED[cls]
    assert status.message == f"details of {cls.__name__}"


def test_a_new_subclass_inherits_its_outcome() -> None:
    class LeaseExpired(errors.NotFound):
        pass

    class Fenced(errors.FailedPrecondition, KeyError):
        pass

    assert status_for(LeaseExpired("gone")).code == C.NOT_FOUND
    assert status_for(Fenced("generation 3 < 4")).code == C.FAILED_PRECONDITION


def test_only_bugs_are_unexpected() -> None:
    assert not status_for(errors.NotFound("x")).unexpected
    assert not status_for(errors.StoreUnavailable("zk down")).unexpected
    assert status_for(errors.Internal("broken invariant")).unexpected
    assert status_for(errors.SnapcoordError("no outcome")).unexpected


@pytest.mark.parametrize(
    "exc", [ValueError("secret path /etc/x"), KeyError("k"), RuntimeError(), ZeroDivisionError()]
)
def test_unknown_exceptions_are_internal_without_details(exc: Exception) -> None:
    status = status_for(exc)
    assert status.code == C.INTERNAL
    assert status.message == GENERIC_INTERNAL_MESSAGE
    assert status.unexpected


def test_empty_message_falls_back_to_the_code_name() -> None:
    assert status_for(errors.NotFound()).message == "NOT_FOUND"
