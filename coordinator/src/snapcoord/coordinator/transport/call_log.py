"""What is recorded about one finished RPC: the ids it touched, and its log line.

The ids come from the request's own fields, by name, from an allowlist: never payloads (offsets,
checkpoints, labels) and never metadata (where a bearer token travels). A message nested one level
down counts too (``ReportTaskSnapshot``'s ``task.task_id``); repeated fields do not (a lease's
list of snapshots is not one id).

The line's level follows who has to act: OK is DEBUG (a line per call is too much at INFO for a
busy coordinator), a caller's mistake or an expected outcome (NOT_FOUND, ALREADY_EXISTS,
FAILED_PRECONDITION...) is INFO, and what points at the coordinator or its stores (UNAVAILABLE,
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL...) is WARNING. An unexpected exception also has
its own ERROR line with the traceback, logged where it is mapped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc

_log = logging.getLogger("snapcoord.rpc")

#: Request fields worth a key in logs and span attributes: the nouns of the API.
ID_FIELDS: tuple[str, ...] = ("app_id", "generation", "producer_id", "lease_id", "job_id", "task_id")
#: Longest id value recorded whole (a valid id has at most 200 characters). A longer one, which
#: the call refuses, is recorded as its first ``_KEPT_CHARS`` and its length, so a 4 MB id is not
#: a 4 MB log line (twice: message and field) or span attribute.
MAX_RECORDED_ID_CHARS = 200
_KEPT_CHARS = 64

_WARN = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def level_for(code: grpc.StatusCode) -> int:
    if code is grpc.StatusCode.OK:
        return logging.DEBUG
    return logging.WARNING if code in _WARN else logging.INFO


def request_ids(request: Any) -> dict[str, str | int]:
    """The allowlisted id fields set in ``request`` (a protobuf message; anything else has none)."""
    ids: dict[str, str | int] = {}
    _collect(request, ids, depth=0)
    return ids


def _collect(message: Any, ids: dict[str, str | int], *, depth: int) -> None:
    descriptor = getattr(message, "DESCRIPTOR", None)
    if descriptor is None or not hasattr(message, "ListFields"):
        return
    for field, value in message.ListFields():  # only fields that are set, in field-number order
        if field.name in ID_FIELDS and not isinstance(value, (list, tuple)) and field.name not in ids:
            if isinstance(value, str):
                ids[field.name] = _bounded(value)
            elif isinstance(value, int) and not isinstance(value, bool):
                ids[field.name] = value
        elif depth == 0 and field.message_type is not None and hasattr(value, "ListFields"):
            _collect(value, ids, depth=1)  # singular nested message; repeated ones are lists


def _bounded(value: str) -> str:
    if len(value) <= MAX_RECORDED_ID_CHARS:
        return value
    return f"{value[:_KEPT_CHARS]}…({len(value)} chars)"


def log_finished(
    method: str,
    code: grpc.StatusCode,
    latency_s: float,
    ids: Mapping[str, str | int],
    trace_id: str | None = None,
) -> None:
    """Log one finished call: a readable message plus the same facts as structured fields."""
    level = level_for(code)
    if not _log.isEnabledFor(level):
        return
    latency_ms = round(latency_s * 1000, 3)
    detail = "".join(f" {k}={v}" for k, v in ids.items())
    if trace_id:
        detail += f" trace_id={trace_id}"
    _log.log(
        level,
        "%s %s %.1fms%s",
        method,
        code.name,
        latency_ms,
        detail,
        extra={"method": method, "code": code.name, "latency_ms": latency_ms, "trace_id": trace_id, **ids},
    )


def wants_line(code: grpc.StatusCode) -> bool:
    """True when ``log_finished`` would write a line for ``code`` (spares collecting the ids)."""
    return _log.isEnabledFor(level_for(code))
