"""UploadCheckpoint and reports that reference uploads, through the real server and the thin
client, on the embedded stores and on ZooKeeper + S3: a streamed payload reads back whole like any
checkpoint; the header is checked like a report's before data is read; bad uploads and bad
references are refused precisely and leave nothing behind."""

from __future__ import annotations

import hashlib
import io
import logging
import random
import threading
from collections.abc import Iterator

import grpc
import pytest

from harness.coordinator import InProcessCoordinator, serve_in_process
from harness.process import wait_until
from harness.stores import Stores
from snapcoord.client import (
    CoordinatorClient,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    SnapshotFenced,
    TaskSnapshot,
)
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.transport.status import until_ended
from snapcoord.v1 import snapshot_pb2, snapshot_pb2_grpc

MiB = 1024 * 1024


@pytest.fixture
def coordinator(stores: Stores) -> Iterator[InProcessCoordinator]:
    deps = Deps(metadata=stores.metadata, blobs=stores.blobs)
    with serve_in_process(deps, snapshot_max_upload_size="20MiB", snapshot_max_checkpoints="3") as coord:
        yield coord


@pytest.fixture
def client(coordinator: InProcessCoordinator) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(coordinator.target, timeout_s=120) as c:
        yield c


def live_intents(stores: Stores) -> list[intents.Intent]:
    found = []
    for bucket in stores.metadata.children(intents.ROOT):
        for name in stores.metadata.children(f"{intents.ROOT}/{bucket}"):
            node = stores.metadata.get(f"{intents.ROOT}/{bucket}/{name}")
            if node is not None:
                found.append(intents.decode(node.data))
    return found


def stored_keys(stores: Stores) -> set[str]:
    return {info.key for info in stores.blobs.list("snapshots/")}


def test_an_uploaded_checkpoint_reads_back_like_any_other(client: CoordinatorClient, stores: Stores) -> None:
    big = random.Random(7).randbytes(12 * MiB + 5)  # more than one S3 part (8 MiB)
    g = client.create_snapshot("app", ["t1", "t2"]).generation

    up = client.upload_checkpoint("app", g, "t1", "big", big)
    assert (up.size, up.sha256) == (len(big), hashlib.sha256(big).hexdigest())
    from_file = client.upload_checkpoint("app", g, "t1", "file", io.BytesIO(b"f" * (3 * MiB)))
    from_pieces = client.upload_checkpoint("app", g, "t2", "pieces", iter([b"a" * (2 * MiB + 1), b"", b"b"]))
    empty = client.upload_checkpoint("app", g, "t2", "empty", b"")
    assert (empty.size, from_pieces.size) == (0, 2 * MiB + 2)
    # Until a report names them, the uploads are announced by intents (the janitor's index).
    assert {i.upload.store for i in live_intents(stores) if i.upload} == {"big", "file", "pieces", "empty"}

    one = client.report_task_snapshot(
        "app", g, TaskSnapshot("t1", (), {"inline": b"i"}, {"big": up.upload_id, "file": from_file.upload_id})
    )
    assert set(one.tasks[0].checkpoints) == {"big", "file", "inline"}
    done = client.report_task_snapshot(
        "app", g, TaskSnapshot("t2", (), uploads={"pieces": from_pieces.upload_id, "empty": empty.upload_id})
    )
    assert done.state.name == "COMPLETED"
    # The reports' commits retired the intents; the objects stay, referenced.
    assert live_intents(stores) == []
    # The four uploads; the 1-byte checkpoint sent in t1's report is held in the report itself.
    assert len(stored_keys(stores)) == 4
    assert b"".join(client.read_checkpoint("app", g, "t1", "inline")) == b"i"

    assert b"".join(client.read_checkpoint("app", g, "t1", "big")) == big
    assert b"".join(client.read_checkpoint("app", g, "t1", "file")) == b"f" * (3 * MiB)
    assert b"".join(client.read_checkpoint("app", g, "t2", "pieces")) == b"a" * (2 * MiB + 1) + b"b"
    assert b"".join(client.read_checkpoint("app", g, "t2", "empty")) == b""
    listed = client.get_snapshot("app", g)
    assert {t.task_id: set(t.checkpoints) for t in listed.tasks} == {
        "t1": {"big", "file", "inline"},
        "t2": {"pieces", "empty"},
    }

    # The same report again is accepted as one, although its intents are gone.
    again = client.report_task_snapshot(
        "app", g, TaskSnapshot("t1", (), {"inline": b"i"}, {"big": up.upload_id, "file": from_file.upload_id})
    )
    assert again.tasks[0].task_id == "t1"

    # Deleting the snapshot deletes the uploaded payloads with the rest.
    assert client.delete_snapshot("app", g)
    assert stored_keys(stores) == set()


