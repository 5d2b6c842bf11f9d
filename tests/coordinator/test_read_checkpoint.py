"""ReadCheckpoint and the inline limit of GetSnapshot (#11 D8), through the real server and the
thin client, on the embedded stores and on ZooKeeper + S3: payloads stream in pieces of at most
1 MiB and arrive whole; GetSnapshot refuses more inline bytes than its limit, pointing to the
stream; absent things are NOT_FOUND."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

import pytest

from harness.coordinator import InProcessCoordinator, serve_in_process
from harness.stores import Stores
from snapcoord.client import CoordinatorClient, InvalidArgument, NotFound, TaskSnapshot
from snapcoord.coordinator.services import Deps
from snapcoord.v1 import snapshot_pb2, snapshot_pb2_grpc

MiB = 1024 * 1024


@pytest.fixture
def coordinator(stores: Stores) -> Iterator[InProcessCoordinator]:
    deps = Deps(metadata=stores.metadata, blobs=stores.blobs)
    with serve_in_process(deps, snapshot_max_inline_read="3MiB") as coord:
        yield coord


@pytest.fixture
def client(coordinator: InProcessCoordinator) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(coordinator.target, timeout_s=120) as c:
        yield c


def test_a_payload_streams_in_pieces_and_arrives_whole(
    client: CoordinatorClient, coordinator: InProcessCoordinator
) -> None:
    big = random.Random(1).randbytes(5 * MiB + 17)
    g = client.create_snapshot("app", ["t1", "t2"]).generation
    client.report_task_snapshot("app", g, TaskSnapshot("t1", (), {"big": big, "empty": b""}))
    client.report_task_snapshot("app", g, TaskSnapshot("t2", (), {"small": b"s" * 10}))

    assert b"".join(client.read_checkpoint("app", g, "t1", "big")) == big
    assert b"".join(client.read_checkpoint("app", g, "t1", "empty")) == b""
    # On the wire: pieces of at most 1 MiB, in order, each framed with the size and hash.
    with coordinator.channel() as channel:
        stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        chunks = list(
            stub.ReadCheckpoint(
                snapshot_pb2.ReadCheckpointRequest(app_id="app", generation=g, task_id="t1", store="big")
            )
        )
    assert len(chunks) == 6 and all(len(c.data) <= MiB for c in chunks)
    assert [c.offset for c in chunks] == [i * MiB for i in range(6)]
    assert {(c.total_size, c.sha256) for c in chunks} == {(len(big), hashlib.sha256(big).hexdigest())}

    # GetSnapshot inline: 5 MiB exceeds the 3 MiB limit; the refusal says what to use instead.
    with pytest.raises(InvalidArgument) as refused:
        client.get_snapshot("app", g, include_checkpoints=True)
    assert refused.value.reason == "TOO_LARGE"
    assert "stream each payload with ReadCheckpoint" in str(refused.value)
    headers = client.get_snapshot("app", g)  # without payloads it is fine
    assert {t.task_id for t in headers.tasks} == {"t1", "t2"}


def test_absent_things_are_not_found(client: CoordinatorClient) -> None:
    g = client.create_snapshot("app2", ["t"]).generation
    client.report_task_snapshot("app2", g, TaskSnapshot("t", (), {"s": b"x"}))
    for args in (
        ("app2", g, "t", "other"),
        ("app2", g, "nobody", "s"),
        ("app2", g + 1, "t", "s"),
        ("none", 1, "t", "s"),
    ):
        with pytest.raises(NotFound):
            b"".join(client.read_checkpoint(*args))
    with pytest.raises(InvalidArgument):
        b"".join(client.read_checkpoint("app2", g, "t", ""))
