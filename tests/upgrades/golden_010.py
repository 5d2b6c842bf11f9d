"""Golden records of 0.1.0, written by 0.1.0's own encoders.

``golden.py`` cannot run in 0.1.0's venv: 0.1.0 kept its producer formats in ``domain.codec``, had
no inline payloads (no format version 2), no report counter beside the snapshot header (reports
were counted in the header's ``reported``), no intents and no lease incarnations. So this script
writes, with 0.1.0's module paths and classes, the kinds 0.1.0 stores, under the file names and
with the values of ``golden.SAMPLES`` (``NAMES``), and ``test_golden`` reads them with the tree's
decoders. Run it with the release's Python::

    <0.1.0 venv>/bin/python tests/upgrades/golden_010.py tests/upgrades/golden/0.1.0

It imports nothing but 0.1.0's snapcoord and the standard library.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

#: The files 0.1.0's golden folder holds: every kind 0.1.0 writes, one file each (its producer
#: records and task reports only with their payload in the blob store).
NAMES = (
    "producer_record_blob.json",
    "producer_offsets_payload.json",
    "snapshot_app_record.json",
    "snapshot_record.json",
    "task_report_blob.json",
    "retention_policy.json",
    "lease.json",
    "pin_index.json",
    "backlog_job_record.json",
    "backlog_boundaries_payload.json",
    "backlog_progress_shard.json",
)


def encoders() -> dict[str, Callable[[], bytes]]:
    """Each of ``NAMES`` and how 0.1.0 encodes its record (imports 0.1.0's modules)."""
    # mypy checks this against the tree, which has no ``domain.codec`` (0.1.0's producer formats).
    from snapcoord.coordinator.domain import backlog_codec, codec, leases, snapshot_codec  # type: ignore[attr-defined]
    from snapcoord.coordinator.domain.backlog import Boundaries, JobRecord, ShardProgress
    from snapcoord.coordinator.domain.offsets import Offset
    from snapcoord.coordinator.domain.producers import ProducerRecord
    from snapcoord.coordinator.domain.snapshots import (
        CheckpointRef,
        RetentionPolicy,
        SnapshotRecord,
        State,
        TaskReport,
    )

    offsets = (Offset("orders", 0, 41), Offset("orders", 1, 7))
    checkpoint = CheckpointRef("state", "snapshots/app/3/task-a/u1", 3, "ab")
    report = TaskReport("task-a", offsets, (checkpoint,), "d1")
    header = SnapshotRecord(
        "app", 3, State.COMPLETED, ("task-a", "task-b"), 2, 1, 2, 2, 9, 0, (("by", "me"),), ""
    )
    lease = leases.Lease("lease-1", 1000, 5000, (leases.SnapshotRef("app", 3),))
    return {
        "producer_record_blob.json": lambda: codec.encode_producer_record(
            ProducerRecord("sink", "producers/sink/k", 1000, 5000)
        ),
        "producer_offsets_payload.json": lambda: codec.encode_producer_offsets("sink", offsets),
        "snapshot_app_record.json": lambda: snapshot_codec.encode_app(3),
        "snapshot_record.json": lambda: snapshot_codec.encode_snapshot(header),
        "task_report_blob.json": lambda: snapshot_codec.encode_task_report(report),
        "retention_policy.json": lambda: snapshot_codec.encode_retention(RetentionPolicy(2, 60_000)),
        "lease.json": lambda: leases.encode_lease(lease),
        "pin_index.json": lambda: leases.encode_pins({"lease-1": 5000}),
        "backlog_job_record.json": lambda: backlog_codec.encode_job_record(JobRecord("job", "mark", 3, 2, 7)),
        "backlog_boundaries_payload.json": lambda: backlog_codec.encode_boundaries(
            Boundaries("job", "mark", offsets)
        ),
        "backlog_progress_shard.json": lambda: backlog_codec.encode_shard(ShardProgress((4, None), {0: "r"})),
    }


def write(folder: Path) -> None:
    """Write every one of ``NAMES`` as 0.1.0 encodes it into ``folder``."""
    encode = encoders()
    if sorted(encode) != sorted(NAMES):
        raise ValueError(f"encoders for {sorted(encode)}, files named {sorted(NAMES)}")
    folder.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        (folder / name).write_bytes(encode[name]())


if __name__ == "__main__":
    write(Path(sys.argv[1]))
