"""Identifier rules shared by every RPC (docs/api.md: 1-200 characters of ``[A-Za-z0-9._:-]``).

Identifiers become ZooKeeper path segments and S3 key segments, so the rule also keeps them safe
there: no ``/``, and never ``.`` or ``..``.
"""

from __future__ import annotations

import re

from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.errors import InvalidArgument

MAX_ID_LENGTH = 200
_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
_ID_CHAR_RE = re.compile(r"[A-Za-z0-9._:-]")


def is_valid_id(value: str) -> bool:
    """True when ``value`` may be used as an identifier."""
    return bool(_ID_RE.fullmatch(value)) and value not in (".", "..")


def require_id(field: str, value: str) -> str:
    """Return ``value`` or raise ``InvalidArgument`` naming ``field`` and what is wrong."""
    if not value:
        raise InvalidArgument(f"{field} is required (1-{MAX_ID_LENGTH} characters of [A-Za-z0-9._:-])")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{field} is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
    if value in (".", ".."):
        raise InvalidArgument(f"{field} must not be {value!r}")
    if not _ID_RE.fullmatch(value):
        bad = "".join(sorted({c for c in value if not _ID_CHAR_RE.fullmatch(c)}))
        raise InvalidArgument(
            f"{field} {quote_prefix(value)} contains {quote_prefix(bad, 10)}; "
            "allowed characters are [A-Za-z0-9._:-]"
        )
    return value
