"""Spark sources' offsets as snapcoord ``Offset`` values, with one stream name per source.

Spark writes one offset JSON per source of a query, in the query's source order, in two places:
the progress events (``SourceProgress.startOffset`` / ``endOffset`` / ``latestOffset``, re-indented
by PySpark: ``{"logOffset": 3}``) and the checkpoint's offsets log (``offsets/<batch id>``: a
version line, a metadata line, then one compact line per source, ``-`` for a source without an
offset). ``offsets_of_sources`` maps either to ``Offset(stream, partition, offset)``:

- Kafka: ``{"orders":{"0":12,"1":7}}`` -> ``(<stream>:orders, 0, 12)``, ``(<stream>:orders, 1, 7)``;
- file: ``{"logOffset":4}`` -> ``(<stream>, 0, 4)``;
- rate, memory (a ``LongOffset``): ``5`` -> ``(<stream>, 0, 5)``;
- rate-micro-batch: ``{"offset":49,"timestamp":7000}`` -> ``(<stream>, 0, 49)``;
- no offset yet: ``null``, ``-`` or None -> nothing.

**Stream names are per source.** ``<stream>`` is the source's alias when ``stream_names`` gives one
for its index, else ``<query name>.<source index>`` (characters the coordinator refuses, outside
``[A-Za-z0-9._:-]``, become ``_``). A Kafka source names one stream per topic, ``<stream>:<topic>``,
so two sources of one query reading the same topic never give the same (stream, partition).
Source descriptions (``FileStreamSource[file:/in]``) are not used: they hold refused characters
and change with a path.

**Custom sources.** A source whose JSON is none of the above needs a parser: a callable
``parser(stream, value)`` that takes the stream name and the decoded JSON value and returns the
offsets (or None: "not my format"). Give it for one source with ``parsers={index: parser}``, or
for every query with ``register_parser(parser)`` (tried before the built-in formats, in
registration order). An offset JSON nothing parses raises ``UnknownOffsetFormat`` rather than being
left out: a snapshot or backlog boundary that silently misses a source would be wrong.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapcoord.client import Offset

#: ``parser(stream, decoded JSON value)`` -> offsets, or None when the value is not its format.
OffsetParser = Callable[[str, Any], Iterable[Offset] | None]

_NOT_A_STREAM_CHAR = re.compile(r"[^A-Za-z0-9._:-]")
#: How Spark writes "this source has no offset yet": JSON null in events, ``-`` in the offsets log.
_NO_OFFSET = frozenset({"", "null", "None", "-"})
#: The lowest offset the coordinator accepts (-1: no data yet).
_MIN_OFFSET = -1

_registry_lock = threading.Lock()
_registered: list[OffsetParser] = []


class UnknownOffsetFormat(ValueError):
    """A source's offset JSON that no parser understands; the message names the source."""


def default_stream_name(query_name: str, source_index: int) -> str:
    """``<query name>.<source index>`` in the characters the coordinator accepts."""
    return _NOT_A_STREAM_CHAR.sub("_", f"{query_name}.{source_index}")


def register_parser(parser: OffsetParser) -> None:
    """Add a parser for a custom source's offsets, tried (in registration order) before the built-in
    formats for every source of every query. Registering the same callable twice is a no-op."""
    with _registry_lock:
        if parser not in _registered:
            _registered.append(parser)


def unregister_parser(parser: OffsetParser) -> None:
    with _registry_lock:
        if parser in _registered:
            _registered.remove(parser)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _position(stream: str, partition: int, value: object) -> Offset:
    if not _is_int(value) or value < _MIN_OFFSET:  # type: ignore[operator]
        raise ValueError(f"offset {value!r} of {stream}/{partition} is not an integer >= -1")
    assert isinstance(value, int)
    return Offset(stream, partition, value)


def parse_builtin(stream: str, value: Any) -> tuple[Offset, ...] | None:
    """The built-in formats (see the module docstring); None when ``value`` is none of them."""
    if _is_int(value):  # rate, memory: a LongOffset
        return (_position(stream, 0, value),)
    if not isinstance(value, dict) or not value:
        return None
    if value.keys() == {"logOffset"}:  # file source
        return (_position(stream, 0, value["logOffset"]),)
    if value.keys() == {"offset", "timestamp"} and _is_int(value["timestamp"]):  # rate-micro-batch
        return (_position(stream, 0, value["offset"]),)
    # Kafka: topic -> {partition: offset}
    offsets: list[Offset] = []
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            return None
        name = f"{stream}:{_NOT_A_STREAM_CHAR.sub('_', str(topic))}"
        for partition, position in partitions.items():
            if not str(partition).isdigit():
                return None
            offsets.append(_position(name, int(partition), position))
    return tuple(sorted(offsets, key=lambda o: (o.stream, o.partition)))


