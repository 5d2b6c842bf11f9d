"""Every decoder of a stored record refuses a truncated, garbled or mistyped record with
``CorruptRecord`` naming its kind, and never with anything else (a ``KeyError``, an
``OverflowError`` from ``1e999``, a ``RecursionError`` from deep nesting...), which would reach a
caller as INTERNAL with a traceback and stop a janitor pass."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest

from snapcoord.coordinator.domain import backlog_codec, claims_codec, leases, producer_codec, snapshot_codec
from snapcoord.coordinator.domain.backlog import Boundaries, JobRecord, ShardProgress
from snapcoord.coordinator.domain.claims import CommitClaim, TableRecord
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
from snapcoord.coordinator.errors import CorruptRecord, NewerFormat, Reason
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.transport.status import status_for


@dataclass(frozen=True)
class Codec:
    kind: str
    sample: bytes
    decode: Callable[[bytes], object]


SNAPSHOT = SnapshotRecord("app", 3, State.COMPLETED, ("a", "b"), 2, 1, 2, 2, 9, 0, (("by", "me"),), "")
REPORT = TaskReport(
    "a",
    (Offset("s", 0, 5),),
    (
        CheckpointRef("state", "snapshots/app/3/a/x", 3, "ab"),
        CheckpointRef("small", "", 2, "cd", inline=b"hi"),
    ),
    "digest",
)
CODECS = [
    Codec(
        "producer_record",
        producer_codec.encode_producer_record(ProducerRecord("p", "producers/p/k", 1, 2)),
        producer_codec.decode_producer_record,
    ),
    Codec(
        "producer_record",
        producer_codec.encode_producer_record(
            ProducerRecord("p", "", 1, 2, inline=(Offset("s", 0, 1),), inline_registration="r")
        ),
        producer_codec.decode_producer_record,
    ),
    Codec(
        "producer_offsets_payload",
        producer_codec.encode_producer_offsets("p", (Offset("s", 0, 1), Offset("s", 1, 2))),
        producer_codec.decode_producer_offsets,
    ),
    Codec("snapshot_app_record", snapshot_codec.encode_app(3), snapshot_codec.decode_app),
    Codec("snapshot_report_counter", snapshot_codec.encode_reported(2), snapshot_codec.decode_reported),
    Codec("snapshot_record", snapshot_codec.encode_snapshot(SNAPSHOT), snapshot_codec.decode_snapshot),
    Codec("task_report", snapshot_codec.encode_task_report(REPORT), snapshot_codec.decode_task_report),
    Codec(
        "retention_policy",
        snapshot_codec.encode_retention(RetentionPolicy(2, 60_000)),
        snapshot_codec.decode_retention,
    ),
    Codec(
        "lease",
        leases.encode_lease(Lease("l", 1000, 5000, (SnapshotRef("app", 3),), "inc")),
        leases.decode_lease,
    ),
    Codec("pin_index", leases.encode_pins({"l": 5000, "m": 6000}), leases.decode_pins),
    Codec(
        "backlog_job_record",
        backlog_codec.encode_job_record(JobRecord("j", "m", 3, 2, 7)),
        backlog_codec.decode_job_record,
    ),
    Codec(
        "backlog_boundaries_payload",
        backlog_codec.encode_boundaries(Boundaries("j", "m", (Offset("s", 0, 5), Offset("s", 1, 6)))),
        backlog_codec.decode_boundaries,
    ),
    Codec(
        "backlog_progress_shard",
        backlog_codec.encode_shard(ShardProgress((4, None), {0: "r"})),
        lambda data: backlog_codec.decode_shard(data, 2),
    ),
    Codec(
        "backlog_unmarked_set",
        backlog_codec.encode_unmarked(frozenset({"0123456789abcdef", "fedcba9876543210"})),
        backlog_codec.decode_unmarked,
    ),
    Codec(
        "upload_intent",
        intents.encode(intents.Intent(("k",), 5, intents.UploadInfo("app", 3, "a", "state", 3, "ab"))),
        intents.decode,
    ),
    Codec(
        "commit_claim_table",
        claims_codec.encode_table(TableRecord("t", 3, 7, 9, 12, 2)),
        claims_codec.decode_table,
    ),
    Codec(
        "commit_claim", claims_codec.encode_claim(CommitClaim(7, 3, "fence", 9)), claims_codec.decode_claim
    ),
]
IDS = [f"{c.kind}-{i}" for i, c in enumerate(CODECS)]

#: Values a hand edit or a bit flip may leave where a field was.
WRONG_VALUES: list[object] = [None, "x", "", [], {}, [[1, 2]], {"a": 1}, -5, True, 1.5, "1e999"]


def refused(codec: Codec, data: bytes) -> CorruptRecord:
    with pytest.raises(CorruptRecord) as e:
        codec.decode(data)
    assert e.value.kind == codec.kind, e.value
    assert e.value.data == data  # kept so that a reader of several nodes can tell which it was
    return e.value


def decodes_or_refuses(codec: Codec, data: bytes) -> None:
    """Some edits leave a readable record (a string field now "x"); any other outcome is refused."""
    try:
        codec.decode(data)
    except CorruptRecord as e:
        assert e.kind == codec.kind, e


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_the_sample_decodes(codec: Codec) -> None:
    codec.decode(codec.sample)


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_truncated_records_are_refused(codec: Codec) -> None:
    for end in (1, len(codec.sample) // 2, len(codec.sample) - 1):
        refused(codec, codec.sample[:end])
    if codec.kind != "snapshot_report_counter":  # an empty counter node is a count of 0
        refused(codec, b"")


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_garbled_records_are_refused(codec: Codec) -> None:
    rng = random.Random(codec.kind)
    for _ in range(20):
        refused(codec, bytes(rng.randrange(256) for _ in range(len(codec.sample))))
    refused(codec, b"\xff\xfe" + codec.sample)  # not UTF-8
    for other in (b"[]", b'"x"', b"1", b"null", b'{"version":"1"}', b"{}"):
        refused(codec, other)
    refused(codec, b"[" * 100_000 + b"]" * 100_000)  # too deep for the JSON parser
    for i in range(0, len(codec.sample), 3):  # one byte changed: refused or still a valid record
        decodes_or_refuses(codec, codec.sample[:i] + bytes([codec.sample[i] ^ 0x20]) + codec.sample[i + 1 :])


#: Fields a record of this kind may lack (read with a default); the others are required.
OPTIONAL = {"lease": {"incarnation"}, "upload_intent": {"upload"}}


def with_infinity(doc: dict[str, object], names: list[str]) -> bytes:
    """``doc`` with the fields ``names`` set to JSON's ``1e999`` (which Python reads as infinity)."""
    text = json.dumps({k: ("INF" if k in names else v) for k, v in doc.items()})
    return text.replace('"INF"', "1e999").encode()


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_fields_of_the_wrong_type_or_missing_are_refused(codec: Codec) -> None:
    doc = json.loads(codec.sample)
    fields = [k for k in doc if k != "version"]
    for name in fields:
        for value in WRONG_VALUES:
            decodes_or_refuses(codec, json.dumps({**doc, name: value}).encode())
        decodes_or_refuses(codec, with_infinity(doc, [name]))
        if name not in OPTIONAL.get(codec.kind, set()):
            refused(codec, json.dumps({k: v for k, v in doc.items() if k != name}).encode())
    # Every integer field infinite: int() of it raises OverflowError, which is refused too.
    integers = [k for k in fields if type(doc[k]) is int]
    if integers:
        refused(codec, with_infinity(doc, integers))


