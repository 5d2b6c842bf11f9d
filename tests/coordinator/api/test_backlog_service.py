"""BacklogService over gRPC: status codes, two coordinator processes, restarts, 10,000 partitions."""

from __future__ import annotations

import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient

from harness.coordinator import CoordinatorProcess, embedded_deps, serve_in_process
from harness.process import wait_until
from snapcoord.v1 import backlog_pb2, backlog_pb2_grpc, common_pb2


def offsets(*triples: tuple[str, int, int]) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream=s, partition=p, offset=o) for s, p, o in triples]


def partition(
    stream: str, partition: int, boundary: int, position: int, finished: bool
) -> backlog_pb2.PartitionBacklog:
    return backlog_pb2.PartitionBacklog(
        stream=stream, partition=partition, boundary=boundary, position=position, finished=finished
    )


def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    assert isinstance(call, grpc.RpcError) and isinstance(call, grpc.Call)
    return call.code(), call.details() or ""


def mark(
    stub: backlog_pb2_grpc.BacklogServiceStub,
    job_id: str,
    boundaries: list[common_pb2.Offset],
    reset: bool = False,
) -> backlog_pb2.BacklogStatus:
    reply: backlog_pb2.BacklogStatus = stub.MarkBacklog(
        backlog_pb2.MarkBacklogRequest(job_id=job_id, boundaries=boundaries, reset=reset), timeout=60
    )
    return reply


def report(
    stub: backlog_pb2_grpc.BacklogServiceStub, job_id: str, positions: list[common_pb2.Offset]
) -> backlog_pb2.ReportProgressResponse:
    reply: backlog_pb2.ReportProgressResponse = stub.ReportProgress(
        backlog_pb2.ReportProgressRequest(job_id=job_id, positions=positions), timeout=60
    )
    return reply


def get(stub: backlog_pb2_grpc.BacklogServiceStub, job_id: str) -> backlog_pb2.BacklogStatus:
    reply: backlog_pb2.BacklogStatus = stub.GetBacklogStatus(
        backlog_pb2.GetBacklogStatusRequest(job_id=job_id), timeout=60
    )
    return reply


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[backlog_pb2_grpc.BacklogServiceStub]:
    with embedded_deps(tmp_path) as deps, serve_in_process(deps) as coord, coord.channel() as channel:
        yield backlog_pb2_grpc.BacklogServiceStub(channel)


