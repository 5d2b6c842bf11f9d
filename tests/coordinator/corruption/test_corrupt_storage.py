"""Records truncated or garbled by hand, on the embedded store and on real ZooKeeper + SeaweedFS.

For each record kind: the read of that record answers DATA_LOSS (reason CORRUPT_RECORD, its kind
and path in the ErrorInfo); its neighbours read and list as before; a janitor pass completes,
counts it (``snapcoord_corrupt_records_total{kind}``) and logs its path, and deletes nothing it
must keep: above all, no payload object of a record it could not decode.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from harness.coordinator import InProcessCoordinator, serve_in_process
from harness.process import wait_until
from harness.stores import Stores
from snapcoord.client import CoordinatorClient, CorruptRecord, NewerFormat
from snapcoord.coordinator.domain.clock import ManualClock
from snapcoord.coordinator.kernel.intents import ROOT as INTENTS
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.snapshots.layout import gen_path, task_path
from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    common_pb2,
    error_details_pb2,
    lease_pb2,
    lease_pb2_grpc,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)

HOUR_MS = 3_600_000
CORRUPTION_LOG = "snapcoord.coordinator.kernel.corruption"


def truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def garbled(data: bytes) -> bytes:
    rng = random.Random(data)
    return bytes(rng.randrange(256) for _ in range(len(data)))


def mistyped(data: bytes) -> bytes:
    """Valid JSON, the right version, every other field a list of lists."""
    doc = json.loads(data)
    return json.dumps({k: (v if k == "version" else [[1]]) for k, v in doc.items()}).encode()


def newer(data: bytes) -> bytes:
    """Sound, but of a format version a newer release would write: refused as NEWER_FORMAT, not
    as corrupt, and kept like a corrupt record."""
    doc = json.loads(data)
    return json.dumps({**doc, "version": doc["version"] + 100}).encode()


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "truncated": truncated,
    "garbled": garbled,
    "mistyped": mistyped,
    "newer": newer,
}


def serve(deps: Deps) -> contextlib.AbstractContextManager[InProcessCoordinator]:
    """A coordinator with every payload in the blob store and the listing orphan sweeps on, with
    a short grace (janitor passes are run by the test)."""
    return serve_in_process(
        deps,
        check_clock=False,  # the manual clock is moved hours past ZooKeeper's
        producer_inline_max_bytes="0",
        snapshot_inline_checkpoint_max_bytes="0",
        orphan_grace="1s",
        orphan_listing_interval="1s",
        orphan_sweep_interval="1s",
    )


@dataclass(frozen=True)
class Env:
    stores: Stores
    clock: ManualClock
    coord: InProcessCoordinator
    channel: grpc.Channel

    @contextlib.contextmanager
    def replica(self) -> Iterator[grpc.Channel]:
        """A channel to a second coordinator on the same stores, which has no copies in memory of
        what the first wrote (the first may answer from them)."""
        deps = Deps(self.stores.metadata, self.stores.blobs, self.clock)
        with serve(deps) as other, other.channel() as channel:
            yield channel

    def corrupt(self, path: str, how: Callable[[bytes], bytes]) -> bytes:
        node = self.stores.metadata.get(path)
        assert node is not None, path
        data = how(node.data)
        self.stores.metadata.set(path, data, version=node.version)
        return data

    def corrupt_object(self, key: str, how: Callable[[bytes], bytes]) -> None:
        self.stores.blobs.put(key, how(self.stores.blobs.get(key)))

    def objects(self, prefix: str) -> set[str]:
        return {info.key for info in self.stores.blobs.list(prefix)}

    def janitor_pass(self) -> dict[str, int]:
        return self.coord.server.services.janitor.run_once()

    def counted(self, kind: str) -> float:
        for family in self.coord.server.services.metrics.corrupt_records.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("kind") == kind:
                    return sample.value
        return 0.0


@pytest.fixture
def env(stores: Stores) -> Iterator[Env]:
    """A coordinator on ``stores`` with a manual clock (janitor passes run by the test), every
    payload in the blob store, and the listing orphan sweeps on with a short grace."""
    clock = ManualClock(time.time_ns() // 1_000_000)
    deps = Deps(stores.metadata, stores.blobs, clock)
    with serve(deps) as coord, coord.channel() as channel:
        yield Env(stores, clock, coord, channel)


def refusal(call: Callable[[], object], code: grpc.StatusCode, reason: str) -> dict[str, str]:
    """The ErrorInfo metadata of a call that must fail with ``code`` and ``reason``."""
    with pytest.raises(grpc.RpcError) as e:
        call()
    error = e.value
    assert isinstance(error, grpc.Call)
    assert error.code() is code, (error.code(), error.details())
    trailer = dict(error.trailing_metadata() or ())
    (detail,) = error_details_pb2.Status.FromString(trailer["grpc-status-details-bin"]).details
    info = error_details_pb2.ErrorInfo.FromString(detail.value)
    assert info.reason == reason
    assert "internal error" not in (error.details() or "")
    return dict(info.metadata)


def data_loss(call: Callable[[], object]) -> dict[str, str]:
    """The ErrorInfo metadata of a call that must fail with DATA_LOSS / CORRUPT_RECORD."""
    return refusal(call, grpc.StatusCode.DATA_LOSS, "CORRUPT_RECORD")


def newer_format(call: Callable[[], object]) -> dict[str, str]:
    """The kind and path of a call that must fail with FAILED_PRECONDITION / NEWER_FORMAT naming
    the record's format version (``newer``'s, past 100) and the newest this coordinator reads."""
    info = refusal(call, grpc.StatusCode.FAILED_PRECONDITION, "NEWER_FORMAT")
    found, supported = int(info.pop("format_version")), int(info.pop("supported_format_version"))
    assert found > supported > 0 and found > 100, (found, supported)
    return info


def unreadable(how: str, call: Callable[[], object]) -> dict[str, str]:
    """The kind and path of a call that needs a record changed by the corruption ``how``."""
    return newer_format(call) if how == "newer" else data_loss(call)


def skipping(by: str, how: str, kind: str, path: str) -> str:
    """The start of the WARNING line of ``by`` skipping a record changed by ``how``."""
    if how == "newer":
        return f"{by}: skipping the {kind} at {path}, written by a newer release"
    return f"{by}: skipping the corrupt {kind} at {path}"


def payload_key(env: Env, producer_id: str) -> str:
    """The object key the producer's record points at (read before the record is corrupted)."""
    node = env.stores.metadata.get(f"/producers/records/{producer_id}")
    assert node is not None
    key = json.loads(node.data)["object_key"]
    assert isinstance(key, str) and key in env.objects("producers/")
    return key


