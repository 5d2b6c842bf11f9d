"""The process's log handler: text for a person at a terminal, one JSON object per line for a collector.

A JSON line always has ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``,
``message`` and ``pid`` (a host may run several coordinator processes); ``exception`` holds the
formatted traceback when there is one. Structured fields a caller passes with ``extra=`` (the
per-RPC line's ``method``, ``code``, ``latency_ms`` and request ids, see ``call_log``) become keys
of their own, so a collector can filter on them without parsing the message. While tracing is
on, a line logged inside a traced call also carries ``trace_id`` and ``span_id``.

In JSON mode nothing else reaches stdout or stderr: the serving line on stdout is a JSON object
too (``serving_line``), and what writes to the stderr file descriptor behind Python's back (gRPC's
C core: "Failed to add port to server ...") or through ``sys.stderr`` (a traceback at exit) is
read back from a pipe and logged as JSON lines (``capture_stderr``).

Only the standard library: a formatter this small is clearer than a dependency.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, TextIO, cast

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
    # The audit trail's record (``auth.audit``).
    "audit",
    "principal",
    "ids",
    "ids_not_listed",
    "peer",
)

#: Returns ``(trace_id, span_id)`` in hex of the span current in this thread, or None.
TraceIds = Callable[[], tuple[str, str] | None]

_trace_ids: TraceIds | None = None
#: The format ``configure`` chose last (the serving line follows it).
_chosen: Literal["json", "text"] = "text"


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


#: kazoo's connection logger, kept at INFO or above (``configure``).
KAZOO_CLIENT_LOGGER = "kazoo.client"

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
    global _chosen
    stream = stream if stream is not None else sys.stderr
    chosen = resolve_format(fmt, stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # kazoo logs every request and reply with its node data at DEBUG; records hold payloads inline
    # (offsets, small checkpoints), and payloads never reach the log.
    logging.getLogger(KAZOO_CLIENT_LOGGER).setLevel(max(logging.getLogger().level, logging.INFO))
    _chosen = chosen
    return chosen


def chosen_format() -> Literal["json", "text"]:
    """The format of the last ``configure`` (text before any)."""
    return _chosen


#: Logger of what was written to the stderr descriptor without going through logging.
STDERR_LOGGER = "snapcoord.stderr"


def serving_line(message: str, **fields: object) -> str:
    """The serving line printed on stdout: ``message`` as is in a text log; in a JSON log an object
    shaped like a log line (``message`` plus ``fields`` as keys of their own)."""
    if _chosen != "json":
        return message
    record = logging.LogRecord("snapcoord", logging.INFO, __file__, 0, "%s", (message,), None)
    out = json.loads(JsonFormatter().format(record))
    out.update(fields)
    return json.dumps(out, ensure_ascii=False)


def serving_message(line: str) -> str:
    """The message of a ``serving_line`` in either format; "" for a JSON object that is not a log
    line (a console span exporter prints its spans on stdout too)."""
    if not line.startswith("{"):
        return line
    try:
        parsed = json.loads(line)
    except ValueError:
        return line
    message = parsed.get("message") if isinstance(parsed, dict) else None
    return message if isinstance(message, str) else ""


def capture_stderr() -> TextIO:
    """Route the stderr file descriptor through a pipe whose lines are logged as JSON, and return
    a stream on the original stderr for the log handler (JSON mode only).

    gRPC's C core writes its errors straight to descriptor 2, and an interpreter writes tracebacks
    to ``sys.stderr``; neither is a JSON line. A reader thread turns each such line into a record
    of ``STDERR_LOGGER`` (level from the C core's E/W/I prefix); a line that already is a JSON
    object (a ``--processes`` worker's log, which inherits descriptor 2) is passed through. At
    exit descriptor 2 is restored and the pipe drained, so that the last lines are not lost.
    """
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    out = _Lines(os.fdopen(original, "w", buffering=1, encoding="utf-8", errors="replace"))
    log = logging.getLogger(STDERR_LOGGER)

    def pump() -> None:
        with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                text = line.rstrip("\n")
                if not text.strip():
                    continue
                if _is_json_object(text):
                    out.write(text + "\n")
                else:
                    log.log(_native_level(text), "%s", text)

    reader = threading.Thread(target=pump, name="stderr-to-json", daemon=True)
    reader.start()

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last write end here closes: the reader sees its end
        reader.join(timeout=5.0)

    atexit.register(restore)
    return cast(TextIO, out)


class _Lines:
    """A stream whose every write is whole and flushed, under a lock: the log handler and the
    pipe's reader write lines to it from different threads."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            written = self._stream.write(text)
            self._stream.flush()
            return written

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()

    def isatty(self) -> bool:
        return False


def _is_json_object(text: str) -> bool:
    if not text.startswith("{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _native_level(text: str) -> int:
    """gRPC's C core prefixes its lines with E (error), W (warning) or I (info) and a date."""
    levels = {"E": logging.ERROR, "W": logging.WARNING, "I": logging.INFO, "F": logging.CRITICAL}
    if len(text) > 1 and text[0] in levels and text[1].isdigit():
        return levels[text[0]]
    return logging.ERROR
