"""Moving a 500 MB snapshot in and out, against the raw S3 throughput in the same run.

    bench/run stream_checkpoints [--mb 500] [--tasks 32] [--threads 8]

In: ``--tasks`` tasks report one checkpoint each (``--mb``/tasks MB, sent as ReportTaskSnapshot
messages from ``--threads`` threads); out: every payload streamed back with ReadCheckpoint (1 MiB
pieces), from as many threads. Raw: the same objects put and got with boto3, same threads.
Prints MB/s for each, and the peak RSS of this process (coordinator and clients share it; the
coordinator's share is what ReadCheckpoint keeps to a few pieces per call).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from common import in_process_coordinator, raw_s3_client, real_servers

from snapcoord.client import CoordinatorClient, TaskSnapshot

MB = 1_000_000


def timed(label: str, total_bytes: int, items: int, threads: int, work: Callable[[int], object]) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(items)))
    elapsed = time.perf_counter() - started
    rate = total_bytes / MB / elapsed
    print(f"{label:42s} {total_bytes / MB:8.0f} MB  {elapsed:7.2f} s  {rate:8.1f} MB/s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=500, help="snapshot size in MB (default 500)")
    parser.add_argument("--tasks", type=int, default=32, help="tasks, one checkpoint each (default 32)")
    parser.add_argument("--threads", type=int, default=8, help="client threads (default 8)")
    args = parser.parse_args()
    per_task = args.mb * MB // args.tasks
    payloads = [os.urandom(per_task) for _ in range(args.tasks)]
    total = per_task * args.tasks
    with real_servers() as (zk, s3):
        os.environ.update(s3.env())
        run_id = uuid.uuid4().hex[:8]
        raw = raw_s3_client(s3)
        print(f"# stream_checkpoints: {args.mb} MB in {args.tasks} checkpoints; S3 {s3.endpoint_url}")
        timed(
            "raw S3 put_object",
            total,
            args.tasks,
            args.threads,
            lambda i: raw.put_object(Bucket=s3.bucket, Key=f"raw-{run_id}/{i}", Body=payloads[i]),
        )
        timed(
            "raw S3 get_object (streamed body)",
            total,
            args.tasks,
            args.threads,
            lambda i: _drain(raw.get_object(Bucket=s3.bucket, Key=f"raw-{run_id}/{i}")["Body"]),
        )
        size_flag = f"{per_task // (1024 * 1024) + 2}MiB"
        with (
            in_process_coordinator(
                f"zk://{zk.hosts}/bench-{run_id}",
                f"s3://{s3.bucket}/bench-{run_id}",
                max_inline_payload=size_flag,
                snapshot_max_inline_read="1MiB",
            ) as port,
            CoordinatorClient(f"127.0.0.1:{port}", timeout_s=600) as client,
        ):
            tasks = [f"t{i}" for i in range(args.tasks)]
            g = client.create_snapshot("bench", tasks).generation
            timed(
                "in: ReportTaskSnapshot (parallel tasks)",
                total,
                args.tasks,
                args.threads,
                lambda i: client.report_task_snapshot(
                    "bench", g, TaskSnapshot(tasks[i], (), {"state": payloads[i]})
                ),
            )
            timed(
                "out: ReadCheckpoint (1 MiB pieces)",
                total,
                args.tasks,
                args.threads,
                lambda i: _count(client.read_checkpoint("bench", g, tasks[i], "state")),
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"peak RSS of this process (it holds the {total / MB:.0f} MB of payloads): {peak / MB:.0f} MB")


def _drain(body: object) -> None:
    read = body.read  # type: ignore[attr-defined]
    while read(1024 * 1024):
        pass


def _count(pieces: object) -> None:
    for _ in pieces:  # type: ignore[attr-defined]
        pass


if __name__ == "__main__":
    main()