def offsets(n: int) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream="s", partition=p, offset=10 + p) for p in range(n)]


# --- producer records and their payload objects --------------------------------------------------


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_corrupt_producer_record(env: Env, how: str, caplog: pytest.LogCaptureFixture) -> None:
    stub = producer_pb2_grpc.ProducerOffsetServiceStub(env.channel)
    for name in ("p1", "p2", "p3"):
        stub.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id=name, offsets=offsets(2)), timeout=30
        )
    p2_object = payload_key(env, "p2")
    # Objects named as releases before the intent pool named them (``producers/<id>/...``): the
    # ones the listing sweep judges by their producer's record.
    legacy = {name: f"producers/{name}/{'0' * 32}.json" for name in ("p1", "p2")}
    for key in legacy.values():
        env.stores.blobs.put(key, b"an old payload")
    env.corrupt("/producers/records/p2", CORRUPTIONS[how])

    info = unreadable(
        how, lambda: stub.GetProducerOffsets(producer_pb2.GetProducerOffsetsRequest(producer_id="p2"))
    )
    assert info == {"kind": "producer_record", "path": "/producers/records/p2"}
    client_error = NewerFormat if how == "newer" else CorruptRecord
    with CoordinatorClient(env.coord.target) as client, pytest.raises(client_error) as raised:
        client.get_producer_offsets("p2")
    assert {k: raised.value.metadata[k] for k in info} == info
    assert raised.value.code == ("FAILED_PRECONDITION" if how == "newer" else "DATA_LOSS")
    for name in ("p1", "p3"):
        got = stub.GetProducerOffsets(producer_pb2.GetProducerOffsetsRequest(producer_id=name), timeout=30)
        assert list(got.offsets) == offsets(2)
    caplog.set_level(logging.WARNING, logger=CORRUPTION_LOG)
    listed = stub.ListProducerOffsets(producer_pb2.ListProducerOffsetsRequest(), timeout=30)
    assert [s.producer_id for s in listed.snapshots] == ["p1", "p3"]
    # A newer record is sound: not counted as corrupt (that counter's alert asks for a repair).
    corrupt_count = 0 if how == "newer" else 1
    assert env.counted("producer_record") == corrupt_count
    path = "/producers/records/p2"
    assert skipping("ListProducerOffsets", how, "producer_record", path) in caplog.text
    delete = producer_pb2.DeleteProducerOffsetsRequest(producer_id="p2")
    unreadable(how, lambda: stub.DeleteProducerOffsets(delete))

    # Past the grace, before the TTL: the listing sweep judges p2's object, whose record it cannot
    # read, and keeps it.
    env.clock.advance(2 * HOUR_MS)
    caplog.clear()
    assert env.janitor_pass()["producer-orphans"] == 1
    assert legacy["p1"] not in env.objects("producers/")
    assert {p2_object, legacy["p2"]} <= env.objects("producers/")
    assert skipping("producer orphan sweep", how, "producer_record", path) in caplog.text
    # Past the TTL: the others expire, the corrupt one stays (with its object), counted each pass.
    env.clock.advance(25 * HOUR_MS)
    caplog.clear()
    assert env.janitor_pass()["producer-expiry"] == 2
    assert skipping("producer expiry", how, "producer_record", path) in caplog.text
    assert env.objects("producers/") == {p2_object, legacy["p2"]}
    assert env.stores.metadata.get("/producers/records/p2") is not None
    assert env.counted("producer_record") >= 3 * corrupt_count


