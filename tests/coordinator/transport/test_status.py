"""The one exception -> status code table, and the google.rpc.Status details built from it."""

from __future__ import annotations

import inspect

import grpc
import pytest

from snapcoord.coordinator import errors
from snapcoord.coordinator.errors import Reason
from snapcoord.coordinator.transport.status import (
    DOMAIN,
    ERROR_INFO_TYPE_URL,
    GENERIC_INTERNAL_MESSAGE,
    MAX_MESSAGE_CHARS,
    MAX_METADATA_VALUE_CHARS,
    Status,
    status_for,
    unimplemented,
)
from snapcoord.v1 import error_details_pb2

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
    errors.ResourceExhausted: C.RESOURCE_EXHAUSTED,
    errors.Unimplemented: C.UNIMPLEMENTED,
    errors.Unauthenticated: C.UNAUTHENTICATED,
    errors.PermissionDenied: C.PERMISSION_DENIED,
    errors.Internal: C.INTERNAL,
    errors.DataLoss: C.DATA_LOSS,
    errors.CorruptRecord: C.DATA_LOSS,
    errors.NewerFormat: C.FAILED_PRECONDITION,  # a sound record of a newer release: not data loss
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
    if cls is errors.CorruptRecord:
        return errors.CorruptRecord(message, kind="lease")
    if cls is errors.NewerFormat:
        return errors.NewerFormat(message, kind="lease", version=2, supported=1)
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


def decode(status: Status) -> tuple[error_details_pb2.Status, error_details_pb2.ErrorInfo]:
    ((key, value),) = status.trailing_metadata()
    assert key == "grpc-status-details-bin"
    rpc_status = error_details_pb2.Status.FromString(value)
    (detail,) = rpc_status.details
    assert detail.type_url == ERROR_INFO_TYPE_URL
    return rpc_status, error_details_pb2.ErrorInfo.FromString(detail.value)


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_details_repeat_code_and_message_and_carry_the_default_reason(
    cls: type[errors.SnapcoordError],
) -> None:
    exc = make(cls, f"details of {cls.__name__}")
    status = status_for(exc)
    rpc_status, info = decode(status)
    assert (rpc_status.code, rpc_status.message) == (EXPECTED[cls].value[0], status.message)
    assert info.domain == DOMAIN
    assert info.reason == exc.reason == status.reason
    if isinstance(exc, errors.TransactionFailed):  # takes its cause's reason
        assert info.reason == exc.cause.reason == Reason.CONTENDED
    else:
        assert info.reason == cls.default_reason
    # A corrupt record always names its kind (and its path, once the reader knows it).
    # A newer-format record also names its format version and the newest this coordinator reads.
    expected: dict[str, str] = {}
    if cls is errors.CorruptRecord:
        expected = {"kind": "lease"}
    elif cls is errors.NewerFormat:
        expected = {"kind": "lease", "format_version": "2", "supported_format_version": "1"}
    assert dict(info.metadata) == expected


def test_a_raise_sites_reason_and_metadata_travel_as_strings() -> None:
    exc = errors.FailedPrecondition(
        "generation 3 is fenced",
        reason=Reason.SNAPSHOT_FENCED,
        metadata={"app_id": "a", "generation": 3, "current_generation": 5},
    )
    _, info = decode(status_for(exc))
    assert info.reason == "SNAPSHOT_FENCED"
    assert dict(info.metadata) == {"app_id": "a", "generation": "3", "current_generation": "5"}


def test_an_unexpected_exception_has_reason_internal_and_nothing_else() -> None:
    status = status_for(ValueError("secret path /etc/x"))
    rpc_status, info = decode(status)
    assert (info.reason, dict(info.metadata)) == ("INTERNAL", {})
    assert rpc_status.message == GENERIC_INTERNAL_MESSAGE
    assert b"secret" not in status.details_bin()


def test_an_instance_made_without_init_still_maps() -> None:
    status = status_for(errors.NotFound.__new__(errors.NotFound))
    assert (status.code, status.reason) == (C.NOT_FOUND, "NOT_FOUND")


def test_unimplemented_has_its_reason() -> None:
    rpc_status, info = decode(unimplemented("X is not implemented"))
    assert (rpc_status.code, info.reason) == (C.UNIMPLEMENTED.value[0], "UNIMPLEMENTED")


def test_reasons_are_stable_upper_snake_names() -> None:
    for reason in Reason:
        assert reason.value == reason.name and reason.value.isupper(), reason


def test_huge_messages_and_metadata_are_clipped_to_fit_the_trailers() -> None:
    exc = errors.InvalidArgument("page_token " + "x" * 100_000, metadata={"field": "y" * 10_000})
    status = status_for(exc)
    assert len(status.message) == MAX_MESSAGE_CHARS
    assert status.message.startswith("page_token xxx") and status.message.endswith(
        "(100011 characters in all)"
    )
    assert len(status.metadata["field"]) == MAX_METADATA_VALUE_CHARS
    assert len(status.details_bin()) < 2 * MAX_MESSAGE_CHARS  # well below a client's 8 KiB
    assert status_for(errors.InvalidArgument("short")).message == "short"
