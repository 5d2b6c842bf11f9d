"""The server's memory stays within its payload budget while several clients upload and download
large checkpoints at once, on ZooKeeper + S3 (multipart uploads: the store's part buffers are what
the budget counts). The coordinator runs as its own process; its VmRSS is sampled from /proc.
(Sizes are bounded for CI; ``bench/upload_checkpoint.py`` has the 500 MB measurement.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from harness.concurrency import run_threads
from harness.coordinator import CoordinatorProcess
from harness.rss import PeakRss
from harness.seaweed import SeaweedS3Server
from snapcoord.client import CoordinatorClient, TaskSnapshot

MiB = 1024 * 1024
CLIENTS = 4
PAYLOAD = 64 * MiB
BUDGET = 128 * MiB


def pieces(i: int) -> Iterator[bytes]:
    """Client ``i``'s payload, made piece by piece (the client holds one at a time too)."""
    for n in range(PAYLOAD // MiB):
        yield bytes([i, n % 256]) * (MiB // 2)


def test_concurrent_uploads_and_downloads_keep_the_server_within_its_budget(
    tmp_path: Path, zk_uri: str, s3_uri: str, s3_server: SeaweedS3Server
) -> None:
    args = [
        "--metadata",
        zk_uri,
        "--blobs",
        s3_uri,
        "--payload-budget",
        "128MiB",
        "--payload-budget-wait",
        "300s",
    ]
    with (
        CoordinatorProcess(tmp_path / "coord", args=args, env=s3_server.env()) as coord,
        CoordinatorClient(coord.target, timeout_s=600) as client,
    ):
        tasks = ["reader", *(f"w{i}" for i in range(CLIENTS))]
        g = client.create_snapshot("mem", tasks).generation
        first = client.upload_checkpoint("mem", g, "reader", "state", pieces(99))
        client.report_task_snapshot("mem", g, TaskSnapshot("reader", uploads={"state": first.upload_id}))
        moved: dict[int, tuple[int, int]] = {}

        def work(i: int) -> None:
            # Half the clients upload then download, half the other way round: both at once.
            with CoordinatorClient(coord.target, timeout_s=600) as c:

                def upload() -> int:
                    up = c.upload_checkpoint("mem", g, f"w{i}", "state", pieces(i))
                    c.report_task_snapshot("mem", g, TaskSnapshot(f"w{i}", uploads={"state": up.upload_id}))
                    return up.size

                def download() -> int:
                    size = 0
                    for piece in c.read_checkpoint("mem", g, "reader", "state"):
                        assert piece[:2] == bytes([99, (size // MiB) % 256])
                        size += len(piece)
                    return size

                if i % 2:
                    moved[i] = (upload(), download())
                else:
                    got = download()
                    moved[i] = (upload(), got)

        with PeakRss(coord.pid) as rss:
            run_threads(CLIENTS, work)
        baseline, peak, growth = rss.baseline, rss.peak, rss.growth
        assert moved == {i: (PAYLOAD, PAYLOAD) for i in range(CLIENTS)}
        for i in range(CLIENTS):  # what was uploaded reads back whole
            assert sum(len(p) for p in client.read_checkpoint("mem", g, f"w{i}", "state")) == PAYLOAD
        print(
            f"\nserver RSS: baseline {baseline / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB (growth "
            f"{growth / MiB:.0f} MiB, budget {BUDGET // MiB} MiB) while {CLIENTS} clients uploaded and "
            f"downloaded {2 * CLIENTS * PAYLOAD // MiB} MiB"
        )
        # Buffering whole payloads would need 4 x 64 MiB up and as much down; the budget bounds
        # the part buffers of the uploads, and a download holds a few 1 MiB pieces.
        assert growth < BUDGET, (
            f"RSS grew by {growth / MiB:.0f} MiB, more than the {BUDGET // MiB} MiB budget"
        )
