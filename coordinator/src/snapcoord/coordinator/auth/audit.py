"""The audit trail: one structured line per mutating call, on logger ``snapcoord.audit``.

Each line carries principal, method, the ids the request named (by kind), the outcome code, the
latency and the peer: in a JSON log (``--log-format json``) as fields of the line's object, next
to ``"audit": "rpc"``; in a text log as ``key=value`` pairs in the message (the ids as JSON).
Never the payload, never a credential: a refused token is not in the line, only the fact that the
call was unauthenticated. Route the logger to its own handler to keep the trail apart from the
service log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from snapcoord.coordinator.auth.policy import IdRef

LOGGER_NAME = "snapcoord.audit"
_log = logging.getLogger(LOGGER_NAME)

#: Ids and characters per id kept in a line: a request naming a thousand snapshots is cut, not a
#: thousand-entry line.
MAX_IDS_PER_KIND = 32
MAX_ID_CHARS = 256


def audit_record(
    *, principal: str, method: str, ids: Iterable[IdRef], code: str, latency_ms: float, peer: str
) -> dict[str, object]:
    by_kind: dict[str, list[str]] = {}
    dropped = 0
    for kind, value in ids:
        values = by_kind.setdefault(kind.value, [])
        if len(values) >= MAX_IDS_PER_KIND:
            dropped += 1
        elif value not in values:
            values.append(value[:MAX_ID_CHARS])
    record: dict[str, object] = {
        "audit": "rpc",
        "principal": principal,
        "method": method,
        "ids": by_kind,
        "code": code,
        "latency_ms": round(latency_ms, 3),
        "peer": peer,
    }
    if dropped:
        record["ids_not_listed"] = dropped
    return record


def enabled() -> bool:
    """True when ``write`` would log a line: callers skip building the record otherwise (a log
    level above INFO, or the audit logger routed off)."""
    return _log.isEnabledFor(logging.INFO)


def write(record: dict[str, object]) -> None:
    """Log ``record`` (``audit_record``): its keys are structured fields of the line (the JSON
    formatter lifts them, ``logging_setup.STRUCTURED_FIELDS``), repeated in the message."""
    text = " ".join(f"{key}={_text(value)}" for key, value in record.items() if key != "audit")
    _log.info("audit %s", text, extra=record)


def _text(value: object) -> str:
    """A value as one token of the text line: plain when it is a string without spaces or quotes."""
    if isinstance(value, str) and value and not any(c.isspace() or c in "\"'=" for c in value):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
