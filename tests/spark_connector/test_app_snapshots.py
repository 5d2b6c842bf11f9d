"""The listener's offset mapping and its snapshot reports' error handling (snapshots themselves:
``test_snapshot_restore.py``)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.streaming.listener import QueryProgressEvent

from harness.coordinator import embedded_deps, serve_in_process
from snapcoord.client import CoordinatorClient, Offset, SnapshotState, TaskSnapshot
from snapcoord.spark_connector.listener import SnapcoordListener, default_stream_name, parse_end_offset


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorClient]:
    with (
        embedded_deps(tmp_path_factory.mktemp("coordinator")) as deps,
        serve_in_process(deps) as server,
        CoordinatorClient(server.target, timeout_s=10) as c,
    ):
        yield c


# -- offset mapping and error handling, without Spark -------------------------------------------


def test_offset_mapping() -> None:
    assert parse_end_offset("files", '{"logOffset":3}') == (Offset("files", 0, 3),)
    assert parse_end_offset("rate", "17") == (Offset("rate", 0, 17),)
    assert parse_end_offset("kafka", '{"orders":{"1":7,"0":12},"audit":{"0":0}}') == (
        Offset("audit", 0, 0),
        Offset("orders", 0, 12),
        Offset("orders", 1, 7),
    )
    assert parse_end_offset("k", '{"orders":{"0":12}}', alias=True) == (Offset("k:orders", 0, 12),)
    assert parse_end_offset("files", None) == ()
    assert parse_end_offset("files", "null") == ()
    assert parse_end_offset("files", "None") == ()
    assert default_stream_name("orders", 0) == "orders.0"
    assert default_stream_name("my orders/v2", 1) == "my_orders_v2.1"
    assert parse_end_offset("x", '{"orders":{"0":"a"}}') is None
    assert parse_end_offset("x", "[1,2]") is None
    assert parse_end_offset("x", "not json") is None


def progress_event(
    name: str, batch_id: int, end_offset: str, latest: str | None = None
) -> QueryProgressEvent:
    source = {
        "description": "FileStreamSource[file:/in]",
        "startOffset": None,
        "endOffset": end_offset,
        "latestOffset": latest,
        "numInputRows": 1,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": 0.0,
    }
    progress: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "runId": str(uuid.uuid4()),
        "name": name,
        "timestamp": "2026-01-01T00:00:00.000Z",
        "batchId": batch_id,
        "batchDuration": 1,
        "stateOperators": [],
        "sources": [source],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
    }
    return QueryProgressEvent.fromJson({"progress": progress})


def test_fenced_report_is_logged_and_ignored(
    client: CoordinatorClient, caplog: pytest.LogCaptureFixture
) -> None:
    app = f"fence-{uuid.uuid4().hex[:8]}"
    created = client.create_snapshot(app, ["q", "other"])
    # Someone else (a previous driver) already reported q differently: the listener's report is fenced.
    client.report_task_snapshot(app, created.generation, TaskSnapshot("q", (Offset("s", 0, 1),)))
    listener = SnapcoordListener(client, app, {"q": "/cp/q"}, stream_names={"q": ["s"]})
    with caplog.at_level(logging.INFO, logger="snapcoord.spark_connector.listener"):
        listener.onQueryProgress(progress_event("q", 4, '{"logOffset":4}'))
        listener.onQueryProgress(progress_event("q", 5, '{"logOffset":5}'))
    fenced = [r for r in caplog.records if " fenced (" in r.getMessage()]
    assert len(fenced) == 1  # logged once, not reported again for the same generation
    assert listener.errors == 0
    stored = client.get_snapshot(app, created.generation)
    assert stored.state is SnapshotState.CREATED
    assert [t.committed_offsets for t in stored.tasks if t.task_id == "q"] == [(Offset("s", 0, 1),)]


def test_unreachable_coordinator_is_swallowed() -> None:
    with CoordinatorClient("127.0.0.1:1", timeout_s=1) as dead:
        listener = SnapcoordListener(
            dead, "app", {"q": "/cp/q"}, backlog_jobs={"q": "job"}, call_timeout_s=0.3
        )
        listener.onQueryProgress(progress_event("q", 0, '{"logOffset":0}'))  # must not raise
    assert listener.errors >= 2  # get_current_snapshot and mark_backlog both failed, logged
    assert listener.backlog_mark("job") is None
    batch = listener.last_committed("q")
    assert batch is not None and batch.batch_id == 0