def test_a_garbled_producer_payload_object(env: Env) -> None:
    stub = producer_pb2_grpc.ProducerOffsetServiceStub(env.channel)
    for name in ("p1", "p2"):
        stub.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id=name, offsets=offsets(3)), timeout=30
        )
    key = payload_key(env, "p2")
    # Still valid JSON for the same producer, one offset changed: the record's SHA-256 tells.
    original = env.stores.blobs.get(key)
    env.corrupt_object(key, lambda data: data.replace(b'"offset":10', b'"offset":99'))
    assert env.stores.blobs.get(key) != original
    info = data_loss(
        lambda: stub.GetProducerOffsets(producer_pb2.GetProducerOffsetsRequest(producer_id="p2"))
    )
    assert info == {"kind": "producer_offsets_payload", "path": key}
    env.corrupt_object(key, truncated)
    info = data_loss(
        lambda: stub.GetProducerOffsets(producer_pb2.GetProducerOffsetsRequest(producer_id="p2"))
    )
    assert info == {"kind": "producer_offsets_payload", "path": key}
    listed = stub.ListProducerOffsets(producer_pb2.ListProducerOffsetsRequest(), timeout=30)
    assert [s.producer_id for s in listed.snapshots] == ["p1"]
    env.stores.blobs.delete(key)  # missing altogether
    info = data_loss(
        lambda: stub.GetProducerOffsets(producer_pb2.GetProducerOffsetsRequest(producer_id="p2"))
    )
    assert info == {"kind": "producer_offsets_payload", "path": key}


# --- snapshots: headers, task reports, checkpoint objects, retention -----------------------------


def make_snapshots(stub: snapshot_pb2_grpc.SnapshotServiceStub, app_id: str, count: int) -> None:
    """``count`` completed generations of ``app_id``, one task each with one checkpoint."""
    for g in range(1, count + 1):
        stub.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id=app_id, task_ids=["t"]), timeout=30)
        stub.ReportTaskSnapshot(
            snapshot_pb2.ReportTaskSnapshotRequest(
                app_id=app_id,
                generation=g,
                task=snapshot_pb2.TaskSnapshot(
                    task_id="t", committed_offsets=offsets(1), checkpoints={"state": b"payload-%d" % g}
                ),
            ),
            timeout=30,
        )


def generations(stub: snapshot_pb2_grpc.SnapshotServiceStub, app_id: str) -> list[int]:
    listed = stub.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(app_id=app_id), timeout=30)
    return sorted(s.generation for s in listed.snapshots)


