"""Stored formats of backlog tracking (versioned JSON; see ``codec`` for the conventions).

- The job record (ZooKeeper): a few hundred bytes, with the SHA-256 of its boundaries object
  (``boundaries_sha256``; absent in records written before it was kept, and then not checked).
  The field is optional within version 1: a coordinator that does not know it reads the record
  as before, so replicas of either kind can share a store.
- The boundaries (S3): grouped by stream, so a stream name is stored once however many partitions
  it has; partitions and offsets as parallel lists, in (stream, partition) order, which defines
  the partition indices that progress shards use.
- A progress shard (ZooKeeper): positions by index within the shard (``null``: none reported;
  trailing nulls are left out), and the report tag of each finished partition.
- The unmarked set (ZooKeeper): the sorted ``unmarked_tag`` of each partition reports named that
  the mark does not; at most ~17 bytes a partition.
"""

from __future__ import annotations

import itertools
from typing import Any

from snapcoord.coordinator.domain.backlog import Boundaries, JobRecord, ShardProgress
from snapcoord.coordinator.domain.documents import SHAPE_ERRORS, corrupt, dump, load, malformed
from snapcoord.coordinator.domain.offsets import Offset

JOB_RECORD_VERSION = 1
BOUNDARIES_VERSION = 1
SHARD_VERSION = 1
UNMARKED_VERSION = 1

_INT_OR_NULL = {int, type(None)}


def encode_job_record(record: JobRecord) -> bytes:
    doc: dict[str, Any] = {
        "version": JOB_RECORD_VERSION,
        "job_id": record.job_id,
        "mark_id": record.mark_id,
        "partition_count": record.partition_count,
        "shard_size": record.shard_size,
        "marked_at_ms": record.marked_at_ms,
    }
    if record.boundaries_digest:
        doc["boundaries_sha256"] = record.boundaries_digest
    return dump(doc)


def decode_job_record(data: bytes) -> JobRecord:
    doc = load(data, "backlog job record", JOB_RECORD_VERSION)
    try:
        record = JobRecord(
            job_id=str(doc["job_id"]),
            mark_id=str(doc["mark_id"]),
            partition_count=int(doc["partition_count"]),
            shard_size=int(doc["shard_size"]),
            marked_at_ms=int(doc["marked_at_ms"]),
            boundaries_digest=str(doc.get("boundaries_sha256", "")),
        )
    except SHAPE_ERRORS as e:
        raise malformed("backlog job record", e, data) from e
    if record.partition_count < 1 or record.shard_size < 1:
        raise corrupt("backlog job record", f"of {record.job_id!r} has no partitions or shards", data)
    digest = record.boundaries_digest
    if "boundaries_sha256" in doc and (len(digest) != 64 or digest.strip("0123456789abcdef")):
        raise corrupt("backlog job record", f"of {record.job_id!r} has a malformed boundaries_sha256", data)
    return record


def encode_boundaries(boundaries: Boundaries) -> bytes:
    streams: list[dict[str, Any]] = []
    for o in boundaries.items:
        if not streams or streams[-1]["stream"] != o.stream:
            streams.append({"stream": o.stream, "partitions": [], "boundaries": []})
        streams[-1]["partitions"].append(o.partition)
        streams[-1]["boundaries"].append(o.offset)
    return dump(
        {
            "version": BOUNDARIES_VERSION,
            "job_id": boundaries.job_id,
            "mark_id": boundaries.mark_id,
            "streams": streams,
        }
    )


def decode_boundaries(data: bytes) -> Boundaries:
    doc = load(data, "backlog boundaries payload", BOUNDARIES_VERSION)
    try:
        items: list[Offset] = []
        for s in doc["streams"]:
            stream = str(s["stream"])
            partitions, offsets = s["partitions"], s["boundaries"]
            if len(partitions) != len(offsets):
                raise ValueError(
                    f"stream {stream!r} has {len(partitions)} partitions, {len(offsets)} boundaries"
                )
            items.extend(Offset(stream, int(p), int(b)) for p, b in zip(partitions, offsets, strict=True))
        boundaries = Boundaries(job_id=str(doc["job_id"]), mark_id=str(doc["mark_id"]), items=tuple(items))
    except SHAPE_ERRORS as e:
        raise malformed("backlog boundaries payload", e, data) from e
    # Progress is stored by index in this order: a payload out of order would credit positions to
    # the wrong partitions, so refuse it rather than misread it.
    keys = [(o.stream, o.partition) for o in boundaries.items]
    if any(a >= b for a, b in itertools.pairwise(keys)):
        raise corrupt(
            "backlog boundaries payload",
            f"of {boundaries.job_id!r} is not in (stream, partition) order",
            data,
        )
    return boundaries


def encode_shard(shard: ShardProgress) -> bytes:
    positions = list(shard.positions)
    while positions and positions[-1] is None:
        positions.pop()
    return dump(
        {
            "version": SHARD_VERSION,
            "positions": positions,
            "finished_by": {str(k): v for k, v in shard.finished_by.items()},  # sort_keys orders them
        }
    )


def decode_shard(data: bytes, size: int) -> ShardProgress:
    """A shard of ``size`` partitions (the job record knows how many)."""
    doc = load(data, "backlog progress shard", SHARD_VERSION)
    try:
        stored = doc["positions"]
        # What this coordinator writes is ints and nulls: checked in C, converted only otherwise.
        if type(stored) is not list or not set(map(type, stored)) <= _INT_OR_NULL:
            stored = [None if p is None else int(p) for p in stored]
        finished_by = {int(k): str(v) for k, v in doc["finished_by"].items()}
    except SHAPE_ERRORS as e:
        raise malformed("backlog progress shard", e, data) from e
    if len(stored) > size or any(not 0 <= k < size for k in finished_by):
        raise corrupt("backlog progress shard", f"holds more than its {size} partitions", data)
    return ShardProgress(positions=tuple(stored) + (None,) * (size - len(stored)), finished_by=finished_by)


def encode_unmarked(tags: frozenset[str]) -> bytes:
    return dump({"version": UNMARKED_VERSION, "tags": sorted(tags)})


def decode_unmarked(data: bytes) -> frozenset[str]:
    doc = load(data, "backlog unmarked set", UNMARKED_VERSION)
    try:
        tags = doc["tags"]
        if type(tags) is not list or not all(type(t) is str for t in tags):
            raise TypeError(f"tags is not a list of strings: {tags!r}"[:200])
    except SHAPE_ERRORS as e:
        raise malformed("backlog unmarked set", e, data) from e
    return frozenset(tags)
