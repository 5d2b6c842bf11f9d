"""One janitor pass expires every due lease, also several on one app (found by the 30-minute soak).

Removing a lease's pins leaves a retention trigger named after the app and the call's nonce. The
janitor used one nonce for its whole pass, so the second expired lease of the same app wrote the
trigger the first one had created: its transaction failed every round ("heavily contended"), the
step failed, and expiry advanced by one lease per app per pass while leases piled up (40 minutes
behind after half an hour of load). Real ZooKeeper and S3; the live lease next to them must keep
its record and its pin.
"""

from __future__ import annotations

import time

import pytest

from harness.coordinator import serve_in_process
from harness.process import wait_until
from snapcoord.client import CoordinatorClient, NotFound, Offset, SnapshotRef, TaskSnapshot
from snapcoord.coordinator.domain.leases import decode_pins
from snapcoord.coordinator.services import Deps
from snapcoord.coordinator.snapshots import pins
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store

EXPIRING = 4


@pytest.mark.timeout(180)
def test_one_pass_expires_several_leases_of_one_app_and_keeps_the_live_one(zk_uri: str, s3_uri: str) -> None:
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(s3_uri)
    try:
        deps = Deps(metadata=metadata, blobs=blobs)
        with (
            serve_in_process(deps, max_clock_skew="0s", lease_min_duration="1s") as server,
            CoordinatorClient(server.target, timeout_s=30) as client,
        ):
            generations = []
            for _ in range(EXPIRING + 1):
                snap = client.create_snapshot("app", ["t"])
                client.report_task_snapshot(
                    "app", snap.generation, TaskSnapshot("t", (Offset("s", 0, 1),), {})
                )
                generations.append(snap.generation)
            short = [f"short-{i}" for i in range(EXPIRING)]
            for lease_id, generation in zip(short, generations, strict=False):
                client.acquire_snapshots(lease_id, [SnapshotRef("app", generation)], duration_ms=1000)
            kept = generations[-1]
            client.acquire_snapshots("long", [SnapshotRef("app", kept)], duration_ms=600_000)
            last_expiry = max(client.get_lease(lease_id).expires_at_ms for lease_id in short)
            wait_until(lambda: time.time() * 1000 > last_expiry, timeout=60, interval=0.1, what="expiry")
            # One pass: every due lease goes, none is left for the next pass.
            assert server.server.services.leases.expire_due(1000) == EXPIRING
            for lease_id in short:
                with pytest.raises(NotFound):
                    client.get_lease(lease_id)
            for generation in generations[:EXPIRING]:  # their pins went with them
                assert metadata.get(pins.pin_path("app", generation)) is None
            # The live lease and its pin are untouched.
            assert client.get_lease("long").snapshots == (SnapshotRef("app", kept),)
            node = metadata.get(pins.pin_path("app", kept))
            assert node is not None and "long" in decode_pins(node.data)
    finally:
        blobs.close()
        metadata.close()
