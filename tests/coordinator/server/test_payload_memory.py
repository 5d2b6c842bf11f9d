"""The server's memory stays bounded while several clients stream large checkpoints out
at once. The coordinator runs as its own process; its VmRSS is sampled from /proc while four
clients each read a 64 MiB payload with ReadCheckpoint. (Sizes are bounded for CI; bench/ has the
500 MB measurement.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.concurrency import run_threads
from harness.coordinator import CoordinatorProcess
from harness.rss import PeakRss
from snapcoord.client import CoordinatorClient, TaskSnapshot

pytestmark = pytest.mark.process

MiB = 1024 * 1024
CLIENTS = 4
PAYLOAD = 64 * MiB


def test_concurrent_streamed_reads_keep_the_server_rss_bounded(tmp_path: Path) -> None:
    with CoordinatorProcess(tmp_path / "coord") as coord:
        with CoordinatorClient(coord.target, timeout_s=300) as client:
            for i in range(CLIENTS):  # one at a time: this test measures the reads
                g = client.create_snapshot(f"app{i}", ["t"]).generation
                up = client.upload_checkpoint(f"app{i}", g, "t", "state", bytes([i]) * PAYLOAD)
                client.report_task_snapshot(f"app{i}", g, TaskSnapshot("t", uploads={"state": up.upload_id}))
        received: dict[int, int] = {}

        def read(i: int) -> None:
            with CoordinatorClient(coord.target, timeout_s=300) as c:
                size = 0
                for piece in c.read_checkpoint(f"app{i}", 1, "t", "state"):
                    assert piece == bytes([i]) * len(piece)
                    size += len(piece)
                received[i] = size

        with PeakRss(coord.pid) as rss:
            run_threads(CLIENTS, read)
        baseline, peak = rss.baseline, rss.peak
        assert received == {i: PAYLOAD for i in range(CLIENTS)}
        growth = peak - baseline
        print(
            f"\nserver RSS: baseline {baseline / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB while "
            f"{CLIENTS} clients streamed {CLIENTS * PAYLOAD // MiB} MiB"
        )
        # Buffering whole payloads would need 256 MiB; streaming holds a few 1 MiB pieces per call.
        assert growth < PAYLOAD, f"RSS grew by {growth / MiB:.0f} MiB"