def parse_source_offset(
    stream: str, offset_json: str | None, *, parser: OffsetParser | None = None
) -> tuple[Offset, ...]:
    """One source's offsets; () when it has none yet. ``parser`` (this source's own) is tried
    first, then the registered parsers, then the built-in formats."""
    if offset_json is None or offset_json.strip() in _NO_OFFSET:
        return ()
    try:
        value = json.loads(offset_json)
    except ValueError as e:
        raise UnknownOffsetFormat(f"offsets of {stream} are not JSON: {offset_json[:200]!r}") from e
    if value is None:
        return ()
    with _registry_lock:
        chain = ([parser] if parser is not None else []) + list(_registered)
    chain.append(parse_builtin)
    for candidate in chain:
        try:
            parsed = candidate(stream, value)
        except (ValueError, TypeError) as e:
            raise UnknownOffsetFormat(f"offsets of {stream} ({offset_json[:200]!r}): {e}") from e
        if parsed is not None:
            return tuple(parsed)
    raise UnknownOffsetFormat(
        f"offsets of {stream} have an unknown format: {offset_json[:200]!r}; "
        "give the source a parser (parsers={index: parser} or sources.register_parser)"
    )


def stream_name(query_name: str, index: int, stream_names: Sequence[str | None] | None) -> str:
    """The source's alias when ``stream_names`` has one for ``index``, else the default name."""
    alias = stream_names[index] if stream_names is not None and index < len(stream_names) else None
    return alias if alias else default_stream_name(query_name, index)


def offsets_of_sources(
    query_name: str,
    offset_jsons: Sequence[str | None],
    stream_names: Sequence[str | None] | None = None,
    parsers: Mapping[int, OffsetParser] | None = None,
) -> tuple[Offset, ...]:
    """The offsets of a query's sources, one offset JSON per source in the query's source order
    (a progress event's sources, or an offsets log's source lines), sorted by (stream, partition).

    Raises ``UnknownOffsetFormat`` for JSON no parser understands, and ``ValueError`` when two
    sources give the same (stream, partition) (aliases that repeat).
    """
    parsers = parsers or {}
    offsets: list[Offset] = []
    for index, offset_json in enumerate(offset_jsons):
        stream = stream_name(query_name, index, stream_names)
        offsets.extend(parse_source_offset(stream, offset_json, parser=parsers.get(index)))
    offsets.sort(key=lambda o: (o.stream, o.partition))
    for a, b in itertools.pairwise(offsets):
        if (a.stream, a.partition) == (b.stream, b.partition):
            raise ValueError(
                f"two sources of {query_name} give stream {a.stream!r} partition {a.partition}: "
                "give them distinct stream_names"
            )
    return tuple(offsets)


@dataclass(frozen=True)
class OffsetsLogEntry:
    """One file of a checkpoint's offsets log (``offsets/<batch id>``)."""

    batch_timestamp_ms: int
    batch_watermark_ms: int
    #: One offset JSON per source, in the query's source order; None for ``-`` (no offset yet).
    sources: tuple[str | None, ...]


def parse_offsets_log(text: str) -> OffsetsLogEntry:
    """Parse an offsets log file: ``v1``, the metadata JSON line, then one line per source."""
    lines = text.splitlines()
    if not lines or not re.fullmatch(r"v\d+", lines[0].strip()):
        raise ValueError(f"not a Spark offsets log file (first line {lines[:1]!r})")
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 else {}
    except ValueError as e:
        raise ValueError(f"the offsets log metadata line is not JSON: {lines[1][:200]!r}") from e
    sources = tuple(None if line.strip() in _NO_OFFSET else line for line in lines[2:])
    return OffsetsLogEntry(
        int(metadata.get("batchTimestampMs", 0)), int(metadata.get("batchWatermarkMs", 0)), sources
    )
