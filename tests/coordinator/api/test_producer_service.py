"""ProducerOffsetService over gRPC: status codes, two coordinator processes, the janitor at work."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient

from harness.coordinator import CoordinatorProcess, embedded_deps, serve_in_process
from harness.process import wait_until
from harness.seaweed import SeaweedS3Server
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.v1 import common_pb2, producer_pb2, producer_pb2_grpc


def offsets(*triples: tuple[str, int, int]) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream=s, partition=p, offset=o) for s, p, o in triples]


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[producer_pb2_grpc.ProducerOffsetServiceStub]:
    with embedded_deps(tmp_path) as deps, serve_in_process(deps) as coord, coord.channel() as channel:
        yield producer_pb2_grpc.ProducerOffsetServiceStub(channel)


def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    assert isinstance(call, grpc.RpcError) and isinstance(call, grpc.Call)
    return call.code(), call.details() or ""


def test_round_trip_and_codes(stub: producer_pb2_grpc.ProducerOffsetServiceStub) -> None:
    reply = stub.RegisterProducerOffsets(
        producer_pb2.RegisterProducerOffsetsRequest(producer_id="sink-1", offsets=offsets(("orders", 0, 42))),
        timeout=10,
    )
    assert reply.registered and reply.snapshot.offsets[0].offset == 42
    assert reply.snapshot.expires_at_ms - reply.snapshot.created_at_ms == 24 * 3_600_000
    got = stub.GetProducerOffsets(producer_pb2.GetProducerOffsetsRequest(producer_id="sink-1"), timeout=10)
    assert got == reply.snapshot
    listed = stub.ListProducerOffsets(producer_pb2.ListProducerOffsetsRequest(), timeout=10)
    assert list(listed.snapshots) == [reply.snapshot] and listed.next_page_token == ""
    deleted = stub.DeleteProducerOffsets(
        producer_pb2.DeleteProducerOffsetsRequest(producer_id="sink-1"), timeout=10
    )
    assert deleted.deleted
    with pytest.raises(grpc.RpcError) as e:
        stub.GetProducerOffsets(producer_pb2.GetProducerOffsetsRequest(producer_id="sink-1"), timeout=10)
    assert status_of(e.value) == (
        grpc.StatusCode.NOT_FOUND,
        "no producer offsets are registered for producer_id 'sink-1'",
    )


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            producer_pb2.RegisterProducerOffsetsRequest(producer_id="", offsets=offsets(("a", 0, 1))),
            "producer_id is required",
        ),
        (producer_pb2.RegisterProducerOffsetsRequest(producer_id="p"), "offsets is empty"),
        (
            producer_pb2.RegisterProducerOffsetsRequest(
                producer_id="p", offsets=offsets(("a", 0, 1), ("a", 0, 2))
            ),
            "offsets[1] repeats stream 'a' partition 0",
        ),
        (
            producer_pb2.RegisterProducerOffsetsRequest(
                producer_id="p", offsets=offsets(("a", 0, 1)), ttl_ms=-1
            ),
            "ttl_ms is -1",
        ),
    ],
)
def test_bad_registrations_are_invalid_argument_and_store_nothing(
    stub: producer_pb2_grpc.ProducerOffsetServiceStub,
    request_: producer_pb2.RegisterProducerOffsetsRequest,
    message: str,
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        stub.RegisterProducerOffsets(request_, timeout=10)
    code, details = status_of(e.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    assert stub.ListProducerOffsets(producer_pb2.ListProducerOffsetsRequest(), timeout=10).snapshots == []


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (
            producer_pb2.AdvanceProducerOffsetsRequest(producer_id="q.b1", offsets=offsets(("a", 0, 1))),
            "previous_producer_id is empty",
        ),
        (
            producer_pb2.AdvanceProducerOffsetsRequest(
                producer_id="q.b0", offsets=offsets(("a", 0, 1)), previous_producer_id="q.b0"
            ),
            "previous_producer_id equals producer_id",
        ),
        (
            producer_pb2.AdvanceProducerOffsetsRequest(producer_id="q.b1", previous_producer_id="q.b0"),
            "offsets is empty",
        ),
    ],
)
def test_bad_advances_are_invalid_argument_and_change_nothing(
    stub: producer_pb2_grpc.ProducerOffsetServiceStub,
    request_: producer_pb2.AdvanceProducerOffsetsRequest,
    message: str,
) -> None:
    stored = stub.RegisterProducerOffsets(
        producer_pb2.RegisterProducerOffsetsRequest(producer_id="q.b0", offsets=offsets(("a", 0, 1))),
        timeout=10,
    )
    with pytest.raises(grpc.RpcError) as e:
        stub.AdvanceProducerOffsets(request_, timeout=10)
    code, details = status_of(e.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    listed = stub.ListProducerOffsets(producer_pb2.ListProducerOffsetsRequest(), timeout=10).snapshots
    assert list(listed) == [stored.snapshot]


def test_s3_outage_is_unavailable_and_leaves_no_record(
    tmp_path: Path,
    zk_uri: str,
    kazoo_client: KazooClient,
    private_s3_server: SeaweedS3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", private_s3_server.endpoint_url)
    deps = Deps(metadata=open_metadata_store(zk_uri), blobs=open_blob_store(private_s3_server.uri("svc")))
    try:
        with serve_in_process(deps) as coord, coord.channel() as channel:
            stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
            private_s3_server.stop()
            # Offsets beyond the inline threshold (1 KiB by default) need the blob store.
            large = offsets(*(("a" * 40, p, 1) for p in range(40)))
            request = producer_pb2.RegisterProducerOffsetsRequest(producer_id="sink", offsets=large)
            with pytest.raises(grpc.RpcError) as e:
                stub.RegisterProducerOffsets(request, timeout=60)
            code, details = status_of(e.value)
            assert code == grpc.StatusCode.UNAVAILABLE and "unreachable" in details
            assert kazoo_client.exists("/producers") is None  # nothing at all reached ZooKeeper

            # Small offsets live in ZooKeeper: their calls never need S3.
            small = producer_pb2.RegisterProducerOffsetsRequest(
                producer_id="q.b0", offsets=offsets(("a", 0, 1))
            )
            assert stub.RegisterProducerOffsets(small, timeout=60).registered
            advance = producer_pb2.AdvanceProducerOffsetsRequest(
                producer_id="q.b1", offsets=offsets(("a", 0, 2)), previous_producer_id="q.b0"
            )
            advanced = stub.AdvanceProducerOffsets(advance, timeout=60)
            assert advanced.registered and advanced.previous_deleted
            got = stub.GetProducerOffsets(
                producer_pb2.GetProducerOffsetsRequest(producer_id="q.b1"), timeout=60
            )
            assert got.offsets[0].offset == 2
            assert stub.DeleteProducerOffsets(
                producer_pb2.DeleteProducerOffsetsRequest(producer_id="q.b1"), timeout=60
            ).deleted
            assert kazoo_client.get_children("/producers/records") == []
    finally:
        deps.blobs.close()
        deps.metadata.close()


def test_twenty_registrations_through_two_processes_have_one_winner(
    tmp_path: Path, zk_uri: str, s3_uri: str, kazoo_client: KazooClient
) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    with (
        CoordinatorProcess(tmp_path / "a", args=args) as a,
        CoordinatorProcess(tmp_path / "b", args=args) as b,
        grpc.insecure_channel(a.target) as ca,
        grpc.insecure_channel(b.target) as cb,
    ):
        stubs = [producer_pb2_grpc.ProducerOffsetServiceStub(c) for c in (ca, cb)]
        barrier = threading.Barrier(20)

        def register(i: int) -> producer_pb2.RegisterProducerOffsetsResponse:
            request = producer_pb2.RegisterProducerOffsetsRequest(
                producer_id="contended", offsets=offsets(("orders", 0, i))
            )
            barrier.wait()
            reply: producer_pb2.RegisterProducerOffsetsResponse = stubs[i % 2].RegisterProducerOffsets(
                request, timeout=60
            )
            return reply

        with ThreadPoolExecutor(20) as pool:
            replies = list(pool.map(register, range(20)))
        winners = [r for r in replies if r.registered]
        assert len(winners) == 1
        assert all(r.snapshot == winners[0].snapshot for r in replies)
        for stub in stubs:
            got = stub.GetProducerOffsets(
                producer_pb2.GetProducerOffsetsRequest(producer_id="contended"), timeout=10
            )
            assert got == winners[0].snapshot
        assert kazoo_client.get_children("/producers/records") == ["contended"]


def test_the_elected_janitor_expires_records(
    tmp_path: Path, zk_uri: str, s3_uri: str, kazoo_client: KazooClient
) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri, "--cleanup-interval", "200ms"]
    with (
        CoordinatorProcess(tmp_path / "a", args=args) as a,
        CoordinatorProcess(tmp_path / "b", args=args) as b,
        grpc.insecure_channel(a.target) as channel,
    ):
        stub = producer_pb2_grpc.ProducerOffsetServiceStub(channel)
        stub.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(
                producer_id="short", offsets=offsets(("a", 0, 1)), ttl_ms=300
            ),
            timeout=10,
        )
        stub.RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id="long", offsets=offsets(("a", 0, 1))),
            timeout=10,
        )
        wait_until(
            lambda: kazoo_client.get_children("/producers/records") == ["long"],
            timeout=30,
            what="the janitor to remove the expired record",
        )

        def leader_gauge(proc: CoordinatorProcess) -> float:
            text = urllib.request.urlopen(proc.metrics_url, timeout=10).read().decode()
            (line,) = [ln for ln in text.splitlines() if ln.startswith("snapcoord_janitor_leader ")]
            return float(line.split()[1])

        wait_until(
            lambda: sorted([leader_gauge(a), leader_gauge(b)]) == [0.0, 1.0], timeout=30, what="one leader"
        )
        expired_total = sum(
            float(ln.split()[1])
            for proc in (a, b)
            for ln in urllib.request.urlopen(proc.metrics_url, timeout=10).read().decode().splitlines()
            if ln.startswith("snapcoord_producer_records_expired_total ")
        )
        assert expired_total == 1.0
