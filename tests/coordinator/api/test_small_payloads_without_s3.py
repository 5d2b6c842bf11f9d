"""Small checkpoints live in ZooKeeper: with the S3 server stopped, a snapshot whose checkpoints are
small is created, reported, read and streamed back through the real server and the thin client,
while a report with a large checkpoint is UNAVAILABLE and stores nothing."""

from __future__ import annotations

import pytest

from harness.coordinator import serve_in_process
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient, Offset, RetryPolicy, TaskSnapshot, Unavailable
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store


def test_small_checkpoints_need_no_s3(
    zk_uri: str, private_s3_server: SeaweedS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", private_s3_server.endpoint_url)
    deps = Deps(metadata=open_metadata_store(zk_uri), blobs=open_blob_store(private_s3_server.uri("small")))
    try:
        with (
            serve_in_process(deps) as coord,
            CoordinatorClient(coord.target, retry=RetryPolicy(max_attempts=1)) as client,
        ):
            private_s3_server.stop()
            g = client.create_snapshot("app", ["t1", "t2"]).generation
            small = b"s" * 4096  # the default --snapshot-inline-checkpoint-max-bytes
            client.report_task_snapshot("app", g, TaskSnapshot("t1", (Offset("in", 0, 1),), {"state": small}))
            with pytest.raises(Unavailable):
                client.report_task_snapshot("app", g, TaskSnapshot("t2", (), {"state": small + b"!"}))
            assert {t.task_id for t in client.get_snapshot("app", g).tasks} == {"t1"}  # nothing of t2
            done = client.report_task_snapshot("app", g, TaskSnapshot("t2", (), {"state": b"t2"}))
            assert done.state.name == "COMPLETED"
            got = client.get_snapshot("app", g, include_checkpoints=True)
            assert {t.task_id: t.checkpoints["state"] for t in got.tasks} == {"t1": small, "t2": b"t2"}
            assert b"".join(client.read_checkpoint("app", g, "t1", "state")) == small
    finally:
        deps.blobs.close()
        deps.metadata.close()