def test_round_trip_and_codes(stub: backlog_pb2_grpc.BacklogServiceStub) -> None:
    marked = mark(stub, "job-1", offsets(("orders", 1, 50), ("orders", 0, 100), ("orders", 2, 0)))
    assert marked == backlog_pb2.BacklogStatus(
        job_id="job-1",
        processing_backlog=True,
        partitions=[
            partition("orders", 0, 100, -1, False),
            partition("orders", 1, 50, -1, False),
            partition("orders", 2, 0, -1, True),  # empty: finished at once
        ],
    )
    reply = report(stub, "job-1", offsets(("orders", 0, 100), ("orders", 1, 20), ("other", 0, 9)))
    assert list(reply.newly_finished) == offsets(("orders", 0, 100))
    # The answer grows with what changed: no partition list (GetBacklogStatus has it).
    assert reply.status == backlog_pb2.BacklogStatus(job_id="job-1", processing_backlog=True)
    assert list(reply.unmarked) == offsets(("other", 0, 9))  # answered, not dropped
    assert list(get(stub, "job-1").partitions) == [
        partition("orders", 0, 100, 100, True),
        partition("orders", 1, 50, 20, False),
        partition("orders", 2, 0, -1, True),
    ]
    done = report(stub, "job-1", offsets(("orders", 1, 50), ("orders", 0, 100)))
    assert list(done.newly_finished) == offsets(("orders", 1, 50))
    assert not done.status.processing_backlog

    stored = get(stub, "job-1")
    assert [p.finished for p in stored.partitions] == [True, True, True] and not stored.processing_backlog
    assert mark(stub, "job-1", offsets(("orders", 0, 999))) == stored  # first mark wins
    # A partition the mark lacks is added at its own boundary; the others keep theirs.
    grown = mark(stub, "job-1", offsets(("orders", 0, 999), ("orders", 3, 40)))
    assert list(grown.added) == offsets(("orders", 3, 40))
    assert grown.processing_backlog
    assert list(grown.partitions) == [*stored.partitions, partition("orders", 3, 40, -1, False)]
    assert grown.unmarked_partitions == 1  # other/0, reported above
    assert get(stub, "job-1") == backlog_pb2.BacklogStatus(
        job_id="job-1", processing_backlog=True, partitions=grown.partitions, unmarked_partitions=1
    )

    cleared = stub.ClearBacklog(backlog_pb2.ClearBacklogRequest(job_id="job-1"), timeout=10)
    assert cleared.cleared
    assert not stub.ClearBacklog(backlog_pb2.ClearBacklogRequest(job_id="job-1"), timeout=10).cleared
    for call in (lambda: get(stub, "job-1"), lambda: report(stub, "job-1", offsets(("orders", 0, 1)))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert status_of(e.value) == (
            grpc.StatusCode.NOT_FOUND,
            "no backlog is marked for job_id 'job-1'; call MarkBacklog first",
        )


@pytest.mark.parametrize(
    ("method", "request_", "message"),
    [
        (
            "MarkBacklog",
            backlog_pb2.MarkBacklogRequest(boundaries=offsets(("a", 0, 1))),
            "job_id is required",
        ),
        ("MarkBacklog", backlog_pb2.MarkBacklogRequest(job_id="job-2"), "boundaries is empty"),
        (
            "MarkBacklog",
            backlog_pb2.MarkBacklogRequest(
                job_id="job-1", boundaries=offsets(("a", 0, 1), ("a", 0, 2)), reset=True
            ),
            "boundaries[1] repeats stream 'a' partition 0 (first at boundaries[0])",
        ),
        (
            "ReportProgress",
            backlog_pb2.ReportProgressRequest(job_id="job-1", positions=offsets(("a", 0, 5), ("a", 1, -3))),
            "positions[1].offset is -3 for a/1; offsets are 0 or more, or -1 for no data",
        ),
        (
            "ReportProgress",
            backlog_pb2.ReportProgressRequest(job_id="job-1", positions=offsets(("a", 0, 5), ("a", 0, 6))),
            "positions[1] repeats stream 'a' partition 0",
        ),
        (
            "ReportProgress",
            backlog_pb2.ReportProgressRequest(job_id="job 1", positions=offsets(("a", 0, 5))),
            "job_id 'job 1' contains ' '",
        ),
    ],
)
def test_bad_requests_are_invalid_argument_and_change_nothing(
    stub: backlog_pb2_grpc.BacklogServiceStub,
    method: str,
    request_: backlog_pb2.MarkBacklogRequest | backlog_pb2.ReportProgressRequest,
    message: str,
) -> None:
    mark(stub, "job-1", offsets(("a", 0, 10), ("a", 1, 10)))
    report(stub, "job-1", offsets(("a", 0, 4)))
    before = get(stub, "job-1")
    with pytest.raises(grpc.RpcError) as e:
        getattr(stub, method)(request_, timeout=10)
    code, details = status_of(e.value)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    assert get(stub, "job-1") == before
    with pytest.raises(grpc.RpcError) as e:
        get(stub, "job-2")
    assert status_of(e.value)[0] == grpc.StatusCode.NOT_FOUND


def test_ten_thousand_partitions_with_the_longest_stream_names(tmp_path: Path) -> None:
    """The worst case for message sizes: 10,000 streams of 200 characters (a ~2.4 MB status,
    within gRPC's default 4 MB)."""
    streams = [f"{i:05d}-" + "s" * 194 for i in range(10_000)]
    with embedded_deps(tmp_path) as deps, serve_in_process(deps) as coord, coord.channel() as channel:
        stub = backlog_pb2_grpc.BacklogServiceStub(channel)
        marked = mark(stub, "big", [common_pb2.Offset(stream=s, partition=0, offset=1000) for s in streams])
        assert len(marked.partitions) == 10_000 and marked.ByteSize() < 4 * 1024 * 1024
        reply = report(stub, "big", [common_pb2.Offset(stream=s, partition=0, offset=1000) for s in streams])
        assert len(reply.newly_finished) == 10_000
        assert not reply.status.processing_backlog
        stored = get(stub, "big")
        assert len(stored.partitions) == 10_000 and all(p.finished for p in stored.partitions)
        assert stored.partitions[0].stream == streams[0] and len(stored.partitions[0].stream) == 200


def scrape(proc: CoordinatorProcess, name: str) -> float:
    text = urllib.request.urlopen(proc.metrics_url, timeout=10).read().decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


def test_exactly_once_through_two_processes_and_gauges_from_the_janitor(
    tmp_path: Path, zk_uri: str, s3_uri: str, kazoo_client: KazooClient
) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri, "--cleanup-interval", "200ms"]
    partitions = [(s, p) for s in ("clicks", "orders") for p in range(20)]
    with (
        CoordinatorProcess(tmp_path / "a", args=args) as a,
        CoordinatorProcess(tmp_path / "b", args=args) as b,
        grpc.insecure_channel(a.target) as ca,
        grpc.insecure_channel(b.target) as cb,
    ):
        stubs = [backlog_pb2_grpc.BacklogServiceStub(c) for c in (ca, cb)]
        mark(stubs[0], "job-1", offsets(*[(s, p, 100) for s, p in partitions]))
        mark(stubs[1], "idle", offsets(("orders", 0, 5), ("orders", 1, 5), ("orders", 2, 5)))
        barrier = threading.Barrier(20)

        def named(i: int) -> list[tuple[str, int]]:
            return [partitions[(i * 2 + j) % 40] for j in range(10)]

        def report_as(i: int) -> backlog_pb2.ReportProgressResponse:
            positions = offsets(*[(s, p, 90 + i) for s, p in named(i)])
            barrier.wait()
            return report(stubs[i % 2], "job-1", positions)

        with ThreadPoolExecutor(20) as pool:
            replies = list(pool.map(report_as, range(20)))
        finished = Counter((o.stream, o.partition) for r in replies for o in r.newly_finished)
        assert finished and max(finished.values()) == 1, "a partition was reported finished twice"
        final = get(stubs[1], "job-1")
        assert set(finished) == {(p.stream, p.partition) for p in final.partitions if p.finished}
        for p in final.partitions:
            assert p.position == 90 + max(i for i in range(20) if (p.stream, p.partition) in named(i))
        assert get(stubs[0], "job-1") == final  # both replicas read the same ZooKeeper
        assert sorted(kazoo_client.get_children("/backlog/jobs")) == ["idle", "job-1"]

        # The elected janitor exports the cluster's gauges; the other replica exports 0.
        behind = sum(1 for p in final.partitions if not p.finished)
        assert behind > 0  # reporters 0-9 stay behind the boundary on some partitions
        expected = {
            "snapcoord_backlog_jobs_processing": 2.0,
            "snapcoord_backlog_partitions_remaining": behind + 3.0,
        }
        wait_until(
            lambda: (
                all(max(scrape(a, n), scrape(b, n)) == v for n, v in expected.items())
                and all(min(scrape(a, n), scrape(b, n)) == 0.0 for n in expected)
            ),
            timeout=30,
            what=f"the janitor's gauges to read {expected}",
        )
        finished_total = scrape(a, "snapcoord_backlog_partitions_finished_total") + scrape(
            b, "snapcoord_backlog_partitions_finished_total"
        )
        assert finished_total == len(finished)


