"""Every RPC of ``snapcoord.v1`` once, through the client library of whichever release runs this
file, writing through one coordinator and reading back through another.

``python tests/upgrades/client_calls.py --write HOST:PORT --read HOST:PORT --prefix P`` prints one
JSON object: for each step (``"RegisterProducerOffsets"``, ``"GetProducerOffsets@read"``...) "OK",
"MISMATCH: ..." or the error (its class, gRPC code and message). A step the answering coordinator
does not provide is "UNIMPLEMENTED ..." (the client raises ``Unimplemented`` for it, as it
documents). Run by an installed release's Python it is that release's client against a
coordinator of another; it imports only the client, so it runs under each release's venv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from typing import Any

from snapcoord.client import (
    CoordinatorClient,
    Offset,
    SnapcoordError,
    SnapshotRef,
    SnapshotState,
    TaskSnapshot,
)

#: Checkpoints of three sizes: held in ZooKeeper (small), in S3 through the report (medium),
#: streamed by UploadCheckpoint (large, read back by ReadCheckpoint).
SMALL = b"s" * 100
MEDIUM = hashlib.sha256(b"medium").digest() * 512  # 16 KiB
LARGE = hashlib.sha256(b"large").digest() * 65_536  # 2 MiB


class Steps:
    def __init__(self) -> None:
        self.results: dict[str, str] = {}

    def run(
        self, name: str, call: Callable[[], Any], check: Callable[[Any], str | None] = lambda _: None
    ) -> Any:
        """``call``, recorded under ``name``: OK, or what ``check`` says is wrong, or its error."""
        try:
            value = call()
        except SnapcoordError as e:
            self.results[name] = f"{type(e).__name__} {getattr(e, 'code', '')}: {e}"
            return None
        problem = check(value)
        self.results[name] = "OK" if problem is None else f"MISMATCH: {problem}"
        return value

    def refused(self, name: str, call: Callable[[], Any], error: str) -> None:
        """``call``, recorded under ``name``: OK when it raises the client's ``error`` class."""
        try:
            call()
        except SnapcoordError as e:
            got = f"{type(e).__name__} {getattr(e, 'code', '')}: {e}"
            self.results[name] = "OK" if type(e).__name__ == error else f"MISMATCH: {got}, want {error}"
            return
        self.results[name] = f"MISMATCH: succeeded, want {error}"


def expect(got: object, want: object) -> str | None:
    return None if got == want else f"got {got!r}, want {want!r}"


