"""The stored formats: versioned JSON documents for metadata records and payloads.

Every document carries ``"version"``; writers write the current version, readers read every
version ever written (tests pin the bytes with golden files). A document from a newer snapcoord
is refused rather than misread, with ``NewerFormat`` (an intact record a newer release wrote), not
as corrupt. Every codec (``producer_codec``, ``snapshot_codec``, ``backlog_codec``, ``claims_codec``,
the lease records in ``leases``) writes and reads through these two functions.
"""

from __future__ import annotations

import json
from typing import Any

from snapcoord.coordinator.errors import CorruptRecord, NewerFormat

#: What reading a decoded document of the wrong shape raises: a missing key, a string where a
#: list belongs, a number too large for an int (JSON's ``1e999`` is infinity)...
SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError)


#: Every ``kind`` a ``CorruptRecord`` names: the label values of
#: ``snapcoord_corrupt_records_total`` (each exported from the start, at 0).
RECORD_KINDS = (
    "producer_record",
    "producer_offsets_payload",
    "snapshot_app_record",
    "snapshot_record",
    "snapshot_report_counter",
    "task_report",
    "checkpoint_payload",
    "retention_policy",
    "lease",
    "pin_index",
    "backlog_job_record",
    "backlog_boundaries_payload",
    "backlog_progress_shard",
    "backlog_unmarked_set",
    "upload_intent",
    "commit_claim_table",
    "commit_claim",
)


def kind_of(what: str) -> str:
    """The ``kind`` a ``CorruptRecord`` names (a metric label): ``what`` in snake case."""
    return what.replace(" ", "_")


def corrupt(what: str, detail: str, data: bytes) -> CorruptRecord:
    """The error of the stored ``what`` in ``data`` that cannot be read (``detail`` says why)."""
    return CorruptRecord(f"stored {what} {detail}", kind=kind_of(what), data=data)


def malformed(what: str, e: BaseException, data: bytes) -> CorruptRecord:
    """The error of a stored ``what`` whose document has the wrong shape (``e`` says where)."""
    return corrupt(what, f"is malformed: {e!r}", data)


def dump(doc: dict[str, Any]) -> bytes:
    """``doc`` as JSON bytes; sorted keys and no spaces, so the same document always gives the
    same bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def load(data: bytes, what: str, supported: int) -> dict[str, Any]:
    """The document stored in ``data``, refused with ``CorruptRecord`` (naming ``what``) when it is
    not a JSON object with a version (truncated, garbled, nested too deep to parse), and with
    ``NewerFormat`` when its version is newer than ``supported``."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise corrupt(what, f"is not JSON: {e}", data) from e
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
        raise corrupt(what, "has no version field", data)
    version = doc["version"]
    if version > supported:
        raise NewerFormat(
            f"stored {what} has format version {version}, newer than this snapcoord reads ({supported}): "
            "upgrade this coordinator (a newer release wrote the record; it is not corrupt)",
            kind=kind_of(what),
            version=version,
            supported=supported,
            data=data,
        )
    return doc
