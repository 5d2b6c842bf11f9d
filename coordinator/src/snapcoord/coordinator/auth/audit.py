"""The audit trail: one structured line per mutating call, on logger ``snapcoord.audit``.

Each line is a JSON object: principal, method, the ids the request named (by kind), the outcome
code, the latency and the peer. Never the payload, never a credential: a refused token is not in
the line, only the fact that the call was unauthenticated. Route the logger to its own handler to
keep the trail apart from the service log.
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


def write(record: dict[str, object]) -> None:
    _log.info("%s", json.dumps(record, ensure_ascii=False, separators=(",", ":")))