@pytest.mark.parametrize("codec", CODECS, ids=IDS)
def test_a_newer_format_version_is_refused_as_newer_not_corrupt(codec: Codec) -> None:
    doc = json.loads(codec.sample)
    error = refused(codec, json.dumps({**doc, "version": doc["version"] + 100}).encode())
    assert isinstance(error, NewerFormat), error
    assert "newer than this snapcoord reads" in str(error)
    assert int(error.metadata["format_version"]) == doc["version"] + 100
    assert int(error.metadata["supported_format_version"]) < doc["version"] + 100
    # An older or garbled record is corrupt, never "newer".
    assert not isinstance(refused(codec, codec.sample[:-2]), NewerFormat)


def test_a_newer_format_is_failed_precondition_naming_the_versions_not_data_loss() -> None:
    """A version skew (a replica older than a record) must not read as damage: nobody restores a
    sound record from a backup because an old replica answered."""
    sample = snapshot_codec.encode_task_report(REPORT)
    with pytest.raises(NewerFormat) as e:
        snapshot_codec.decode_task_report(sample.replace(b'"version":2', b'"version":7'))
    error = e.value.at("/snapshots/apps/app/gens/3/tasks/a")
    assert isinstance(error, NewerFormat) and error.at("/elsewhere") is error
    status = status_for(error)
    assert status.code is grpc.StatusCode.FAILED_PRECONDITION and not status.unexpected
    assert status.reason == Reason.NEWER_FORMAT
    assert status.metadata == {
        "kind": "task_report",
        "path": "/snapshots/apps/app/gens/3/tasks/a",
        "format_version": "7",
        "supported_format_version": "2",
    }
    assert "format version 7, newer than this snapcoord reads (2): upgrade this coordinator" in status.message


def test_a_corrupt_record_is_data_loss_with_its_kind_and_path() -> None:
    error = CorruptRecord("stored lease is not JSON", kind="lease").at("/leases/records/l1")
    status = status_for(error)
    assert status.code is grpc.StatusCode.DATA_LOSS and not status.unexpected
    assert status.reason == Reason.CORRUPT_RECORD
    assert status.metadata == {"kind": "lease", "path": "/leases/records/l1"}
    assert status.message == "stored lease is not JSON (at /leases/records/l1)"
    assert error.at("/elsewhere") is error  # located once, by the reader closest to the record