def test_the_header_is_checked_before_any_data(client: CoordinatorClient, stores: Stores) -> None:
    g = client.create_snapshot("app", ["t"]).generation

    def endless() -> Iterator[bytes]:
        while True:
            yield b"x" * 1024

    with pytest.raises(InvalidArgument) as outside:
        client.upload_checkpoint("app", g, "stranger", "s", endless())
    assert "not in the task set" in str(outside.value)
    with pytest.raises(SnapshotFenced):
        client.upload_checkpoint("app", g + 1, "t", "s", endless())
    with pytest.raises(SnapshotFenced):  # no such app: generation 1 > current 0, as for a report
        client.upload_checkpoint("nobody", 1, "t", "s", b"x")
    with pytest.raises(InvalidArgument):
        client.upload_checkpoint("app", g, "t", "", b"x")
    client.abort_snapshot("app", g)
    with pytest.raises(SnapshotFenced) as ended:
        client.upload_checkpoint("app", g, "t", "s", endless())
    assert ended.value.reason == "SNAPSHOT_NOT_CREATED"
    assert live_intents(stores) == [] and stored_keys(stores) == set()


def test_oversized_messages_and_uploads_are_refused_and_leave_nothing(
    coordinator: InProcessCoordinator, client: CoordinatorClient, stores: Stores
) -> None:
    g = client.create_snapshot("app", ["t"]).generation
    with pytest.raises(InvalidArgument) as too_big:
        client.upload_checkpoint("app", g, "t", "s", (b"z" * MiB for _ in range(21)))
    assert too_big.value.reason == "TOO_LARGE" and "--snapshot-max-upload-size" in str(too_big.value)

    with coordinator.channel() as channel:
        stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        header = snapshot_pb2.UploadCheckpointRequest(app_id="app", generation=g, task_id="t", store="s")
        with pytest.raises(grpc.RpcError) as chunk:
            stub.UploadCheckpoint(iter([header, snapshot_pb2.UploadCheckpointRequest(data=b"c" * (MiB + 1))]))
        assert chunk.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "limit per message" in str(chunk.value.details())
        with pytest.raises(grpc.RpcError) as renamed:
            stub.UploadCheckpoint(
                iter([header, snapshot_pb2.UploadCheckpointRequest(store="other", data=b"c")])
            )
        assert renamed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as nothing:
            stub.UploadCheckpoint(iter([]))
        assert nothing.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert live_intents(stores) == [] and stored_keys(stores) == set()


def test_bad_references_are_refused_and_change_nothing(client: CoordinatorClient, stores: Stores) -> None:
    g = client.create_snapshot("app", ["t", "u"]).generation
    up = client.upload_checkpoint("app", g, "t", "s", b"payload")

    with pytest.raises(InvalidArgument) as both:
        client.report_task_snapshot("app", g, TaskSnapshot("t", (), {"s": b"x"}, {"s": up.upload_id}))
    assert "both" in str(both.value)
    with pytest.raises(InvalidArgument) as too_many:
        client.report_task_snapshot(
            "app", g, TaskSnapshot("t", (), {"a": b"", "b": b""}, {"s": up.upload_id, "c": up.upload_id})
        )
    assert too_many.value.reason == "TOO_LARGE"
    with pytest.raises(InvalidArgument):  # not an id UploadCheckpoint gives
        client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"s": "made-up"}))
    with pytest.raises(NotFound):  # well-formed, never made
        client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"s": "1-" + "0" * 32}))
    with pytest.raises(InvalidArgument) as other_store:
        client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"other": up.upload_id}))
    assert "not for this report's task and store" in str(other_store.value)
    with pytest.raises(InvalidArgument):  # another task's report
        client.report_task_snapshot("app", g, TaskSnapshot("u", (), uploads={"s": up.upload_id}))
    assert client.get_snapshot("app", g).tasks == ()
    assert len(live_intents(stores)) == 1

    client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"s": up.upload_id}))
    # Used once: a different report may not take it again.
    with pytest.raises(FailedPrecondition):
        client.report_task_snapshot("app", g, TaskSnapshot("t", (), {"x": b""}, uploads={"s": up.upload_id}))
    assert b"".join(client.read_checkpoint("app", g, "t", "s")) == b"payload"


