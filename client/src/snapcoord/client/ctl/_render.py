"""What a command prints: one JSON document (``--output json``) or aligned tables (``table``).

The JSON document is built from the client's dataclasses field by field, so its keys are the
field names of docs/api.md's messages with their units (``*_ms``: milliseconds, since the epoch for
instants), enums as their names and sequences as arrays. A task's checkpoint payloads are never
fetched, so a task lists its store names (``checkpoint_stores``) instead of payloads. Tables show
instants as UTC times and long lists as counts; the JSON document holds everything.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapcoord.client._types import TaskSnapshot


@dataclass(frozen=True)
class Table:
    """Rows under upper-case column names; ``title`` (may be empty) is printed above them."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str = ""


@dataclass(frozen=True)
class Output:
    """A command's result: the JSON document, and the same content as tables."""

    document: Mapping[str, Any]
    tables: tuple[Table, ...]


def to_json(value: Any) -> Any:
    """``value`` (a client dataclass, enum, sequence, mapping or scalar) as plain JSON values."""
    if isinstance(value, TaskSnapshot):
        return {
            "task_id": value.task_id,
            "committed_offsets": to_json(value.committed_offsets),
            "checkpoint_stores": sorted({*value.checkpoints, *value.uploads}),
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"no JSON form for {type(value).__name__}")


def render_json(output: Output) -> str:
    return json.dumps(output.document, indent=2, sort_keys=True)


def render_tables(output: Output) -> str:
    return "\n\n".join(_table(t) for t in output.tables)


def _table(table: Table) -> str:
    cells = [table.columns, *table.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if not table.rows:
        lines.append("(none)")
    return "\n".join([table.title, *lines] if table.title else lines)


def instant(ms: int) -> str:
    """An instant in milliseconds since the epoch as a UTC time; "-" for 0 (not set)."""
    if ms <= 0:
        return "-"
    when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def duration(ms: int) -> str:
    """A duration in milliseconds in the largest unit that divides it (``90s``, ``10m``, ``250ms``)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def fields(*pairs: tuple[str, str]) -> Table:
    """A two-column table of one record's fields."""
    return Table(("FIELD", "VALUE"), tuple(pairs))


def joined(values: Sequence[str]) -> str:
    return ",".join(values) if values else "-"
