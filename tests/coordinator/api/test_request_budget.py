"""The ZooKeeper requests one call of each hot RPC sends, on a real ZooKeeper and S3: a regression
guard for the performance work (every request is a round trip through kazoo's connection thread;
the benchmark, ``bench/hot_rpcs.py``, shows what each costs).

Each case warms up first (parent paths made, caches filled, as on a running server), then counts
the requests of one call on the coordinator's own kazoo client, by kind, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from harness.coordinator import serve_in_process
from harness.zk_requests import count_requests
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.v1 import (
    backlog_pb2,
    backlog_pb2_grpc,
    common_pb2,
    lease_pb2,
    lease_pb2_grpc,
    producer_pb2,
    producer_pb2_grpc,
    snapshot_pb2,
    snapshot_pb2_grpc,
)


class Stubs:
    def __init__(self, channel: grpc.Channel) -> None:
        self.producers = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
        self.snapshots = snapshot_pb2_grpc.SnapshotServiceStub(channel)
        self.leases = lease_pb2_grpc.LeaseServiceStub(channel)
        self.backlog = backlog_pb2_grpc.BacklogServiceStub(channel)


@pytest.fixture
def served(zk_uri: str, s3_uri: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Stubs, list[str]]]:
    """Stubs of an in-process coordinator on ZooKeeper + S3, and the list its kazoo client's
    requests are appended to (their kinds: GetData, MultiRead, Transaction...)."""
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(s3_uri)
    sent = count_requests(metadata, monkeypatch).log
    try:
        with (
            serve_in_process(Deps(metadata=metadata, blobs=blobs)) as server,
            grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        ):
            yield Stubs(channel), sent
    finally:
        blobs.close()
        metadata.close()


def requests_of(sent: list[str], call: Callable[[], object]) -> list[str]:
    sent.clear()
    call()
    return list(sent)


def offsets(n: int) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream="s", partition=p, offset=1000 + p) for p in range(n)]


def test_producer_offsets(served: tuple[Stubs, list[str]]) -> None:
    stubs, sent = served
    register = stubs.producers.RegisterProducerOffsets
    register(producer_pb2.RegisterProducerOffsetsRequest(producer_id="warm", offsets=offsets(10)))
    # 10 offsets live in the record: the create-if-absent commit is the only request.
    small = producer_pb2.RegisterProducerOffsetsRequest(producer_id="p", offsets=offsets(10))
    assert requests_of(sent, lambda: register(small)) == ["Transaction"]
    get = stubs.producers.GetProducerOffsets
    assert requests_of(sent, lambda: get(producer_pb2.GetProducerOffsetsRequest(producer_id="p"))) == [
        "GetData"
    ]
    # Drop p and register p2: both records read together, then one commit.
    advance = producer_pb2.AdvanceProducerOffsetsRequest(
        producer_id="p2", offsets=offsets(10), previous_producer_id="p"
    )
    assert requests_of(sent, lambda: stubs.producers.AdvanceProducerOffsets(advance)) == [
        "MultiRead",
        "Transaction",
    ]
    # Offsets too large to be inline (200 here) go to S3. The pool of upload intents is empty: a
    # refill (one transaction making two, as the last batch of one was used up), then the record
    # with its expiry entry (retiring the intent).
    register(producer_pb2.RegisterProducerOffsetsRequest(producer_id="warm-large", offsets=offsets(200)))
    assert requests_of(
        sent,
        lambda: register(producer_pb2.RegisterProducerOffsetsRequest(producer_id="w2", offsets=offsets(200))),
    ) == ["Transaction", "Transaction"]
    # The next registration takes the intent left in the pool (made before its S3 put): one request.
    assert requests_of(
        sent,
        lambda: register(producer_pb2.RegisterProducerOffsetsRequest(producer_id="l", offsets=offsets(200))),
    ) == ["Transaction"]


def test_snapshots(served: tuple[Stubs, list[str]]) -> None:
    stubs, sent = served
    s = stubs.snapshots
    s.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id="warm", task_ids=["a"]))
    s.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["a", "b", "c", "d", "e"]))

    def report(task: str, size: int = 8 * 1024) -> None:
        s.ReportTaskSnapshot(
            snapshot_pb2.ReportTaskSnapshotRequest(
                app_id="app",
                generation=1,
                task=snapshot_pb2.TaskSnapshot(
                    task_id=task, committed_offsets=offsets(4), checkpoints={"state": b"x" * size}
                ),
            )
        )

    report("a")  # warm-up; "b" and "c" are reports that do not complete the snapshot, "e" one that does
    assert requests_of(sent, lambda: report("b")) == REPORT
    # A checkpoint small enough to be held in the report: no intent, no S3.
    assert requests_of(sent, lambda: report("c", 1024)) == INLINE_REPORT
    report("d")
    report("e")
    consistent = snapshot_pb2.GetCurrentSnapshotRequest(app_id="app", consistent=True)
    # The sync, and the header guessed (from this process's create, then from the last answer)
    # read with the pointer.
    assert requests_of(sent, lambda: s.GetCurrentSnapshot(consistent)) == ["Sync", "MultiRead"]
    assert requests_of(sent, lambda: s.GetCurrentSnapshot(consistent)) == ["Sync", "MultiRead"]
    get = snapshot_pb2.GetSnapshotRequest(app_id="app", generation=1, include_checkpoints=True)
    # The header (it lists the tasks), then every task node at once; payloads come from S3.
    assert requests_of(sent, lambda: s.GetSnapshot(get)) == ["GetData", "MultiRead"]
    # (Before any cached read: the cache's watch on the pointer would be re-armed after it.)
    create = snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["a"])
    assert requests_of(sent, lambda: s.CreateSnapshot(create)) == CREATE
    cached = snapshot_pb2.GetCurrentSnapshotRequest(app_id="app")
    s.GetCurrentSnapshot(cached)
    assert requests_of(sent, lambda: s.GetCurrentSnapshot(cached)) == []


def test_leases(served: tuple[Stubs, list[str]]) -> None:
    stubs, sent = served
    stubs.snapshots.CreateSnapshot(snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["a"]))
    stubs.snapshots.ReportTaskSnapshot(
        snapshot_pb2.ReportTaskSnapshotRequest(
            app_id="app",
            generation=1,
            task=snapshot_pb2.TaskSnapshot(task_id="a", committed_offsets=offsets(1)),
        )
    )
    ref = common_pb2.SnapshotRef(app_id="app", generation=1)
    leases = stubs.leases
    leases.AcquireSnapshots(
        lease_pb2.AcquireSnapshotsRequest(lease_id="warm", duration_ms=60_000, snapshots=[ref])
    )
    # A new lease on a snapshot: its header and pin index in one read, then one transaction.
    acquire = lease_pb2.AcquireSnapshotsRequest(lease_id="l", duration_ms=60_000, snapshots=[ref])
    assert requests_of(sent, lambda: leases.AcquireSnapshots(acquire)) == ["MultiRead", "Transaction"]
    # Renewing it: one transaction, of its record only (the pin index shared with the other
    # holders keeps the expiry it pinned with; this process's copy of the record is verified).
    renew = lease_pb2.RenewLeaseRequest(lease_id="l", duration_ms=60_000)
    assert requests_of(sent, lambda: leases.RenewLease(renew)) == ["Transaction"]
    # Acquiring it again on the snapshot it holds: the same (the held snapshot's index stays).
    assert requests_of(sent, lambda: leases.AcquireSnapshots(acquire)) == ["Transaction"]
    # A lease on no snapshot: one transaction each (this process's copy of the record is verified
    # by the transaction itself).
    bare = lease_pb2.AcquireSnapshotsRequest(lease_id="bare", duration_ms=60_000)
    assert requests_of(sent, lambda: leases.AcquireSnapshots(bare)) == ["Transaction"]
    renew_bare = lease_pb2.RenewLeaseRequest(lease_id="bare", duration_ms=60_000)
    assert requests_of(sent, lambda: leases.RenewLease(renew_bare)) == ["Transaction"]


def test_backlog(served: tuple[Stubs, list[str]]) -> None:
    stubs, sent = served
    b = stubs.backlog
    b.MarkBacklog(
        backlog_pb2.MarkBacklogRequest(
            job_id="job",
            boundaries=[common_pb2.Offset(stream="s", partition=p, offset=10**12) for p in range(100)],
        )
    )

    def progress(k: int) -> backlog_pb2.ReportProgressRequest:
        return backlog_pb2.ReportProgressRequest(
            job_id="job",
            positions=[common_pb2.Offset(stream="s", partition=p, offset=1000 * k) for p in range(100)],
        )

    b.ReportProgress(progress(1))
    assert requests_of(sent, lambda: b.ReportProgress(progress(2))) == PROGRESS


#: A report with one inline checkpoint (not the last), a CreateSnapshot of a new generation of an
#: app whose pointer this process wrote, a ReportProgress of a job marked through this process.
#: (The reports: to a snapshot this process created, so its copies of the header and the report
#: counter stand in for their read.)
REPORT = ["Create2", "Transaction"]  # the intent (before the S3 put), the commit
INLINE_REPORT = ["Transaction"]  # the commit
CREATE = ["GetData", "Transaction"]  # the header the copy of the pointer names, the commit
PROGRESS = ["Transaction"]  # the commit (the copies of the job record and of its shard stand in for reads)
