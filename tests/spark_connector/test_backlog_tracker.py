"""The backlog tracker and the listener on progress built from Spark's own JSON (Kafka sources from
the Structured Streaming guide's progress example), against a real coordinator in-process: the
mark, FLIP-309's flag turned on again past the lag bound and off when caught up, requests after a
restart, unknown formats, and reports that survive an outage."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.listener import QueryIdleEvent, QueryProgressEvent, StreamingQueryProgress

from harness.coordinator import embedded_deps, serve_in_process
from harness.faults import TcpProxy
from harness.process import wait_until
from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.backlog.listener import SnapcoordListener
from snapcoord.spark_connector.backlog.tracker import BacklogBound, BacklogTracker, lag

RUN = str(uuid.uuid4())


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with embedded_deps(tmp_path_factory.mktemp("coordinator")) as deps, serve_in_process(deps) as server:
        yield server.target


@pytest.fixture(scope="module")
def client(target: str) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(target, timeout_s=10) as c:
        yield c


def kafka(offsets: dict[int, int]) -> dict[str, Any]:
    return {"topic-0": {str(p): o for p, o in offsets.items()}}


def progress(
    batch_id: int, end: Any, latest: Any = None, *, name: str = "q", run_id: str = RUN
) -> StreamingQueryProgress:
    """A progress as Spark 4 sends it (``fromJson`` of its JSON), one Kafka-like source."""
    source = {
        "description": "KafkaV2[Subscribe[topic-0]]",
        "startOffset": None,
        "endOffset": end,
        "latestOffset": latest,
        "numInputRows": 10,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": 0.0,
    }
    return StreamingQueryProgress.fromJson(
        {
            "id": str(uuid.uuid4()),
            "runId": run_id,
            "name": name,
            "timestamp": "2026-11-23T00:00:00.000Z",
            "batchId": batch_id,
            "batchDuration": 1,
            "numInputRows": 10,
            "stateOperators": [],
            "sources": [source],
            "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
        }
    )


def s(partition: int, offset: int) -> Offset:
    return Offset("q.0:topic-0", partition, offset)


def test_lag() -> None:
    assert lag([s(0, 5), s(1, 7)], [s(0, 9), s(1, 7), s(2, 3)]) == 4 + 0 + 3
    assert lag([s(0, 9)], [s(0, 5)]) == 0  # never negative
    assert lag([s(0, 5)], []) is None  # no latest offsets: unknown


def test_flag_on_past_the_lag_bound_and_off_when_caught_up(client: CoordinatorClient) -> None:
    job = f"lag-{uuid.uuid4().hex[:8]}"
    tracker = BacklogTracker(client, job, "q", bound=BacklogBound(max_lag=100))
    # Batch 0: the boundary is the latest offsets Kafka reports.
    assert tracker.observe(progress(0, kafka({0: 100, 1: 50}), kafka({0: 1000, 1: 60}))) is False
    assert tracker.mark is not None
    assert [(p.stream, p.partition, p.boundary) for p in tracker.mark.partitions] == [
        ("q.0:topic-0", 0, 1000),
        ("q.0:topic-0", 1, 60),
    ]
    assert tracker.processing_backlog is True and not tracker.caught_up()
    # Far behind, but already processing backlog: no reset.
    assert tracker.observe(progress(1, kafka({0: 500, 1: 60}), kafka({0: 2000, 1: 60}))) is False
    assert tracker.observe(progress(2, kafka({0: 1000, 1: 60}), kafka({0: 1050, 1: 60}))) is False
    assert tracker.caught_up() and tracker.resets == 0
    assert not client.get_backlog_status(job).processing_backlog
    # Caught up, then 50 behind: within the bound.
    assert tracker.observe(progress(3, kafka({0: 1100, 1: 60}), kafka({0: 1150, 1: 60}))) is False
    assert tracker.caught_up()
    # 101 behind: backlog again, to the latest offsets.
    assert tracker.observe(progress(4, kafka({0: 1200, 1: 60}), kafka({0: 1301, 1: 60}))) is True
    assert tracker.resets == 1 and tracker.processing_backlog is True
    status = client.get_backlog_status(job)
    assert status.processing_backlog
    assert [(p.boundary, p.position) for p in status.partitions] == [(1301, 1200), (60, 60)]
    assert tracker.observe(progress(5, kafka({0: 1301, 1: 61}), kafka({0: 1310, 1: 61}))) is False
    assert tracker.caught_up() and not client.get_backlog_status(job).processing_backlog
    # The same batch again (a listener and a poll both saw it) is handled once.
    assert tracker.observe(progress(4, kafka({0: 1200, 1: 60}), kafka({0: 5000, 1: 60}))) is False
    assert tracker.resets == 1 and tracker.errors == 0


def test_a_request_resets_the_mark_with_the_next_batch(client: CoordinatorClient) -> None:
    job = f"req-{uuid.uuid4().hex[:8]}"
    first = BacklogTracker(client, job, "q")
    first.observe(progress(0, kafka({0: 10}), kafka({0: 10})))
    assert first.caught_up()
    # A restarted driver after downtime: a new tracker asked to turn the flag on again. Without
    # the request, the first mark would win and the job would count as caught up.
    again = BacklogTracker(client, job, "q")
    again.request_backlog()
    assert not again.caught_up()
    assert again.observe(progress(1, kafka({0: 20}), kafka({0: 90}), run_id=str(uuid.uuid4()))) is True
    assert again.resets == 1
    assert [(p.boundary, p.position) for p in client.get_backlog_status(job).partitions] == [(90, 20)]
    assert not again.caught_up()


def test_unknown_offsets_are_counted_not_raised(client: CoordinatorClient) -> None:
    tracker = BacklogTracker(client, f"unknown-{uuid.uuid4().hex[:8]}", "q")
    assert tracker.observe(progress(0, {"shards": [1, 2]})) is False
    assert tracker.errors == 1 and tracker.mark is None and not tracker.pending


def test_an_outage_keeps_reports_pending_until_delivered(tmp_path: Path, target: str) -> None:
    """No progress comes after the last batch; ``flush`` (the runner's poll, the listener's idle
    event) delivers the mark and the last report once the coordinator is reachable."""
    job = f"outage-{uuid.uuid4().hex[:8]}"
    host, port = target.rsplit(":", 1)
    with TcpProxy(host, int(port)) as proxy, CoordinatorClient(proxy.address, timeout_s=5) as client:
        listener = SnapcoordListener(client, {"q": job}, call_timeout_s=0.5)
        proxy.cut()
        listener.onQueryProgress(QueryProgressEvent(progress(0, kafka({0: 5}), kafka({0: 9}))))
        listener.onQueryProgress(QueryProgressEvent(progress(1, kafka({0: 9}), kafka({0: 9}))))
        listener.onQueryProgress(QueryProgressEvent(progress(1, kafka({0: 9}), name="other")))  # ignored
        tracker = listener.trackers["q"]
        assert tracker.pending and listener.errors >= 2 and listener.backlog_mark(job) is None
        assert listener.flush() is False
        proxy.restore()
        idle = QueryIdleEvent.fromJson({"id": RUN, "runId": RUN, "timestamp": "t"})

        def delivered_on_idle() -> bool:  # the channel reconnects with backoff: idle events repeat
            listener.onQueryIdle(idle)
            return not tracker.pending

        wait_until(delivered_on_idle, timeout=60, interval=0.2, what="the pending reports to be delivered")
        status = client.get_backlog_status(job)
        assert [(p.boundary, p.position, p.finished) for p in status.partitions] == [(9, 9, True)]
        result = listener.last_progress_result(job)
        assert result is not None and result.newly_finished == (s(0, 9),)
        last = listener.last_batch("q")
        assert last is not None and last.report_id == f"{RUN}.1"


def test_a_batch_without_offsets_marks_nothing_yet(client: CoordinatorClient) -> None:
    job = f"empty-{uuid.uuid4().hex[:8]}"
    tracker = BacklogTracker(client, job, "q")
    tracker.request_backlog()
    assert tracker.observe(progress(0, None)) is False
    assert tracker.mark is None and not tracker.pending and tracker.errors == 0
    assert tracker.observe(progress(1, kafka({0: 3}), kafka({0: 8}))) is True  # the request holds
    assert [(p.boundary, p.position) for p in client.get_backlog_status(job).partitions] == [(8, 3)]


def test_a_partition_the_topic_gains_while_caught_up_is_marked_at_its_latest_offset(
    client: CoordinatorClient,
) -> None:
    """The issue's walk-through, Kafka-shaped: the topic gets partition 2 after the mark. The
    batch that shows it first marks it at its latest offset (the others keep their boundaries and
    progress), the flag is on again while it is behind, and off once it caught up."""
    job = f"grow-{uuid.uuid4().hex[:8]}"
    tracker = BacklogTracker(client, job, "q")
    tracker.observe(progress(0, kafka({0: 100, 1: 100}), kafka({0: 100, 1: 100})))
    assert tracker.caught_up() and tracker.added == []
    turned_on = tracker.observe(progress(1, kafka({0: 110, 1: 100, 2: 10}), kafka({0: 110, 1: 100, 2: 500})))
    assert turned_on is True
    assert tracker.added == [s(2, 500)] and tracker.resets == 0 and not tracker.caught_up()
    status = client.get_backlog_status(job)
    assert [(p.partition, p.boundary, p.position, p.finished) for p in status.partitions] == [
        (0, 100, 110, True),
        (1, 100, 100, True),
        (2, 500, 10, False),
    ]
    assert status.processing_backlog and status.unmarked_partitions == 0
    # Behind, still: no second grow, no reset. Then caught up.
    behind, caught_up = kafka({0: 110, 1: 100, 2: 300}), kafka({0: 120, 1: 100, 2: 520})
    assert tracker.observe(progress(2, behind, caught_up)) is False
    assert tracker.observe(progress(3, caught_up, caught_up)) is False
    assert tracker.caught_up() and tracker.added == [s(2, 500)] and tracker.errors == 0


def test_a_partition_a_new_driver_sees_is_added_by_its_first_mark(client: CoordinatorClient) -> None:
    """A restarted driver marks with every partition its source has now: the coordinator keeps
    the stored boundaries and adds the new partition (the first mark no longer hides it)."""
    job = f"restart-grow-{uuid.uuid4().hex[:8]}"
    BacklogTracker(client, job, "q").observe(progress(0, kafka({0: 5}), kafka({0: 40})))
    again = BacklogTracker(client, job, "q")
    again.observe(progress(1, kafka({0: 20, 1: 0}), kafka({0: 90, 1: 30}), run_id=str(uuid.uuid4())))
    assert again.added == [s(1, 30)]
    status = client.get_backlog_status(job)
    assert [(p.partition, p.boundary, p.position) for p in status.partitions] == [(0, 40, 20), (1, 30, 0)]


def test_partitions_the_coordinator_answers_unmarked_are_marked_in_the_same_flush(
    client: CoordinatorClient,
) -> None:
    """Another driver reset the mark to partition 0 alone: this tracker's next report names
    partition 1, the coordinator answers it unmarked, and the tracker marks it at once, at the
    latest offset it knows for it."""
    job = f"unmarked-{uuid.uuid4().hex[:8]}"
    tracker = BacklogTracker(client, job, "q")
    tracker.observe(progress(0, kafka({0: 10, 1: 10}), kafka({0: 10, 1: 10})))
    client.mark_backlog(job, [s(0, 10)], reset=True)
    tracker.observe(progress(1, kafka({0: 10, 1: 12}), kafka({0: 10, 1: 80})))
    assert tracker.last_result is not None and tracker.last_result.unmarked == (s(1, 12),)
    assert not tracker.pending and tracker.added == [s(1, 80)]
    status = client.get_backlog_status(job)
    assert [(p.partition, p.boundary, p.finished) for p in status.partitions] == [
        (0, 10, True),
        (1, 80, False),
    ]
    assert tracker.processing_backlog is True


def test_mark_partitions_queues_only_what_the_mark_lacks(client: CoordinatorClient) -> None:
    """The driver's own knowledge (an admin client listing a topic): partitions the mark has keep
    their boundary; nothing is queued before the first mark."""
    job = f"api-{uuid.uuid4().hex[:8]}"
    tracker = BacklogTracker(client, job, "q")
    assert tracker.mark_partitions([s(0, 1)]) == ()
    tracker.observe(progress(0, kafka({0: 3}), kafka({0: 3})))
    assert tracker.mark_partitions([s(0, 99), s(3, 7)]) == (s(3, 7),)
    assert tracker.mark_partitions([s(3, 8)]) == ()  # queued already: its first offset stays
    assert tracker.pending and tracker.flush() and not tracker.pending
    assert [(p.partition, p.boundary) for p in client.get_backlog_status(job).partitions] == [(0, 3), (3, 7)]


def test_a_grow_past_the_limit_is_not_retried_and_holds_no_report_back(tmp_path: Path) -> None:
    """The coordinator tracks at most 3 partitions per job, and the job has 3 (two of the query's,
    one another driver added): the tracker's grow by the topic's new partition is refused
    (INVALID_ARGUMENT, TOO_LARGE). Sending it again cannot help and must not hold the reports
    back: the report goes out, the partition stays unmarked and is not asked for again."""
    with (
        embedded_deps(tmp_path) as deps,
        serve_in_process(deps, backlog_max_partitions="3") as server,
        CoordinatorClient(server.target, timeout_s=10) as small,
    ):
        job = f"limit-{uuid.uuid4().hex[:8]}"
        tracker = BacklogTracker(small, job, "q")
        tracker.observe(progress(0, kafka({0: 1, 1: 1}), kafka({0: 5, 1: 5})))
        small.mark_backlog(job, [Offset("other", 0, 0)])
        tracker.observe(progress(1, kafka({0: 5, 1: 5, 2: 0}), kafka({0: 5, 1: 5, 2: 9})))
        assert tracker.refused == {(s(2, 0).stream, 2)} and tracker.errors == 1 and not tracker.pending
        assert tracker.last_result is not None and tracker.last_result.unmarked == (s(2, 0),)
        assert tracker.caught_up() and tracker.added == []
        tracker.observe(progress(2, kafka({0: 6, 1: 6, 2: 4}), kafka({0: 6, 1: 6, 2: 9})))
        assert tracker.errors == 1 and not tracker.pending  # not asked for again
        status = small.get_backlog_status(job)
        assert [(p.stream, p.partition, p.position) for p in status.partitions] == [
            ("other", 0, -1),
            (s(0, 0).stream, 0, 6),
            (s(0, 0).stream, 1, 6),
        ]
        assert status.unmarked_partitions == 1
