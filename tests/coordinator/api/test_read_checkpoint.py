"""ReadCheckpoint and the inline limit of GetSnapshot, through the real server and the
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
from snapcoord.client import CoordinatorClient, Internal, InvalidArgument, NotFound, TaskSnapshot
from snapcoord.coordinator.services import Deps
from snapcoord.v1 import snapshot_pb2, snapshot_pb2_grpc

MiB = 1024 * 1024


def wire_chunks(
    coordinator: InProcessCoordinator, app_id: str, generation: int, task_id: str, store: str
) -> list[snapshot_pb2.CheckpointChunk]:
    """The ReadCheckpoint messages as they arrive, through the generated stub (no client logic)."""
    with coordinator.channel() as channel:
        stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        request = snapshot_pb2.ReadCheckpointRequest(
            app_id=app_id, generation=generation, task_id=task_id, store=store
        )
        return list(stub.ReadCheckpoint(request, timeout=120))


@pytest.fixture
def coordinator(stores: Stores) -> Iterator[InProcessCoordinator]:
    deps = Deps(metadata=stores.metadata, blobs=stores.blobs)
    # A 5 MiB report inline: over the default 4 MiB cap.
    with serve_in_process(deps, snapshot_max_inline_read="3MiB", max_inline_payload="8MiB") as coord:
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


@pytest.mark.parametrize(
    "size",
    [0, 1, MiB - 1, MiB, MiB + 1, 3 * MiB, 3 * MiB + 5],
    ids=[
        "empty",
        "one-byte",
        "just-under-one-message",
        "one-message",
        "one-byte-over",
        "three",
        "three-and-5",
    ],
)
def test_payloads_split_into_messages_at_1_mib_boundaries(
    client: CoordinatorClient, coordinator: InProcessCoordinator, size: int
) -> None:
    payload = random.Random(size).randbytes(size)
    g = client.create_snapshot("edges", ["t"]).generation
    client.report_task_snapshot("edges", g, TaskSnapshot("t", (), {"s": payload}))

    chunks = wire_chunks(coordinator, "edges", g, "t", "s")
    full, rest = divmod(size, MiB)
    expected = [MiB] * full + ([rest] if rest else []) or [0]  # an empty payload: one empty message
    assert [len(c.data) for c in chunks] == expected
    assert [c.offset for c in chunks] == [i * MiB for i in range(len(expected))]
    assert {(c.total_size, c.sha256) for c in chunks} == {(size, hashlib.sha256(payload).hexdigest())}
    assert b"".join(c.data for c in chunks) == payload
    # The client checks size and SHA-256 end to end before it ends the stream.
    assert b"".join(client.read_checkpoint("edges", g, "t", "s")) == payload


def test_an_uploaded_payload_streams_back_whole(
    client: CoordinatorClient, coordinator: InProcessCoordinator
) -> None:
    pieces = [random.Random(n).randbytes(n * 1000 + 1) for n in range(1, 40)]  # 0.8 MB in odd pieces
    payload = b"".join(pieces)
    g = client.create_snapshot("up", ["t"]).generation
    up = client.upload_checkpoint("up", g, "t", "s", iter(pieces))
    client.report_task_snapshot("up", g, TaskSnapshot("t", uploads={"s": up.upload_id}))
    chunks = wire_chunks(coordinator, "up", g, "t", "s")
    assert [len(c.data) for c in chunks] == [len(payload)]  # under 1 MiB: one message
    assert b"".join(client.read_checkpoint("up", g, "t", "s")) == payload


def test_a_payload_changed_behind_the_coordinator_fails_the_clients_check(
    client: CoordinatorClient, stores: Stores
) -> None:
    payload = random.Random(7).randbytes(2 * MiB + 3)
    g = client.create_snapshot("tamper", ["t"]).generation
    client.report_task_snapshot("tamper", g, TaskSnapshot("t", (), {"s": payload}))
    [blob] = [b for b in stores.blobs.list() if "tamper" in b.key and b.size == len(payload)]
    flipped = bytearray(payload)
    flipped[MiB] ^= 1  # the first byte of the second message
    stores.blobs.put(blob.key, bytes(flipped))

    received = []
    with pytest.raises(Internal, match="SHA-256") as mismatch:
        for piece in client.read_checkpoint("tamper", g, "t", "s"):
            received.append(piece)
    assert len(b"".join(received)) == len(payload)  # every piece arrived; the hash is what failed
    assert hashlib.sha256(payload).hexdigest() in str(mismatch.value)  # what the server announced
