"""Golden records of a release: one stored record of every kind, written by the release's own
encoders, kept in ``tests/upgrades/golden/<version>/`` so that every later tree must read them.

``python tests/upgrades/golden.py DIR`` writes them with whichever snapcoord the Python running it
imports: the tree's (``scripts/release`` writes the new release's this way) or an installed
release's (``InstalledRelease.python``), so it imports nothing but snapcoord and the standard
library. ``SAMPLES`` names each file, its kind and the decoder of the tree that reads it back.
0.1.0's modules predate these samples: ``golden_010.py`` writes its records.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from snapcoord.coordinator.domain import backlog_codec, leases, producer_codec, snapshot_codec
from snapcoord.coordinator.domain.backlog import Boundaries, JobRecord, ShardProgress
from snapcoord.coordinator.domain.leases import Lease, SnapshotRef
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerRecord
from snapcoord.coordinator.domain.snapshots import (
    CheckpointRef,
    RetentionPolicy,
    SnapshotRecord,
    State,
    TaskReport,
)
from snapcoord.coordinator.kernel import intents

GOLDEN = Path(__file__).resolve().parent / "golden"


@dataclass(frozen=True)
class Sample:
    #: The file's name in a release's golden folder.
    name: str
    #: ``CorruptRecord.kind`` of the record.
    kind: str
    encode: Callable[[], bytes]
    decode: Callable[[bytes], object]


OFFSETS = (Offset("orders", 0, 41), Offset("orders", 1, 7))
BLOB_REPORT = TaskReport(
    "task-a", OFFSETS, (CheckpointRef("state", "snapshots/app/3/task-a/u1", 3, "ab"),), "d1"
)
INLINE_REPORT = TaskReport(
    "task-b", OFFSETS, (CheckpointRef("state", "", 2, "cd", inline=b"hi"),), "d2"
)  # format version 2
SNAPSHOT = SnapshotRecord(
    "app", 3, State.COMPLETED, ("task-a", "task-b"), 2, 1, 2, 2, 9, 0, (("by", "me"),), ""
)

SAMPLES = (
    Sample(
        "producer_record_blob.json",
        "producer_record",
        lambda: producer_codec.encode_producer_record(ProducerRecord("sink", "producers/sink/k", 1000, 5000)),
        producer_codec.decode_producer_record,
    ),
    Sample(
        "producer_record_inline.json",
        "producer_record",
        lambda: producer_codec.encode_producer_record(
            ProducerRecord("sink", "", 1000, 5000, inline=OFFSETS, inline_registration="r1")
        ),
        producer_codec.decode_producer_record,
    ),
    Sample(
        "producer_offsets_payload.json",
        "producer_offsets_payload",
        lambda: producer_codec.encode_producer_offsets("sink", OFFSETS),
        producer_codec.decode_producer_offsets,
    ),
    Sample(
        "snapshot_app_record.json",
        "snapshot_app_record",
        lambda: snapshot_codec.encode_app(3),
        snapshot_codec.decode_app,
    ),
    Sample(
        "snapshot_report_counter.json",
        "snapshot_report_counter",
        lambda: snapshot_codec.encode_reported(2),
        snapshot_codec.decode_reported,
    ),
    Sample(
        "snapshot_record.json",
        "snapshot_record",
        lambda: snapshot_codec.encode_snapshot(SNAPSHOT),
        snapshot_codec.decode_snapshot,
    ),
    Sample(
        "task_report_blob.json",
        "task_report",
        lambda: snapshot_codec.encode_task_report(BLOB_REPORT),
        snapshot_codec.decode_task_report,
    ),
    Sample(
        "task_report_inline.json",
        "task_report",
        lambda: snapshot_codec.encode_task_report(INLINE_REPORT),
        snapshot_codec.decode_task_report,
    ),
    Sample(
        "retention_policy.json",
        "retention_policy",
        lambda: snapshot_codec.encode_retention(RetentionPolicy(2, 60_000)),
        snapshot_codec.decode_retention,
    ),
    Sample(
        "lease.json",
        "lease",
        lambda: leases.encode_lease(Lease("lease-1", 1000, 5000, (SnapshotRef("app", 3),), "inc")),
        leases.decode_lease,
    ),
    Sample("pin_index.json", "pin_index", lambda: leases.encode_pins({"lease-1": 5000}), leases.decode_pins),
    Sample(
        "backlog_job_record.json",
        "backlog_job_record",
        lambda: backlog_codec.encode_job_record(JobRecord("job", "mark", 3, 2, 7)),
        backlog_codec.decode_job_record,
    ),
    Sample(
        "backlog_boundaries_payload.json",
        "backlog_boundaries_payload",
        lambda: backlog_codec.encode_boundaries(Boundaries("job", "mark", OFFSETS)),
        backlog_codec.decode_boundaries,
    ),
    Sample(
        "backlog_progress_shard.json",
        "backlog_progress_shard",
        lambda: backlog_codec.encode_shard(ShardProgress((4, None), {0: "r"})),
        lambda data: backlog_codec.decode_shard(data, 2),
    ),
    Sample(
        "upload_intent.json",
        "upload_intent",
        lambda: intents.encode(
            intents.Intent(("k",), 5, intents.UploadInfo("app", 3, "task-a", "state", 3, "ab"))
        ),
        intents.decode,
    ),
)


def write(folder: Path) -> None:
    """Write every sample, as this Python's snapcoord encodes it, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for sample in SAMPLES:
        (folder / sample.name).write_bytes(sample.encode())


if __name__ == "__main__":
    write(Path(sys.argv[1]))
