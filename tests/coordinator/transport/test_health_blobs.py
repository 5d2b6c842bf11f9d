"""Health follows a real SeaweedFS: blob-writing services NOT_SERVING while S3 is down, the rest SERVING."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.coordinator import serve_in_process
from harness.process import wait_until
from harness.seaweed import SeaweedS3Server
from snapcoord.coordinator.server.app import BLOB_SERVICE_NAMES
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import BlobOptions, open_blob_store
from snapcoord.coordinator.storage.local.embedded import EmbeddedMetadataStore
from snapcoord.coordinator.transport.health import StoreHealth
from snapcoord.v1 import snapshot_pb2, snapshot_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
PRODUCERS = "snapcoord.v1.ProducerOffsetService"
BACKLOG = "snapcoord.v1.BacklogService"
SNAPSHOTS = "snapcoord.v1.SnapshotService"
LEASES = "snapcoord.v1.LeaseService"
#: Generous: the probe runs every 5 s by default and a busy machine may be slow to notice.
WAIT_S = 90.0


def test_blob_services_follow_the_blob_store(
    tmp_path: Path, private_s3_server: SeaweedS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", private_s3_server.endpoint_url)
    metadata = EmbeddedMetadataStore.from_uri((tmp_path / "metadata").as_uri())
    # Few attempts, so that a probe against a stopped server fails fast.
    blobs = open_blob_store(private_s3_server.uri("health"), options=BlobOptions(s3_max_attempts=1))
    assert set(BLOB_SERVICE_NAMES) == {PRODUCERS, BACKLOG}
    with serve_in_process(Deps(metadata=metadata, blobs=blobs)) as coord, coord.channel() as ch:
        health = health_pb2_grpc.HealthStub(ch)
        snapshots = snapshot_pb2_grpc.SnapshotServiceStub(ch)

        def status(service: str) -> int:
            return int(health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)

        def statuses() -> dict[str, int]:
            return {s: status(s) for s in ("", PRODUCERS, BACKLOG, SNAPSHOTS, LEASES)}

        assert set(statuses().values()) == {SERVING}
        created = snapshots.CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["t1"]), timeout=30
        )

        private_s3_server.stop()
        wait_until(lambda: status(PRODUCERS) == NOT_SERVING, timeout=WAIT_S, what="producers NOT_SERVING")
        down = statuses()
        assert down == {
            "": SERVING,
            PRODUCERS: NOT_SERVING,
            BACKLOG: NOT_SERVING,
            SNAPSHOTS: SERVING,
            LEASES: SERVING,
        }
        # The snapshot read path really works without S3, as SERVING promises.
        current = snapshots.GetCurrentSnapshot(
            snapshot_pb2.GetCurrentSnapshotRequest(app_id="app", consistent=True), timeout=30
        )
        assert current.generation == created.generation
        listed = snapshots.ListSnapshots(snapshot_pb2.ListSnapshotsRequest(app_id="app"), timeout=30)
        assert [s.generation for s in listed.snapshots] == [created.generation]

        private_s3_server.start()  # same port and data
        wait_until(lambda: set(statuses().values()) == {SERVING}, timeout=WAIT_S, what="all SERVING again")
    blobs.close()
    metadata.close()


def test_probe_interval_must_be_positive(tmp_path: Path) -> None:
    metadata = EmbeddedMetadataStore.from_uri((tmp_path / "metadata").as_uri())
    blobs = open_blob_store((tmp_path / "blobs").as_uri())
    try:
        with pytest.raises(ValueError, match="blob_probe_interval_s"):
            StoreHealth(
                metadata, [PRODUCERS], blobs=blobs, blob_services=[PRODUCERS], blob_probe_interval_s=0
            )
        with pytest.raises(ValueError, match="blob_services must be among"):
            StoreHealth(metadata, [PRODUCERS], blobs=blobs, blob_services=[BACKLOG])
    finally:
        blobs.close()
        metadata.close()


def test_without_blob_services_nothing_is_probed(tmp_path: Path) -> None:
    """The metadata-only form (no blob store) still drives every service from the metadata store."""
    metadata = EmbeddedMetadataStore.from_uri((tmp_path / "metadata").as_uri())
    try:
        h = StoreHealth(metadata, [PRODUCERS])
        reply = h.servicer.Check(health_pb2.HealthCheckRequest(service=PRODUCERS), _NoContext())
        assert reply.status == SERVING
        h.enter_graceful_shutdown()
    finally:
        metadata.close()


class _NoContext:
    """HealthServicer.Check only calls set_code/set_details on an unknown service."""

    def set_code(self, code: grpc.StatusCode) -> None:
        raise AssertionError(f"unexpected {code}")

    def set_details(self, details: str) -> None:
        raise AssertionError(details)