def test_marks_survive_coordinator_and_driver_restarts(tmp_path: Path, zk_uri: str, s3_uri: str) -> None:
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    boundaries = offsets(("orders", 0, 100), ("orders", 1, 100))
    with CoordinatorProcess(tmp_path / "a", args=args) as a:
        with grpc.insecure_channel(a.target) as channel:
            stub = backlog_pb2_grpc.BacklogServiceStub(channel)
            mark(stub, "job-1", boundaries)
            assert (
                len(report(stub, "job-1", offsets(("orders", 0, 100), ("orders", 1, 30))).newly_finished) == 1
            )
            before = get(stub, "job-1")
        a.kill()  # a crash: nothing flushed, nothing closed
    with (
        CoordinatorProcess(tmp_path / "b", args=args) as b,
        grpc.insecure_channel(b.target) as channel,  # the restarted driver's new channel
    ):
        stub = backlog_pb2_grpc.BacklogServiceStub(channel)
        assert get(stub, "job-1") == before
        # The restarted driver marks again with the end offsets of now: it gets the first mark.
        assert mark(stub, "job-1", offsets(("orders", 0, 500), ("orders", 1, 500))) == before
        reply = report(stub, "job-1", offsets(("orders", 0, 120), ("orders", 1, 100)))
        assert list(reply.newly_finished) == offsets(("orders", 1, 100))  # orders/0: reported before
        assert not reply.status.processing_backlog
        # reset=true is how a driver starts over deliberately.
        reset = mark(stub, "job-1", offsets(("orders", 0, 500)), reset=True)
        assert list(reset.partitions) == [partition("orders", 0, 500, -1, False)]
