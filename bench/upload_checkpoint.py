"""One large checkpoint streamed in (UploadCheckpoint) and out (ReadCheckpoint) through a coordinator
process on ZooKeeper + SeaweedFS, against raw boto3 multipart put / get of the same size in the same
run; then several clients uploading and downloading large checkpoints at once while the server's
RSS is sampled.

    bench/run upload_checkpoint [--mb 500] [--clients 4] [--budget-mib 256]
    bench/run upload_checkpoint --smoke        # 24 MB, 2 clients: seconds, for CI

The payload is generated as it is sent (a 1 MiB random block, varied per piece), so the client side
holds a piece at a time too. Raw put: boto3's multipart upload in 8 MiB parts sent one after the
other (the coordinator's part size, no parallel parts); raw get: the streamed body in 1 MiB reads.
The coordinator runs as its own process (``snapcoord serve``), so its RSS is its own.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from boto3.s3.transfer import TransferConfig
from common import raw_s3_client, real_servers

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient, TaskSnapshot

MB = 1_000_000
MiB = 1024 * 1024
PART = 8 * MiB


class Payload:
    """``size`` pseudo-random bytes, produced piece by piece (never held whole)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self._block = os.urandom(MiB)
        self._seed = seed

    def pieces(self, piece: int = MiB) -> Iterator[bytes]:
        sent = 0
        n = 0
        while sent < self.size:
            length = min(piece, self.size - sent)
            prefix = (self._seed * 1_000_003 + n).to_bytes(8, "big")
            yield (prefix + self._block)[:length]
            sent += length
            n += 1


class PieceReader:
    """A file-like view of ``Payload.pieces`` for boto3's ``upload_fileobj``."""

    def __init__(self, payload: Payload) -> None:
        self._pieces = payload.pieces()
        self._buffer = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buffer) < n:
            piece = next(self._pieces, None)
            if piece is None:
                break
            self._buffer += piece
        if n < 0:
            out, self._buffer = self._buffer, b""
        else:
            out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out


def timed(label: str, size: int, work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    elapsed = time.perf_counter() - started
    rate = size / MB / elapsed
    print(f"{label:48s} {size / MB:8.0f} MB  {elapsed:7.2f} s  {rate:8.1f} MB/s", flush=True)
    return rate


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def drain(pieces: Iterator[bytes]) -> int:
    return sum(len(p) for p in pieces)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=500, help="checkpoint size in MB (default 500)")
    parser.add_argument(
        "--clients", type=int, default=4, help="concurrent clients in the RSS phase (default 4)"
    )
    parser.add_argument(
        "--budget-mib", type=int, default=256, help="the server's --payload-budget (default 256)"
    )
    parser.add_argument("--smoke", action="store_true", help="24 MB and 2 clients: a quick run for CI")
    args = parser.parse_args()
    if args.smoke:
        args.mb, args.clients = 24, 2
    size = args.mb * MB
    with real_servers() as (zk, s3), tempfile.TemporaryDirectory(prefix="snapcoord-upload-") as tmp:
        os.environ.update(s3.env())
        run_id = uuid.uuid4().hex[:8]
        raw = raw_s3_client(s3)
        print(f"# upload_checkpoint: {args.mb} MB; ZooKeeper {zk.hosts}; S3 {s3.endpoint_url}", flush=True)
        payload = Payload(size, 1)
        sequential = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=1)
        raw_in = timed(
            "raw S3 multipart put (8 MiB parts, sequential)",
            size,
            lambda: raw.upload_fileobj(
                PieceReader(payload),  # read() is all boto3 uses
                s3.bucket,
                f"raw-{run_id}",
                Config=sequential,
            ),
        )

        def raw_get() -> int:
            body = raw.get_object(Bucket=s3.bucket, Key=f"raw-{run_id}")["Body"]
            return drain(iter(lambda: body.read(MiB), b""))

        raw_out = timed("raw S3 get (streamed body, 1 MiB reads)", size, raw_get)
        coordinator = CoordinatorProcess(
            Path(tmp) / "coord",
            args=[
                "--metadata",
                f"zk://{zk.hosts}/bench-{run_id}",
                "--blobs",
                f"s3://{s3.bucket}/bench-{run_id}",
                "--payload-budget",
                f"{args.budget_mib}MiB",
                "--payload-budget-wait",
                "600s",
                "--cleanup-interval",
                "0s",
            ],
            env=s3.env(),
        )
        with coordinator, CoordinatorClient(coordinator.target, timeout_s=1800) as client:
            g = client.create_snapshot("bench", ["t0", *(f"c{i}" for i in range(args.clients))]).generation
            uploaded: list[str] = []
            ours_in = timed(
                "in: UploadCheckpoint (1 MiB messages)",
                size,
                lambda: uploaded.append(
                    client.upload_checkpoint("bench", g, "t0", "state", payload.pieces()).upload_id
                ),
            )
            client.report_task_snapshot("bench", g, TaskSnapshot("t0", uploads={"state": uploaded[0]}))
            got = [0]
            ours_out = timed(
                "out: ReadCheckpoint (1 MiB pieces)",
                size,
                lambda: got.__setitem__(0, drain(client.read_checkpoint("bench", g, "t0", "state"))),
            )
            assert got[0] == size, got
            print(f"ratio in  (UploadCheckpoint / raw multipart put): {ours_in / raw_in:.2f}")
            print(f"ratio out (ReadCheckpoint / raw get):             {ours_out / raw_out:.2f}", flush=True)

            # Several clients at once: each uploads its own checkpoint and reads back t0's.
            per_client = size // args.clients
            baseline = rss_bytes(coordinator.pid)
            peak = [baseline]
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], rss_bytes(coordinator.pid))
                    time.sleep(0.05)

            def client_work(i: int) -> None:
                with CoordinatorClient(coordinator.target, timeout_s=1800) as c:
                    up = c.upload_checkpoint(
                        "bench", g, f"c{i}", "state", Payload(per_client, 10 + i).pieces()
                    )
                    assert up.size == per_client
                    c.report_task_snapshot("bench", g, TaskSnapshot(f"c{i}", uploads={"state": up.upload_id}))
                    assert drain(c.read_checkpoint("bench", g, "t0", "state")) == size

            sampler = threading.Thread(target=sample)
            sampler.start()
            errors: list[BaseException] = []

            def guarded(i: int) -> None:
                try:
                    client_work(i)
                except BaseException as e:
                    errors.append(e)

            workers = [threading.Thread(target=guarded, args=(i,)) for i in range(args.clients)]
            started = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - started
            stop.set()
            sampler.join()
            if errors:
                raise errors[0]
            moved = args.clients * (per_client + size)
            print(
                f"{args.clients} clients at once: {moved / MB:.0f} MB moved in {elapsed:.1f} s "
                f"({moved / MB / elapsed:.1f} MB/s); server RSS baseline {baseline / MiB:.0f} MiB, "
                f"peak {peak[0] / MiB:.0f} MiB (growth {(peak[0] - baseline) / MiB:.0f} MiB; "
                f"--payload-budget {args.budget_mib} MiB)",
                flush=True,
            )
    print("done")


if __name__ == "__main__":
    main()
