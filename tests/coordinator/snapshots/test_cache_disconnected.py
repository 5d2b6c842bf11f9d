"""The current-snapshot cache serves nothing while its ZooKeeper connection is gone.

No watch fires while a replica is cut from ZooKeeper, so an entry cached before the cut would be
served unchanged for as long as the partition lasts, while other replicas complete generations.
A real ZooKeeper sits behind a proxy the test cuts; a second store, connected directly, moves the
app on meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from harness.faults import TcpProxy
from harness.process import wait_until
from snapcoord.coordinator.domain.clock import SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.errors import StoreUnavailable
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.metadata import MetadataStore

pytestmark = [pytest.mark.zookeeper]

POLICY = SnapshotPolicy(
    default_timeout_ms=10 * 60_000,
    max_report_bytes=1024 * 1024,
    default_keep_last_completed=2,
    default_completed_ttl_ms=24 * 3_600_000,
)


@contextmanager
def registry(metadata_uri: str, blobs_uri: str) -> Iterator[tuple[SnapshotRegistry, MetadataStore]]:
    with ExitStack() as stack:
        metadata = open_metadata_store(metadata_uri)
        stack.callback(metadata.close)
        blobs = open_blob_store(blobs_uri)
        stack.callback(blobs.close)
        yield (
            SnapshotRegistry(metadata, blobs, SystemClock(), POLICY, CoordinatorMetrics(new_registry())),
            metadata,
        )


def test_a_cut_replica_answers_no_cached_snapshot(zk_hosts: str, zk_uri: str, tmp_path: Path) -> None:
    zk_host, zk_port = zk_hosts.rsplit(":", 1)
    chroot = "/" + zk_uri.split("/", 3)[3]
    blobs_uri = (tmp_path / "blobs").as_uri()
    with (
        TcpProxy(zk_host, int(zk_port)) as proxy,
        registry(f"zk://{proxy.address}{chroot}", blobs_uri) as (cut, cut_store),
        registry(zk_uri, blobs_uri) as (other, _),
    ):
        other.create("app", ("t",), 0, 0, {})
        other.report("app", 1, "t", (Offset("s", 0, 1),), {})
        assert cut.current("app", consistent=False).record.generation == 1  # cached, watched
        proxy.cut()
        wait_until(lambda: not cut_store.is_usable(), timeout=60, what="the cut store unusable")
        other.create("app", ("t",), 0, 0, {})
        with pytest.raises(StoreUnavailable):
            cut.current("app", consistent=False)
        proxy.restore()
        wait_until(cut_store.is_usable, timeout=60, what="the store usable again")
        assert cut.current("app", consistent=False).record.generation == 2
