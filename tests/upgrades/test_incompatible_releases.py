"""0.1.0 and 0.2.0 are documented as not to be mixed (CHANGELOG 0.2.0, docs/operations/upgrades.md):
what the documents say goes wrong is shown by measurement, and the documented paths are shown
safe. Both releases are built from their commits and run on one ZooKeeper and S3.

- 0.1.0 refuses a record 0.2.0 keeps inline (format version 2) rather than misread it;
- a snapshot whose last report reaches a 0.1.0 replica stays CREATED until its deadline aborts it,
  and completes when the last report reaches 0.2.0 (the two report counts add up);
- the paths: 0.2.0 reads everything 0.1.0 wrote (all replicas replaced at once), and 0.2.0 run
  with inline payloads off writes only records 0.1.0 reads (before a downgrade).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from harness.coordinator import CoordinatorProcess
from harness.process import wait_until
from snapcoord.client import (
    CoordinatorClient,
    Internal,
    Offset,
    SnapshotRef,
    SnapshotState,
    TaskSnapshot,
)
from upgrades.installed import install
from upgrades.releases import find

pytestmark = [pytest.mark.process, pytest.mark.zookeeper, pytest.mark.s3]

INLINE_OFF = ("--producer-inline-max-bytes", "0", "--snapshot-inline-checkpoint-max-bytes", "0")
OFFSETS = (Offset("orders", 0, 41), Offset("orders", 1, 7))
SMALL = b"a small checkpoint"  # under 0.2.0's 4 KiB inline limit

Start = Callable[..., AbstractContextManager[CoordinatorClient]]


@pytest.fixture
def start(zk_uri: str, s3_uri: str, tmp_path: Path) -> Start:
    """``start(version, *flags)``: a coordinator of ``version`` on this test's chroot and prefix,
    as a client of it."""

    @contextmanager
    def started(version: str, *flags: str) -> Iterator[CoordinatorClient]:
        release = install(find(version))
        args = ["--metadata", zk_uri, "--blobs", s3_uri, "--cleanup-interval", "1s", *flags]
        process = CoordinatorProcess(
            tmp_path / f"{version}-{len(list(tmp_path.iterdir()))}",
            args=args,
            command=[str(release.snapcoord)],
            start_timeout_s=120,
        )
        process.start()
        try:
            with CoordinatorClient(process.target, timeout_s=60) as client:
                yield client
        finally:
            process.kill()

    return started


def test_010_refuses_a_record_020_keeps_inline(start: Start) -> None:
    with start("0.2.0") as new, start("0.1.0") as old:
        new.register_producer_offsets("inline", OFFSETS)
        with pytest.raises(Internal) as refused:
            old.get_producer_offsets("inline")
        assert refused.value.code == "INTERNAL"
        assert new.get_producer_offsets("inline").offsets == OFFSETS


def test_a_snapshot_whose_last_report_reaches_010_stays_created_until_its_deadline(start: Start) -> None:
    with start("0.2.0") as new, start("0.1.0") as old:
        stuck = new.create_snapshot("app", ["t0", "t1"], timeout_ms=5_000).generation
        new.report_task_snapshot("app", stuck, TaskSnapshot("t0", OFFSETS))
        assert (
            old.report_task_snapshot("app", stuck, TaskSnapshot("t1", OFFSETS)).state is SnapshotState.CREATED
        )
        assert new.get_snapshot("app", stuck).state is SnapshotState.CREATED  # both reports in, not complete
        wait_until(
            lambda: new.get_snapshot("app", stuck).state is SnapshotState.ABORTED,
            timeout=120,
            interval=0.5,
            what="the deadline aborting the snapshot",
        )
        # The other way round the counts add up: the last report, through 0.2.0, completes it.
        done = new.create_snapshot("app", ["t0", "t1"]).generation
        old.report_task_snapshot("app", done, TaskSnapshot("t0", OFFSETS))
        assert (
            new.report_task_snapshot("app", done, TaskSnapshot("t1", OFFSETS)).state
            is SnapshotState.COMPLETED
        )


def test_020_reads_everything_010_wrote(start: Start) -> None:
    """Replacing every 0.1.0 replica at once: what they wrote reads back through 0.2.0."""
    with start("0.1.0") as old:
        old.register_producer_offsets("p", OFFSETS)
        generation = old.create_snapshot("app", ["t0"]).generation
        old.report_task_snapshot("app", generation, TaskSnapshot("t0", OFFSETS, {"state": SMALL}))
        old.acquire_snapshots("lease", [SnapshotRef("app", generation)], duration_ms=600_000)
        old.mark_backlog("job", OFFSETS)
    with start("0.2.0") as new:
        assert new.get_producer_offsets("p").offsets == OFFSETS
        snapshot = new.get_snapshot("app", generation, include_checkpoints=True)
        assert snapshot.state is SnapshotState.COMPLETED
        assert dict(snapshot.tasks[0].checkpoints) == {"state": SMALL}
        assert new.get_lease("lease").snapshots == (SnapshotRef("app", generation),)
        assert new.get_backlog_status("job").processing_backlog


def test_020_with_inline_payloads_off_writes_what_010_reads(start: Start) -> None:
    """The documented step before a downgrade: no format version 2 record is written."""
    with start("0.2.0", *INLINE_OFF) as new, start("0.1.0") as old:
        new.register_producer_offsets("p", OFFSETS)
        generation = new.create_snapshot("app", ["t0"]).generation
        new.report_task_snapshot("app", generation, TaskSnapshot("t0", OFFSETS, {"state": SMALL}))
        assert old.get_producer_offsets("p").offsets == OFFSETS
        snapshot = old.get_snapshot("app", generation, include_checkpoints=True)
        assert snapshot.state is SnapshotState.COMPLETED
        assert dict(snapshot.tasks[0].checkpoints) == {"state": SMALL}
