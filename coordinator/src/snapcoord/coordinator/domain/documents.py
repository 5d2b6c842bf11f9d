"""The stored formats: versioned JSON documents for metadata records and payloads.

Every document carries ``"version"``; writers write the current version, readers read every
version ever written (tests pin the bytes with golden files). A document from a newer snapcoord
is refused with a clear error rather than misread. Every codec (``producer_codec``,
``snapshot_codec``, ``backlog_codec``, the lease records in ``leases``) writes and reads through
these two functions.
"""

from __future__ import annotations

import json
from typing import Any

from snapcoord.coordinator.errors import Internal


def dump(doc: dict[str, Any]) -> bytes:
    """``doc`` as JSON bytes; sorted keys and no spaces, so the same document always gives the
    same bytes."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def load(data: bytes, what: str, supported: int) -> dict[str, Any]:
    """The document stored in ``data``, refused with ``Internal`` (naming ``what``) when it is not
    a JSON object with a version, or when its version is newer than ``supported``."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise Internal(f"stored {what} is not JSON: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
        raise Internal(f"stored {what} has no version field")
    version = doc["version"]
    if version > supported:
        raise Internal(
            f"stored {what} has format version {version}, newer than this snapcoord reads ({supported}): "
            "upgrade this coordinator"
        )
    return doc