def test_a_corrupt_snapshot_header_is_skipped_by_lists_and_retention(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    stub = snapshot_pb2_grpc.SnapshotServiceStub(env.channel)
    make_snapshots(stub, "app", 4)
    stub.SetRetentionPolicy(
        snapshot_pb2.SetRetentionPolicyRequest(app_id="app", keep_last_completed=2), timeout=30
    )
    before = env.objects("snapshots/")
    assert len(before) == 4
    env.corrupt(gen_path("app", 3), mistyped)

    info = data_loss(lambda: stub.GetSnapshot(snapshot_pb2.GetSnapshotRequest(app_id="app", generation=3)))
    assert info == {"kind": "snapshot_record", "path": gen_path("app", 3)}
    for g in (2, 4):
        assert (
            stub.GetSnapshot(
                snapshot_pb2.GetSnapshotRequest(app_id="app", generation=g), timeout=30
            ).generation
            == g
        )
    caplog.set_level(logging.WARNING, logger=CORRUPTION_LOG)
    assert generations(stub, "app") == [1, 2, 4]
    assert f"ListSnapshots: skipping the corrupt snapshot_record at {gen_path('app', 3)}" in caplog.text

    # Retention keeps the last 2 completed: judged without generation 3, it keeps 2 and 4 (one
    # more than it would with 3 readable), deletes 1, and never touches 3 or its payload.
    env.clock.advance(2 * HOUR_MS)
    caplog.clear()
    env.janitor_pass()
    assert generations(stub, "app") == [2, 4]
    assert env.stores.metadata.get(gen_path("app", 3)) is not None
    assert f"snapshot retention: skipping the corrupt snapshot_record at {gen_path('app', 3)}" in caplog.text
    assert len(env.objects("snapshots/app/3/")) == 1  # generation 3's checkpoint stays with it
    assert len(env.objects("snapshots/")) == 3
    assert env.counted("snapshot_record") >= 2


def test_a_corrupt_current_header(env: Env) -> None:
    """The app's current snapshot cannot be read nor followed by a new one (CreateSnapshot reads
    it): DATA_LOSS naming it, as corruption.md says; another app is not affected."""
    stub = snapshot_pb2_grpc.SnapshotServiceStub(env.channel)
    make_snapshots(stub, "app", 2)
    make_snapshots(stub, "other", 1)
    env.corrupt(gen_path("app", 2), truncated)
    located = {"kind": "snapshot_record", "path": gen_path("app", 2)}
    current = snapshot_pb2.GetCurrentSnapshotRequest(app_id="app", consistent=True)
    assert data_loss(lambda: stub.GetCurrentSnapshot(current)) == located
    create = snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["t"])
    assert data_loss(lambda: stub.CreateSnapshot(create)) == located
    with env.replica() as channel:  # no copy of the header in memory: the watch-fed path reads it
        other = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        cached = snapshot_pb2.GetCurrentSnapshotRequest(app_id="app")
        assert data_loss(lambda: other.GetCurrentSnapshot(cached))["kind"] == "snapshot_record"
        assert (
            other.GetCurrentSnapshot(snapshot_pb2.GetCurrentSnapshotRequest(app_id="other")).generation == 1
        )


def test_a_corrupt_task_report_keeps_its_checkpoint_object(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    stub = snapshot_pb2_grpc.SnapshotServiceStub(env.channel)
    make_snapshots(stub, "app", 2)
    env.corrupt(task_path("app", 1, "t"), garbled)
    caplog.set_level(logging.WARNING, logger=CORRUPTION_LOG)
    for call in (
        lambda: stub.GetSnapshot(snapshot_pb2.GetSnapshotRequest(app_id="app", generation=1)),
        lambda: stub.GetSnapshot(
            snapshot_pb2.GetSnapshotRequest(app_id="app", generation=1, include_checkpoints=True)
        ),
        lambda: list(
            stub.ReadCheckpoint(
                snapshot_pb2.ReadCheckpointRequest(app_id="app", generation=1, task_id="t", store="state")
            )
        ),
    ):
        assert data_loss(call) == {"kind": "task_report", "path": task_path("app", 1, "t")}
    got = stub.GetSnapshot(
        snapshot_pb2.GetSnapshotRequest(app_id="app", generation=2, include_checkpoints=True)
    )
    assert dict(got.tasks[0].checkpoints) == {"state": b"payload-2"}
    # The listing sweep cannot tell what the report references: every object of it stays.
    env.clock.advance(2 * HOUR_MS)
    env.janitor_pass()
    assert len(env.objects("snapshots/app/1/")) == 1
    assert (
        f"snapshot orphan sweep: skipping the corrupt task_report at {task_path('app', 1, 't')}"
        in caplog.text
    )


@pytest.mark.parametrize("how", ["truncated", "garbled"])
def test_a_garbled_checkpoint_object_is_refused_not_served(env: Env, how: str) -> None:
    stub = snapshot_pb2_grpc.SnapshotServiceStub(env.channel)
    make_snapshots(stub, "app", 2)
    (key,) = env.objects("snapshots/app/1/")
    env.corrupt_object(key, CORRUPTIONS[how])
    full = snapshot_pb2.GetSnapshotRequest(app_id="app", generation=1, include_checkpoints=True)
    assert data_loss(lambda: stub.GetSnapshot(full)) == {"kind": "checkpoint_payload", "path": key}
    read = snapshot_pb2.ReadCheckpointRequest(app_id="app", generation=1, task_id="t", store="state")
    assert data_loss(lambda: list(stub.ReadCheckpoint(read))) == {"kind": "checkpoint_payload", "path": key}
    # The header and the other generation read as before.
    assert stub.GetSnapshot(snapshot_pb2.GetSnapshotRequest(app_id="app", generation=1)).generation == 1
    good = stub.GetSnapshot(
        snapshot_pb2.GetSnapshotRequest(app_id="app", generation=2, include_checkpoints=True)
    )
    assert dict(good.tasks[0].checkpoints) == {"state": b"payload-2"}


# --- leases and pins ------------------------------------------------------------------------------


def pinned_snapshots(env: Env, leases: dict[str, int]) -> snapshot_pb2_grpc.SnapshotServiceStub:
    """Three completed generations of "app" keeping the last one, and ``leases`` (lease id ->
    the generation it pins, for a minute)."""
    snapshots = snapshot_pb2_grpc.SnapshotServiceStub(env.channel)
    make_snapshots(snapshots, "app", 3)
    snapshots.SetRetentionPolicy(
        snapshot_pb2.SetRetentionPolicyRequest(app_id="app", keep_last_completed=1), timeout=30
    )
    stub = lease_pb2_grpc.LeaseServiceStub(env.channel)
    for lease_id, generation in leases.items():
        stub.AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(
                lease_id=lease_id,
                duration_ms=60_000,
                snapshots=[common_pb2.SnapshotRef(app_id="app", generation=generation)],
            ),
            timeout=30,
        )
    return snapshots