def test_an_upload_id_is_accepted_only_as_upload_checkpoint_wrote_it(
    client: CoordinatorClient, stores: Stores
) -> None:
    g = client.create_snapshot("app", ["t"]).generation
    up = client.upload_checkpoint("app", g, "t", "s", b"payload")
    minute, _, unique = up.upload_id.partition("-")
    for padded in ("000" + up.upload_id, f"0{minute}-{unique}"):
        with pytest.raises(InvalidArgument) as refused:
            client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"s": padded}))
        assert "not an upload_id that UploadCheckpoint returns" in str(refused.value)
    assert client.get_snapshot("app", g).tasks == ()
    client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"s": up.upload_id}))
    assert b"".join(client.read_checkpoint("app", g, "t", "s")) == b"payload"


def test_refusals_quote_the_whole_upload_id(client: CoordinatorClient, stores: Stores) -> None:
    g = client.create_snapshot("app", ["t"]).generation
    up = client.upload_checkpoint("app", g, "t", "s", b"payload")
    with pytest.raises(InvalidArgument) as other_store:
        client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"other": up.upload_id}))
    assert f"upload {up.upload_id!r} was made for" in str(other_store.value)
    never = "999999999-" + "0" * 32
    with pytest.raises(NotFound) as missing:
        client.report_task_snapshot("app", g, TaskSnapshot("t", (), uploads={"s": never}))
    assert f"upload {never!r} does not exist" in str(missing.value)


def test_an_upload_cancelled_or_past_its_deadline_mid_stream_is_not_internal(
    coordinator: InProcessCoordinator,
    client: CoordinatorClient,
    stores: Stores,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller's cancel or deadline is what the server records (no INTERNAL, no traceback), and
    an upload recorded as ended early leaves nothing behind."""
    caplog.set_level(logging.WARNING, logger="snapcoord")
    g = client.create_snapshot("app", ["t"]).generation
    header = snapshot_pb2.UploadCheckpointRequest(
        app_id="app", generation=g, task_id="t", store="s", data=b"a"
    )

    def handled(code: str) -> float:
        labels = {
            "grpc_type": "client_stream",
            "grpc_service": "snapcoord.v1.SnapshotService",
            "grpc_method": "UploadCheckpoint",
            "grpc_code": code,
        }
        return coordinator.server.registry.get_sample_value("grpc_server_handled_total", labels) or 0.0

    def recorded() -> float:
        return sum(handled(code) for code in ("OK", "Canceled", "DeadlineExceeded", "Internal"))

    released = threading.Event()

    def held() -> Iterator[snapshot_pb2.UploadCheckpointRequest]:
        yield header
        yield snapshot_pb2.UploadCheckpointRequest(data=b"b" * MiB)
        released.wait(120)

    with coordinator.channel() as channel:
        stub = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        cancelled = stub.UploadCheckpoint.future(held())
        wait_until(lambda: live_intents(stores), timeout=60, what="the upload to start")
        cancelled.cancel()
        wait_until(lambda: recorded() == 1, timeout=60, what="the cancelled upload to be recorded")

        late = stub.UploadCheckpoint.future(held(), timeout=1)
        with pytest.raises(grpc.RpcError) as ended:
            late.result()
        assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: recorded() == 2, timeout=60, what="the late upload to be recorded")
        released.set()
    assert handled("Internal") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    if handled("OK") == 0:  # (grpc may see a cancel only after the stream ended: then it completes)
        assert live_intents(stores) == [] and stored_keys(stores) == set()


class _EndedCall:
    """The context of a call grpc has ended: inactive, with ``remaining`` seconds of deadline."""

    def __init__(self, remaining: float) -> None:
        self.remaining = remaining
        self.aborted: grpc.StatusCode | None = None

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return self.remaining

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = code
        raise Exception()  # what grpc's context.abort raises


@pytest.mark.parametrize(
    ("remaining", "code"),
    [(1e9, grpc.StatusCode.CANCELLED), (0.0, grpc.StatusCode.DEADLINE_EXCEEDED)],
)
@pytest.mark.parametrize("ends", ["raises", "just ends"])
def test_a_request_stream_that_ends_with_its_call_aborts_with_the_callers_code(
    remaining: float, code: grpc.StatusCode, ends: str
) -> None:
    def requests() -> Iterator[bytes]:
        yield b"first"
        if ends == "raises":
            raise grpc.RpcError()  # grpc's iterator, once the call is cancelled

    context = _EndedCall(remaining)
    stream = until_ended(requests(), context)
    assert next(stream) == b"first"
    with pytest.raises(Exception) as e:
        next(stream)
    assert type(e.value) is Exception and context.aborted is code
