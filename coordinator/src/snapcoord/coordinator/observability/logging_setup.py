"""The process's log handler: text for a person at a terminal, one JSON object per line for a collector.

A JSON line always has ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``,
``message`` and ``pid`` (a host may run several coordinator processes); ``exception`` holds the
formatted traceback when there is one. Structured fields a caller passes with ``extra=`` (the
per-RPC line's ``method``, ``code``, ``latency_ms`` and request ids, see ``call_log``) become keys
of their own, so a collector can filter on them without parsing the message. While tracing is
on, a line logged inside a traced call also carries ``trace_id`` and ``span_id``.

Only the standard library: a formatter this small is clearer than a dependency.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

#: ``extra=`` keys the JSON formatter lifts into the object; anything else on a record is ignored,
#: so a library's own record attributes never leak into the output.
STRUCTURED_FIELDS: tuple[str, ...] = (
    "method",
    "code",
    "latency_ms",
    "app_id",
    "generation",
    "producer_id",
    "lease_id",
    "job_id",
    "task_id",
    "trace_id",
    "span_id",
)

#: Returns ``(trace_id, span_id)`` in hex of the span current in this thread, or None.
TraceIds = Callable[[], tuple[str, str] | None]

_trace_ids: TraceIds | None = None


def set_trace_ids(source: TraceIds | None) -> None:
    """Where log lines find the current trace (set by ``tracing`` when it is on)."""
    global _trace_ids
    _trace_ids = source


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages and tracebacks are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for name in STRUCTURED_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value
        if "trace_id" not in out and _trace_ids is not None:
            ids = _trace_ids()
            if ids is not None:
                out["trace_id"], out["span_id"] = ids
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        # default=str: a structured value of an unexpected type still yields a line, never an error.
        return json.dumps(out, ensure_ascii=False, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def resolve_format(fmt: Literal["auto", "json", "text"], stream: TextIO) -> Literal["json", "text"]:
    """``auto`` is text on a terminal and JSON otherwise (a container, a pipe, a file)."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    try:
        return "text" if isatty is not None and isatty() else "json"
    except ValueError:  # a closed stream
        return "json"


def configure(
    level: str, fmt: Literal["auto", "json", "text"], *, stream: TextIO | None = None
) -> Literal["json", "text"]:
    """Send every logger's records at ``level`` and above to ``stream`` (stderr) in ``fmt``;
    returns the format chosen. Replaces handlers a previous call installed."""
    stream = stream if stream is not None else sys.stderr
    chosen = resolve_format(fmt, stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return chosen
