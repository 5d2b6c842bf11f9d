"""Malformed request bytes on every RPC: INVALID_ARGUMENT naming the RPC and type, never INTERNAL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from snapcoord.coordinator import api
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2

_FILES = (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2)
#: (full method, request type full name) for every RPC of every snapcoord.v1 service.
METHODS = [
    (f"/{service.full_name}/{method.name}", method.input_type.full_name)
    for module in _FILES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]
#: Bytes no protobuf message accepts: an end-group tag without a start, field number 0, a
#: truncated length-delimited field, a varint that never ends, invalid UTF-8 in field 1 when it
#: is a string (and a wrong wire type when it is not).
MALFORMED = [b"\x0c", b"\x00\x01", b"\x0a\x05ab", b"\x08" + b"\xff" * 11, b"\x0a\x02\xc3\x28"]


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCoordinator]:
    with embedded_deps(Path(tmp_path_factory.mktemp("decoding"))) as deps, serve_in_process(deps) as c:
        yield c


@pytest.fixture(scope="module")
def channel(coordinator: InProcessCoordinator) -> Iterator[grpc.Channel]:
    with coordinator.channel() as ch:
        yield ch


def test_every_rpc_of_every_service_is_covered() -> None:
    assert len(METHODS) == 28
    assert {m.split("/")[1] for m, _ in METHODS} == set(api.SERVICE_NAMES)


@pytest.mark.parametrize(("method", "type_name"), METHODS, ids=[m.rsplit("/", 1)[1] for m, _ in METHODS])
def test_malformed_bytes_are_invalid_argument(channel: grpc.Channel, method: str, type_name: str) -> None:
    call = channel.unary_unary(method)  # no serializers: the bytes go out as they are
    for body in MALFORMED:
        if body == b"\x0a\x02\xc3\x28" and not _field_one_is_string(type_name):
            continue  # field 1 is not a string there: the bytes may be a valid message
        with pytest.raises(grpc.RpcError) as raised:
            call(body, timeout=30)
        error = raised.value
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, (method, body, error.details())
        details = error.details() or ""
        assert method.lstrip("/") in details and type_name in details, details
        assert f"({len(body)} bytes)" in details


@pytest.mark.parametrize(("method", "type_name"), METHODS[:3], ids=[m for m, _ in METHODS[:3]])
def test_a_valid_empty_request_still_reaches_the_handler(
    channel: grpc.Channel, method: str, type_name: str
) -> None:
    """The guard changes nothing for good bytes: an empty body decodes to the default message,
    which the handler then judges (INVALID_ARGUMENT for a missing id, naming the field)."""
    with pytest.raises(grpc.RpcError) as raised:
        channel.unary_unary(method)(b"", timeout=30)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a valid" not in (raised.value.details() or "")


def _field_one_is_string(type_name: str) -> bool:
    for module in _FILES:
        message = module.DESCRIPTOR.message_types_by_name.get(type_name.rsplit(".", 1)[1])
        if message is not None:
            field = message.fields_by_number.get(1)
            return field is not None and field.type == field.TYPE_STRING
    raise AssertionError(f"unknown type {type_name}")
