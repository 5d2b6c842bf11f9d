"""Property-based fuzzing of every RPC through a real channel against a real server.

Requests are generated from the protobuf descriptors, so a new field or RPC is fuzzed without
touching this file. Strings mix a small pool of valid identifiers (so calls reach existing records
and deep paths) with hostile text (empty, ``.``/``..``, non-ASCII, "²", over-long, a megabyte);
integers mix small values with the type's extremes. Properties:

- never INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED (a too-long error message) or UNAVAILABLE;
- every error message is short (it quotes input by prefix only);
- a call that fails leaves the stores exactly as they were (a dump of every metadata node with
  its version, and every blob key, before and after).

Examples per RPC: ``SNAPCOORD_FUZZ_EXAMPLES`` (default 25 on the embedded stores; a fifth of it,
at least 3, on ZooKeeper + S3). The long mode is the same test with a larger number, e.g.
``SNAPCOORD_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/coordinator/api/test_fuzz_rpcs.py``;
``SNAPCOORD_FUZZ_SEED`` unset there means random exploration (CI runs derandomized).

Sizes stay small (lists of at most 8, payloads of at most 64 bytes) so that many calls fit a
run; the server runs with small count limits (4 checkpoints per report, 4 snapshots per lease, 2
holders per snapshot, 1 KiB inline reads) so that the fuzzer reaches the count, size and
paging limits and their refusals. The largest legal sizes have their own tests
(``test_largest_requests``, ``test_worst_requests``, ``test_payload_memory``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from harness.coordinator import InProcessCoordinator, serve_in_process
from harness.isolation import s3_prefix, zk_chroot
from harness.seaweed import SeaweedS3Server
from snapcoord.coordinator.domain.paging import encode_name_token
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore
from snapcoord.coordinator.storage.zookeeper.clock import CLOCK_PATH
from snapcoord.v1 import backlog_pb2, commit_pb2, lease_pb2, producer_pb2, snapshot_pb2

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

EXAMPLES = int(os.environ.get("SNAPCOORD_FUZZ_EXAMPLES", "25"))
DERANDOMIZE = "SNAPCOORD_FUZZ_SEED" not in os.environ and "SNAPCOORD_FUZZ_EXAMPLES" not in os.environ

_FILES = (producer_pb2, snapshot_pb2, lease_pb2, backlog_pb2, commit_pb2)
#: (full method, request descriptor, response descriptor) of every snapcoord.v1 RPC.
METHODS = [
    (f"/{service.full_name}/{m.name}", m.input_type, m.output_type)
    for module in _FILES
    for service in module.DESCRIPTOR.services_by_name.values()
    for m in service.methods
]
#: RPCs that answer with a stream (the rest are unary).
SERVER_STREAMING = {
    m.name
    for module in _FILES
    for service in module.DESCRIPTOR.services_by_name.values()
    for m in service.methods
    if m.server_streaming
}
#: RPCs that take a stream of requests (UploadCheckpoint): fuzzed with 0-3 generated messages.
CLIENT_STREAMING = {
    m.name
    for module in _FILES
    for service in module.DESCRIPTOR.services_by_name.values()
    for m in service.methods
    if m.client_streaming
}
BAD_CODES = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
}
MAX_MESSAGE_CHARS = 1_000

# -- strategies from descriptors -----------------------------------------------------------------

POOL = ["app", "t1", "t2", "p1", "lease-1", "job", "s", "store", "a.b:c_d-1"]
HOSTILE = [
    "",
    ".",
    "..",
    "é",
    "²",
    "a/b",
    "a b",
    "x" * 200,
    "y" * 201,
    "9" * 5000,
    "\x00",
    "\u202e",
    "z" * 100_000,
    "m" * 1_048_576,  # a megabyte echoed whole would exceed the metadata limit
]
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)  # protobuf needs UTF-8
_VALID = st.sampled_from(POOL)
#: Valid identifiers three times out of seven, so that calls also reach records and deep paths.
STRINGS = st.one_of(
    _VALID,
    _VALID,
    _VALID,
    st.sampled_from(HOSTILE),
    _TEXT,
    st.sampled_from(POOL).map(encode_name_token),  # valid page tokens of ListProducerOffsets
    st.integers(0, 30).map(str),  # generation tokens
)
_INT_EDGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}


def _ints(field_type: int) -> st.SearchStrategy[int]:
    lo, hi = _INT_EDGES[field_type]
    edges = [v for v in (lo, hi, lo + 1, hi - 1, 1000, 60_000, 3_600_000, 10**12) if lo <= v <= hi]
    small = st.integers(max(lo, -1), 3)  # generations, counts, page sizes that exist
    return st.one_of(small, small, st.sampled_from(edges), st.integers(lo, hi))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_STRING:
        return STRINGS
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return st.sampled_from([v.number for v in field.enum_type.values] + [99])
    if field.type in _INT_EDGES:
        return _ints(field.type)
    raise AssertionError(f"no strategy for {field.full_name} (type {field.type})")


def _is_repeated(field: FieldDescriptor) -> bool:
    """protobuf 7 dropped ``label`` for ``is_repeated``; 5.x has only ``label``."""
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(getattr(field, "label") == FieldDescriptor.LABEL_REPEATED)  # noqa: B009


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return st.dictionaries(_scalar(key), _scalar(value), max_size=6)
    one = messages(field.message_type, depth + 1) if field.message_type is not None else _scalar(field)
    if _is_repeated(field):
        return st.lists(one, max_size=8)
    return one


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(descriptor)
    if depth > 3:
        return st.just(cls())
    fields = {f.name: st.one_of(st.none(), *[_field(f, depth)] * 3) for f in descriptor.fields}

    def build(values: dict[str, Any]) -> Any:
        return cls(**{k: v for k, v in values.items() if v is not None})

    return st.fixed_dictionaries(fields).map(build)


# -- the stores' state -------------------------------------------------------------------------


def dump(metadata: MetadataStore, blobs: BlobStore) -> tuple[dict[str, tuple[bytes, int]], list[str]]:
    """Every metadata node (data, version) and every blob key; not the clock check's own nodes,
    which each replica rewrites every second whatever the calls do."""
    nodes: dict[str, tuple[bytes, int]] = {}
    stack = ["/"]
    while stack:
        path = stack.pop()
        for name in metadata.children(path):
            child = f"{path.rstrip('/')}/{name}"
            if child == CLOCK_PATH:
                continue
            node = metadata.get(child)
            if node is not None:
                nodes[child] = (node.data, node.version)
                stack.append(child)
    return nodes, sorted(b.key for b in blobs.list())


# -- servers -----------------------------------------------------------------------------------


class Target:
    def __init__(self, coordinator: InProcessCoordinator, deps: Deps) -> None:
        self.coordinator = coordinator
        self.deps = deps
        self.channel = grpc.insecure_channel(
            coordinator.target, options=[("grpc.max_receive_message_length", -1)]
        )


def _serve(metadata_uri: str, blobs_uri: str) -> Iterator[Target]:
    deps = Deps(metadata=open_metadata_store(metadata_uri), blobs=open_blob_store(blobs_uri))
    try:
        with serve_in_process(
            deps,
            snapshot_max_checkpoints="4",
            lease_max_snapshots="4",
            lease_max_holders="2",
            snapshot_max_inline_read="1KiB",
        ) as coordinator:
            target = Target(coordinator, deps)
            yield target
            target.channel.close()
    finally:
        deps.blobs.close()
        deps.metadata.close()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    root = Path(tmp_path_factory.mktemp("fuzz"))
    yield from _serve((root / "metadata").as_uri(), (root / "blobs").as_uri())


@pytest.fixture(scope="module")
def zk_s3(
    zk_hosts: str, _zk_admin: KazooClient, s3_server: SeaweedS3Server, s3_client: S3Client
) -> Iterator[Target]:
    with zk_chroot(_zk_admin, "fuzz") as chroot, s3_prefix(s3_client, s3_server.bucket, "fuzz") as prefix:
        yield from _serve(f"zk://{zk_hosts}{chroot}", f"s3://{s3_server.bucket}/{prefix}")


# -- the property ------------------------------------------------------------------------------


def check_call(target: Target, method: str, response: Descriptor, request: Any) -> None:
    """``request`` is one message, or a list of them for a client-streaming RPC."""
    before = dump(target.deps.metadata, target.deps.blobs)
    name = method.rsplit("/", 1)[1]
    streaming = name in SERVER_STREAMING
    requests_streamed = name in CLIENT_STREAMING
    kind = target.channel.stream_unary if requests_streamed else target.channel.unary_unary
    call = (target.channel.unary_stream if streaming else kind)(
        method,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=message_factory.GetMessageClass(response).FromString,
    )
    try:
        result = call(iter(request) if requests_streamed else request, timeout=120)
        if streaming:
            list(result)  # the status of a stream comes with its end
        event("OK")  # --hypothesis-show-statistics shows how many calls got through
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""
        event(code.name)
        shown = f"{method} -> {code.name}: {details[:300]!r} for {str(request)[:300]!r}"
        assert code not in BAD_CODES, shown
        assert len(details) <= MAX_MESSAGE_CHARS, shown
        after = dump(target.deps.metadata, target.deps.blobs)
        assert after == before, f"{shown} changed the stores: {_diff(before, after)}"


def _diff(before: Any, after: Any) -> str:
    nodes = sorted(set(before[0].items()) ^ set(after[0].items()))
    blobs = sorted(set(before[1]) ^ set(after[1]))
    return f"nodes {[n[0] for n in nodes][:10]}, blobs {blobs[:10]}"


_BASE = settings(
    deadline=None,
    database=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
_IDS = [m.rsplit("/", 1)[1] for m, _, _ in METHODS]


def draw_request(data: st.DataObject, method: str, request_type: Descriptor) -> Any:
    """One request, or for a client-streaming RPC a list of 0-3 (a header, then data pieces that
    may wrongly repeat header fields)."""
    if method.rsplit("/", 1)[1] in CLIENT_STREAMING:
        return data.draw(st.lists(messages(request_type), max_size=3), label="requests")
    return data.draw(messages(request_type), label="request")


@pytest.mark.parametrize(("method", "request_type", "response_type"), METHODS, ids=_IDS)
@settings(_BASE, max_examples=EXAMPLES)
@given(data=st.data())
def test_fuzz_embedded(
    embedded: Target, method: str, request_type: Descriptor, response_type: Descriptor, data: st.DataObject
) -> None:
    check_call(embedded, method, response_type, draw_request(data, method, request_type))


@pytest.mark.parametrize(("method", "request_type", "response_type"), METHODS, ids=_IDS)
@settings(_BASE, max_examples=max(3, EXAMPLES // 5))
@given(data=st.data())
def test_fuzz_zookeeper_s3(
    zk_s3: Target, method: str, request_type: Descriptor, response_type: Descriptor, data: st.DataObject
) -> None:
    check_call(zk_s3, method, response_type, draw_request(data, method, request_type))


def test_every_rpc_is_fuzzed() -> None:
    assert len(METHODS) == 28
    assert {"ReadCheckpoint"} == SERVER_STREAMING
    assert {"UploadCheckpoint"} == CLIENT_STREAMING
