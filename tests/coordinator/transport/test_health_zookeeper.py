"""Health follows a real ZooKeeper session: SERVING only while the metadata store is usable."""

from __future__ import annotations

from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.coordinator import serve_in_process
from harness.faults import expire_zk_session
from harness.zookeeper import ZooKeeperServer
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.local.blob_files import LocalBlobStore
from snapcoord.coordinator.storage.zookeeper.store import ZooKeeperMetadataStore
from snapcoord.coordinator.transport.health import LIVENESS_SERVICE

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_goes_not_serving_while_zookeeper_is_down(
    tmp_path: Path, private_zk_server: ZooKeeperServer
) -> None:
    store = ZooKeeperMetadataStore.from_uri(f"zk://{private_zk_server.hosts}/health")
    blobs = LocalBlobStore.from_uri((tmp_path / "blobs").as_uri())
    with serve_in_process(Deps(metadata=store, blobs=blobs)) as coord, coord.channel() as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="snapcoord.v1.SnapshotService"), timeout=120)
        assert next(watch).status == SERVING
        private_zk_server.stop()  # the connection breaks: kazoo goes SUSPENDED
        assert next(watch).status == NOT_SERVING
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == NOT_SERVING
        # The process still answers: liveness stays SERVING, so a probe on it restarts nothing.
        liveness = health_pb2.HealthCheckRequest(service=LIVENESS_SERVICE)
        assert stub.Check(liveness, timeout=10).status == SERVING
        # Same port and data: the session resumes or, if the restart outlasted it, kazoo makes a new
        # one; health is SERVING again either way (the watch only reports changes).
        private_zk_server.start()
        assert next(watch).status == SERVING
        watch.cancel()
    store.close()
    blobs.close()


def test_health_recovers_after_the_session_expires(tmp_path: Path, zk_uri: str) -> None:
    store = ZooKeeperMetadataStore.from_uri(zk_uri)
    blobs = LocalBlobStore.from_uri((tmp_path / "blobs").as_uri())
    with serve_in_process(Deps(metadata=store, blobs=blobs)) as coord, coord.channel() as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=120)
        assert next(watch).status == SERVING
        expire_zk_session(store.kazoo)  # LOST, then kazoo builds a new session by itself
        assert next(watch).status == NOT_SERVING
        assert next(watch).status == SERVING
        assert store.is_usable()
        watch.cancel()
    store.close()
    blobs.close()