def run(write: CoordinatorClient, read: CoordinatorClient, prefix: str) -> dict[str, str]:
    steps = Steps()
    offsets = (Offset("orders", 0, 41), Offset("orders", 1, 7))
    moved = (Offset("orders", 0, 42), Offset("orders", 1, 9))

    # -- producers ---------------------------------------------------------------------------------
    producer, following = f"{prefix}-producer", f"{prefix}-producer-next"
    steps.run(
        "RegisterProducerOffsets",
        lambda: write.register_producer_offsets(producer, offsets),
        lambda r: expect((r.registered, r.snapshot.offsets), (True, offsets)),
    )
    steps.run(
        "GetProducerOffsets@read",
        lambda: read.get_producer_offsets(producer),
        lambda s: expect(s.offsets, offsets),
    )
    steps.run(
        "ListProducerOffsets@read",
        lambda: read.list_producer_offsets(page_size=1000),
        lambda p: expect(producer in {s.producer_id for s in p.items}, True),
    )
    steps.run(
        "AdvanceProducerOffsets",
        lambda: write.advance_producer_offsets(following, moved, previous_producer_id=producer),
        lambda r: expect((r.registered, r.previous_deleted), (True, True)),
    )
    steps.run(
        "GetProducerOffsets@read after advance",
        lambda: read.get_producer_offsets(following),
        lambda s: expect(s.offsets, moved),
    )
    steps.run(
        "DeleteProducerOffsets",
        lambda: write.delete_producer_offsets(following),
        lambda deleted: expect(deleted, True),
    )

    # -- snapshots ---------------------------------------------------------------------------------
    app = f"{prefix}-app"
    created = steps.run(
        "CreateSnapshot",
        lambda: write.create_snapshot(app, ["t0", "t1"]),
        lambda s: expect(s.state, SnapshotState.CREATED),
    )
    generation = created.generation if created is not None else 1
    uploaded = steps.run(
        "UploadCheckpoint",
        lambda: write.upload_checkpoint(app, generation, "t1", "large", LARGE),
        lambda u: expect(u.size, len(LARGE)),
    )
    t0 = TaskSnapshot("t0", offsets, {"small": SMALL, "medium": MEDIUM})
    t1 = TaskSnapshot("t1", moved, {}, {"large": uploaded.upload_id} if uploaded else {})
    steps.run(
        "ReportTaskSnapshot",
        lambda: write.report_task_snapshot(app, generation, t0),
        lambda s: expect(s.state, SnapshotState.CREATED),
    )
    steps.run(
        "ReportTaskSnapshot completing",
        lambda: write.report_task_snapshot(app, generation, t1),
        lambda s: expect(s.state, SnapshotState.COMPLETED),
    )
    steps.run(
        "GetCurrentSnapshot@read",
        lambda: read.get_current_snapshot(app, consistent=True),
        lambda s: expect((s.generation, s.state), (generation, SnapshotState.COMPLETED)),
    )

    def payloads(snapshot: Any) -> str | None:
        got = {t.task_id: dict(t.checkpoints) for t in snapshot.tasks}
        return expect(got["t0"], {"small": SMALL, "medium": MEDIUM})

    steps.run(
        "GetSnapshot@read", lambda: read.get_snapshot(app, generation, include_checkpoints=True), payloads
    )
    if uploaded is not None:
        steps.run(
            "ReadCheckpoint@read",
            lambda: b"".join(read.read_checkpoint(app, generation, "t1", "large")),
            lambda data: expect(hashlib.sha256(data).hexdigest(), hashlib.sha256(LARGE).hexdigest()),
        )
    steps.run(
        "ListSnapshots@read",
        lambda: read.list_snapshots(app),
        lambda p: expect([s.generation for s in p.items], [generation]),
    )
    steps.run(
        "SetRetentionPolicy",
        lambda: write.set_retention_policy(app, keep_last_completed=5, completed_ttl_ms=0),
        lambda p: expect(p.keep_last_completed, 5),
    )

    # -- leases ------------------------------------------------------------------------------------
    lease_id, ref = f"{prefix}-lease", SnapshotRef(app, generation)
    steps.run(
        "AcquireSnapshots",
        lambda: write.acquire_snapshots(lease_id, [ref], duration_ms=600_000),
        lambda r: expect((r.lease.snapshots, r.unavailable), ((ref,), ())),
    )
    steps.run(
        "GetLease@read", lambda: read.get_lease(lease_id), lambda lease: expect(lease.snapshots, (ref,))
    )
    steps.run(
        "RenewLease",
        lambda: write.renew_lease(lease_id, duration_ms=600_000),
        lambda lease: expect(lease.lease_id, lease_id),
    )
    steps.run(
        "ListLeases@read",
        lambda: read.list_leases(page_size=1000),
        lambda p: expect(lease_id in {x.lease_id for x in p.items}, True),
    )
    steps.refused(
        "DeleteSnapshot@read while leased", lambda: read.delete_snapshot(app, generation), "LeaseHeld"
    )
    steps.run(
        "ReleaseSnapshots",
        lambda: write.release_snapshots(lease_id, [ref]),
        lambda lease: expect(lease.snapshots, ()),
    )
    steps.run("DropLease", lambda: write.drop_lease(lease_id), lambda dropped: expect(dropped, True))
    steps.run("DeleteSnapshot@read", lambda: read.delete_snapshot(app, generation), lambda d: expect(d, True))
    aborted = steps.run("CreateSnapshot to abort", lambda: write.create_snapshot(app, ["t0"]))
    if aborted is not None:
        steps.run(
            "AbortSnapshot@read",
            lambda: read.abort_snapshot(app, aborted.generation, "test"),
            lambda s: expect(s.state, SnapshotState.ABORTED),
        )

    # -- backlog -----------------------------------------------------------------------------------
    job = f"{prefix}-job"
    boundaries = (Offset("orders", 0, 100), Offset("orders", 1, 100))
    steps.run(
        "MarkBacklog",
        lambda: write.mark_backlog(job, boundaries),
        lambda s: expect(s.processing_backlog, True),
    )
    steps.run(
        "ReportProgress@read",
        lambda: read.report_progress(job, boundaries),
        lambda r: expect(r.status.processing_backlog, False),
    )
    steps.run(
        "GetBacklogStatus",
        lambda: write.get_backlog_status(job),
        lambda s: expect(s.processing_backlog, False),
    )
    steps.run("ClearBacklog@read", lambda: read.clear_backlog(job), lambda cleared: expect(cleared, True))
    return steps.results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", required=True)
    parser.add_argument("--read", required=True)
    parser.add_argument("--prefix", required=True)
    args = parser.parse_args(argv)
    with (
        CoordinatorClient(args.write, timeout_s=60) as write,
        CoordinatorClient(args.read, timeout_s=60) as read,
    ):
        print(json.dumps(run(write, read, args.prefix), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
