"""ZooKeeper digest auth: every znode the coordinator creates is closed to a client without its
credentials, which can neither read, change, delete nor add to the records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from kazoo import exceptions as kz
from kazoo.client import KazooClient

from harness.coordinator import serve_in_process
from harness.isolation import chroot_of
from harness.process import wait_until
from snapcoord.coordinator.errors import InvalidArgument
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.storage.backends import MetadataOptions, open_metadata_store
from snapcoord.coordinator.storage.local.blob_files import LocalBlobStore
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

USER, PASSWORD = "snapcoord", "zk-secret-7f3a"


def _walk(client: KazooClient, path: str) -> Iterator[str]:
    yield path
    for child in client.get_children(path):
        yield from _walk(client, f"{path.rstrip('/')}/{child}")


def _populate(target: str) -> None:
    """One record of each kind, through the API."""
    with grpc.insecure_channel(target) as channel:
        offsets = [common_pb2.Offset(stream="s", partition=0, offset=1)]
        producer_pb2_grpc.ProducerOffsetServiceStub(channel).RegisterProducerOffsets(
            producer_pb2.RegisterProducerOffsetsRequest(producer_id="p", offsets=offsets), timeout=30
        )
        snap = snapshot_pb2_grpc.SnapshotServiceStub(channel).CreateSnapshot(
            snapshot_pb2.CreateSnapshotRequest(app_id="app", task_ids=["t"]), timeout=30
        )
        lease_pb2_grpc.LeaseServiceStub(channel).AcquireSnapshots(
            lease_pb2.AcquireSnapshotsRequest(
                lease_id="l",
                duration_ms=600_000,
                snapshots=[common_pb2.SnapshotRef(app_id="app", generation=snap.generation)],
            ),
            timeout=30,
        )
        backlog_pb2_grpc.BacklogServiceStub(channel).MarkBacklog(
            backlog_pb2.MarkBacklogRequest(job_id="j", boundaries=offsets), timeout=30
        )


def test_a_client_without_credentials_can_neither_change_nor_delete_the_records(
    zk_uri: str, zk_hosts: str, tmp_path: Path
) -> None:
    auth_file = tmp_path / "zk-auth"
    auth_file.write_text(f"{USER}:{PASSWORD}\n")
    chroot = chroot_of(zk_uri)
    # The URI carries no credentials: they come from the file only.
    assert PASSWORD not in zk_uri
    metadata = open_metadata_store(zk_uri, options=MetadataOptions(zk_auth_file=str(auth_file)))
    blobs = LocalBlobStore.from_uri((tmp_path / "blobs").as_uri())
    owner = KazooClient(hosts=zk_hosts, timeout=10, auth_data=[("digest", f"{USER}:{PASSWORD}")])
    stranger = KazooClient(hosts=zk_hosts, timeout=10)
    owner.start(timeout=30)
    stranger.start(timeout=30)
    try:
        # The janitor runs (its election node is created too) but its first pass is an hour away.
        with serve_in_process(Deps(metadata=metadata, blobs=blobs), cleanup_interval="1h") as server:
            _populate(server.target)
            # A bare create (no parents made) too: the store sends it without kazoo's create call.
            metadata.create("/acl-probe", b"x")
            wait_until(
                lambda: any("election" in p or "janitor" in p for p in _walk(owner, chroot)),
                timeout=30,
                interval=0.1,
                what="the janitor's election node",
            )
            nodes = list(_walk(owner, chroot))
            assert len(nodes) > 6, nodes
            before = {path: owner.get(path) for path in nodes}
            for path in nodes:
                acls, _ = owner.get_acls(path)
                assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acls] == [("digest", USER)], path
                with pytest.raises(kz.NoAuthError):
                    stranger.get(path)
                with pytest.raises(kz.NoAuthError):
                    stranger.set(path, b"overwritten")
                with pytest.raises(kz.NoAuthError):
                    stranger.create(f"{path}/intruder", b"x")
                if path != chroot:
                    with pytest.raises(kz.NoAuthError):
                        stranger.delete(path)
            with pytest.raises(kz.NoAuthError):
                stranger.delete(chroot, recursive=True)
            after = {path: owner.get(path) for path in _walk(owner, chroot)}
            assert {p: (d, s.version) for p, (d, s) in after.items()} == {
                p: (d, s.version) for p, (d, s) in before.items()
            }
    finally:
        metadata.close()
        blobs.close()
        # The harness's cleanup has no credentials: remove what only the owner can.
        if owner.exists(chroot):
            owner.delete(chroot, recursive=True)
        owner.stop()
        owner.close()
        stranger.stop()
        stranger.close()


def test_a_zookeeper_auth_file_without_user_and_password_is_refused(zk_uri: str, tmp_path: Path) -> None:
    bad = tmp_path / "zk-auth"
    bad.write_text("just-a-password\n")
    with pytest.raises(InvalidArgument, match="user:password") as e:
        open_metadata_store(zk_uri, options=MetadataOptions(zk_auth_file=str(bad)))
    assert "just-a-password" not in str(e.value)
