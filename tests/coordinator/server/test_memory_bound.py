"""The coordinator's peak memory stays within its derived worst case (``memory_bounds``: payload
budget + headroom) while many clients send payloads at once, on ZooKeeper + S3: reports carrying
checkpoints inline at the cap, reports over it (refused, some by gRPC before buffering), and
streamed uploads. The server runs as its own process; its VmRSS is sampled from /proc. Every
accepted payload reads back byte for byte; every refused report leaves no record."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from harness.concurrency import run_threads
from harness.coordinator import CoordinatorProcess, coordinator_config
from harness.rss import PeakRss
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient, TaskSnapshot
from snapcoord.client.errors import InvalidArgument, ResourceExhausted
from snapcoord.coordinator.server.memory_bounds import memory_bounds
from snapcoord.coordinator.snapshots.layout import owner_of_checkpoint

pytestmark = pytest.mark.process

MiB = 1024 * 1024
FLAGS = {
    "payload_budget": "64MiB",
    "payload_budget_wait": "300s",
    "max_inline_payload": "4MiB",
    "max_concurrent_rpcs": "24",
    "max_workers": "32",
}
CAP = 4 * MiB
#: Reports at the cap, accepted.
AT_CAP = 8
#: Reports far over the receive limit: gRPC refuses each before buffering it.
OVER_LIMIT = 6
OVER_LIMIT_BYTES = 32 * MiB
#: Streamed uploads of UPLOAD_BYTES each, accepted.
UPLOADS = 2
UPLOAD_BYTES = 32 * MiB


def payload(i: int, size: int) -> bytes:
    return (bytes([i % 251]) + i.to_bytes(4, "big") + bytes(range(250))) * (size // 255) + bytes(size % 255)


def upload_pieces(i: int) -> Iterator[bytes]:
    data = payload(i, UPLOAD_BYTES)
    for at in range(0, len(data), MiB):
        yield data[at : at + MiB]


def test_peak_rss_stays_within_the_derived_worst_case(
    tmp_path: Path, zk_uri: str, s3_uri: str, s3_server: SeaweedS3Server
) -> None:
    bound = memory_bounds(coordinator_config(metadata=zk_uri, blobs=s3_uri, **FLAGS))
    assert bound.max_inline_payload_bytes == CAP
    args = ["--metadata", zk_uri, "--blobs", s3_uri]
    for name, value in FLAGS.items():
        args += [f"--{name.replace('_', '-')}", value]
    at_cap = [f"cap{i}" for i in range(AT_CAP)]
    over = [f"over{i}" for i in range(OVER_LIMIT)]
    uploads = [f"up{i}" for i in range(UPLOADS)]
    just_over = "just-over"
    with (
        CoordinatorProcess(tmp_path / "coord", args=args, env=s3_server.env()) as coord,
        CoordinatorClient(coord.target, timeout_s=300) as client,
    ):
        g = client.create_snapshot("mem", [*at_cap, *over, *uploads, just_over]).generation
        refused: dict[str, str] = {}
        lock = threading.Lock()

        def work(i: int) -> None:
            # Each on its own channel (its own connection), as separate executors would be.
            with CoordinatorClient(coord.target, timeout_s=300) as c:
                if i < AT_CAP:
                    task = at_cap[i]
                    c.report_task_snapshot("mem", g, TaskSnapshot(task, (), {"state": payload(i, CAP)}))
                elif i < AT_CAP + OVER_LIMIT:
                    task = over[i - AT_CAP]
                    data = payload(i, OVER_LIMIT_BYTES)
                    with pytest.raises(ResourceExhausted) as e:
                        c.report_task_snapshot("mem", g, TaskSnapshot(task, (), {"state": data}))
                    with lock:
                        refused[task] = str(e.value)
                else:
                    task = uploads[i - AT_CAP - OVER_LIMIT]
                    up = c.upload_checkpoint("mem", g, task, "state", upload_pieces(i))
                    c.report_task_snapshot("mem", g, TaskSnapshot(task, uploads={"state": up.upload_id}))

        with PeakRss(coord.pid, interval_s=0.02) as rss:
            run_threads(AT_CAP + OVER_LIMIT + UPLOADS, work)
        # Between the cap and the receive limit the handler refuses it, naming the streaming RPC.
        with pytest.raises(InvalidArgument, match="UploadCheckpoint") as e:
            client.report_task_snapshot("mem", g, TaskSnapshot(just_over, (), {"state": payload(0, CAP + 1)}))
        assert e.value.code == "INVALID_ARGUMENT"
        print(
            f"\nserver RSS: baseline {rss.baseline / MiB:.0f} MiB, peak {rss.peak / MiB:.0f} MiB; derived "
            f"worst case {bound.worst_case_bytes / MiB:.0f} MiB (payload budget "
            f"{bound.payload_budget_bytes / MiB:.0f} + headroom {bound.headroom_bytes / MiB:.0f})"
        )
        assert rss.peak <= bound.worst_case_bytes, (
            f"peak RSS {rss.peak / MiB:.0f} MiB, over the derived worst case "
            f"{bound.worst_case_bytes / MiB:.0f} MiB"
        )

        assert sorted(refused) == sorted(over)
        for message in refused.values():
            assert "larger than max" in message, message
        got = client.get_snapshot("mem", g)
        reported = {t.task_id for t in got.tasks}
        assert reported == {*at_cap, *uploads}, reported
        for i, task in enumerate([*at_cap, *uploads]):
            n = i if i < AT_CAP else i + OVER_LIMIT
            expected = payload(n, CAP if i < AT_CAP else UPLOAD_BYTES)
            assert b"".join(client.read_checkpoint("mem", g, task, "state")) == expected, task
        # A refused report stored nothing: the blob store holds the accepted payloads only.
        url = urlsplit(s3_uri)
        prefix = url.path.lstrip("/")
        listing = s3_server.client().list_objects_v2(Bucket=url.netloc, Prefix=prefix)
        owners = [
            owner_of_checkpoint(o["Key"][len(prefix) :].lstrip("/")) for o in listing.get("Contents", [])
        ]
        stored = sorted(owner[2] for owner in owners if owner is not None)
        assert stored == sorted([*at_cap, *uploads]), stored