@pytest.mark.parametrize("how", ["mistyped", "newer"])
def test_a_corrupt_lease_record_keeps_its_snapshot_pinned(
    env: Env, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Also a lease a newer release wrote: an older replica's janitor must not take it for gone."""
    snapshots = pinned_snapshots(env, {"l1": 1, "l2": 2})
    leases = lease_pb2_grpc.LeaseServiceStub(env.channel)
    env.corrupt("/leases/records/l1", CORRUPTIONS[how])
    info = unreadable(how, lambda: leases.GetLease(lease_pb2.GetLeaseRequest(lease_id="l1")))
    assert info == {"kind": "lease", "path": "/leases/records/l1"}
    assert leases.GetLease(lease_pb2.GetLeaseRequest(lease_id="l2"), timeout=30).lease_id == "l2"
    caplog.set_level(logging.WARNING, logger=CORRUPTION_LOG)
    assert [lease.lease_id for lease in leases.ListLeases(lease_pb2.ListLeasesRequest()).leases] == ["l2"]

    # Both leases expire: l2 goes and releases generation 2 to retention; l1 cannot be read, so
    # generation 1, which it may hold, stays.
    env.clock.advance(HOUR_MS)
    caplog.clear()
    env.janitor_pass()
    env.janitor_pass()  # retention of what l2's expiry released
    assert skipping("lease expiry", how, "lease", "/leases/records/l1") in caplog.text
    assert env.stores.metadata.get("/leases/records/l2") is None
    assert generations(snapshots, "app") == [1, 3]
    assert len(env.objects("snapshots/app/1/")) == 1
    assert env.counted("lease") >= (0 if how == "newer" else 2)


def test_a_corrupt_pin_index_keeps_its_snapshot(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    snapshots = pinned_snapshots(env, {"l1": 1})
    env.corrupt("/snapshots/pins/app@1", garbled)
    delete = snapshot_pb2.DeleteSnapshotRequest(app_id="app", generation=1)
    assert data_loss(lambda: snapshots.DeleteSnapshot(delete)) == {
        "kind": "pin_index",
        "path": "/snapshots/pins/app@1",
    }
    assert snapshots.GetSnapshot(snapshot_pb2.GetSnapshotRequest(app_id="app", generation=1)).generation == 1
    caplog.set_level(logging.WARNING, logger=CORRUPTION_LOG)
    env.clock.advance(HOUR_MS)  # the lease is long expired: only its unreadable pin index holds 1
    env.janitor_pass()
    env.janitor_pass()
    assert generations(snapshots, "app") == [1, 3]
    assert "snapshot retention: skipping the corrupt pin_index at /snapshots/pins/app@1" in caplog.text
    assert len(env.objects("snapshots/app/1/")) == 1


# --- backlog ----------------------------------------------------------------------------------------


def test_a_corrupt_backlog_job_record_and_boundaries_object(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    stub = backlog_pb2_grpc.BacklogServiceStub(env.channel)
    for job_id in ("j1", "j2", "j3", "j4"):
        stub.MarkBacklog(backlog_pb2.MarkBacklogRequest(job_id=job_id, boundaries=offsets(3)), timeout=30)
    (j1_object,) = env.objects("backlog/j1/")
    (j3_object,) = env.objects("backlog/j3/")
    env.corrupt("/backlog/jobs/j1", truncated)
    env.corrupt_object(j3_object, mistyped)
    (shard,) = [n for n in env.stores.metadata.children("/backlog/jobs/j4") if n.startswith("s-")]
    env.corrupt(f"/backlog/jobs/j4/{shard}", newer)
    with env.replica() as channel:  # the marking replica answers from its copies (still right)
        other = backlog_pb2_grpc.BacklogServiceStub(channel)
        info = data_loss(lambda: other.GetBacklogStatus(backlog_pb2.GetBacklogStatusRequest(job_id="j1")))
        assert info == {"kind": "backlog_job_record", "path": "/backlog/jobs/j1"}
        info = data_loss(lambda: other.GetBacklogStatus(backlog_pb2.GetBacklogStatusRequest(job_id="j3")))
        assert info == {"kind": "backlog_boundaries_payload", "path": j3_object}
        info = newer_format(lambda: other.GetBacklogStatus(backlog_pb2.GetBacklogStatusRequest(job_id="j4")))
        assert info == {"kind": "backlog_progress_shard", "path": f"/backlog/jobs/j4/{shard}"}
        status = other.GetBacklogStatus(backlog_pb2.GetBacklogStatusRequest(job_id="j2"), timeout=30)
        assert status.processing_backlog and len(status.partitions) == 3
    caplog.set_level(logging.WARNING, logger=CORRUPTION_LOG)
    env.clock.advance(2 * HOUR_MS)
    env.janitor_pass()
    assert {j1_object, j3_object} <= env.objects("backlog/")
    assert "backlog orphan sweep: skipping the corrupt backlog_job_record at /backlog/jobs/j1" in caplog.text


# --- upload intents ----------------------------------------------------------------------------------


def test_a_corrupt_upload_intent_stops_every_listing_deletion(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """An intent names objects not committed yet; one that cannot be read may name any object, so
    the listing sweeps delete nothing (not even a true orphan) until it is repaired, and the intent
    sweep leaves it (and whatever it names) in place."""
    producers = producer_pb2_grpc.ProducerOffsetServiceStub(env.channel)
    producers.RegisterProducerOffsets(
        producer_pb2.RegisterProducerOffsetsRequest(producer_id="p1", offsets=offsets(2)), timeout=30
    )
    orphan = f"producers/p9/{'0' * 32}.json"
    env.stores.blobs.put(orphan, b"no record references this")
    bucket = f"{INTENTS}/{(env.clock.now_ms() // 60_000)}"
    env.stores.metadata.ensure_path(bucket)
    env.stores.metadata.create(f"{bucket}/corrupt", b'{"version":1,"keys":')
    env.clock.advance(2 * HOUR_MS)
    caplog.set_level(logging.WARNING, logger=CORRUPTION_LOG)
    done = env.janitor_pass()
    assert orphan in env.objects("producers/")
    assert done["producer-orphans"] == 0 and done["orphan-intents"] == 0
    assert f"orphan intent sweep: skipping the corrupt upload_intent at {bucket}/corrupt" in caplog.text
    assert f"producer orphan sweep: skipping the corrupt upload_intent at {bucket}/corrupt" in caplog.text
    assert env.stores.metadata.get(f"{bucket}/corrupt") is not None
    assert env.counted("upload_intent") >= 2
    # Repaired (the intent removed), the next pass sweeps the orphan.
    env.stores.metadata.delete(f"{bucket}/corrupt")
    env.clock.advance(HOUR_MS)

    def swept() -> bool:
        env.janitor_pass()  # the listing sweeps run once --orphan-listing-interval has passed
        return orphan not in env.objects("producers/")

    wait_until(swept, timeout=30, interval=0.2, what="the listing sweep to delete the orphan")
