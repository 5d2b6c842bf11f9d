"""Spark's file sink log (``<table>/_spark_metadata/``), read, written and cut on a ``Storage``.

Spark's built-in file sink (``writeStream.format("parquet").option("path", table)``) records which
part files of ``table`` belong to it in this log, and every Spark reader of ``table``
(``spark.read.load(table)``, ``spark.readStream.load(table)``) reads exactly the files the log lists,
whatever else lies in the directory. The format, as Spark writes and reads it:

- one object per batch, named by the batch id (``0``, ``1``, ...): the line ``v1``, then one JSON
  object per line describing a file (``SinkFileStatus``); a batch without files is ``v1`` alone;
- every ``compact_interval``-th batch (ids ``k * interval - 1``) is a *compaction*, named
  ``<id>.compact``: it lists every file of the previous compaction and the batches since, plus its
  own. The files visible at batch ``n`` are therefore those of the last compaction at or before
  ``n`` and of the plain batches after it up to ``n`` (``valid_batches``);
- the interval is ``spark.sql.streaming.fileSink.log.compactInterval`` (10 by default) while the log
  has no compaction; afterwards it is derived from the compactions present, so that a changed
  setting cannot misname existing objects (``derive_compact_interval``);
- the latest batch is the largest id present; a reader reads ``valid_batches(latest)``; Spark's file
  sink skips (does not write again) a batch whose id is at most the latest. Spark deletes old log
  objects on its own (those more than ``spark.sql.streaming.minBatchesToRetain`` batches back, once
  older than ``spark.sql.streaming.fileSink.log.cleanupDelay``), always keeping the newest compaction
  below that point, so the log stays readable at its latest batch but not at every old one.

Each entry object is written whole and only if absent: that write is the commit point of a batch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from snapcoord.spark_connector.storage.base import Storage

LOG_DIR = "_spark_metadata"
VERSION = 1
COMPACT_SUFFIX = ".compact"
DEFAULT_COMPACT_INTERVAL = 10
COMPACT_INTERVAL_CONF = "spark.sql.streaming.fileSink.log.compactInterval"
ADD = "add"
DELETE = "delete"


class SinkLogError(RuntimeError):
    """The sink log cannot be read, written or cut as asked; nothing was changed by the call that
    raised it unless its message says otherwise."""


@dataclass(frozen=True)
class SinkFileStatus:
    """One file of a batch, as Spark's ``SinkFileStatus`` (``path`` is a URI-encoded string).

    Spark (3.1 and later) reads every non-directory entry of the batches it reads as a data file,
    whatever ``action`` says; ``action`` is kept so an entry round-trips unchanged."""

    path: str
    size: int
    is_dir: bool = False
    modification_time: int = 0
    block_replication: int = 1
    block_size: int = 0
    action: str = ADD

    def to_json(self) -> dict[str, Any]:
        # Field names and order as Spark's json4s serialisation writes them.
        return {
            "path": self.path,
            "size": self.size,
            "isDir": self.is_dir,
            "modificationTime": self.modification_time,
            "blockReplication": self.block_replication,
            "blockSize": self.block_size,
            "action": self.action,
        }

    def to_line(self) -> str:
        """``to_json()`` as compact JSON text (what ``json.dumps`` with ``(",", ":")`` separators and
        ``ensure_ascii=False`` gives), built directly: a compaction formats every file of the table."""
        return (
            f'{{"path":{encode_basestring(self.path)},"size":{self.size},'
            f'"isDir":{"true" if self.is_dir else "false"},"modificationTime":{self.modification_time},'
            f'"blockReplication":{self.block_replication},"blockSize":{self.block_size},'
            f'"action":{encode_basestring(self.action)}}}'
        )

    @classmethod
    def from_json(cls, obj: object) -> SinkFileStatus:
        if not isinstance(obj, dict):
            raise ValueError(f"a file status is a JSON object, not {type(obj).__name__}")
        values: list[Any] = [obj.get(key) for key, _ in _FIELDS]
        # Exact types, as JSON decodes them: true/false is no number (bool is an int subclass).
        if tuple(map(type, values)) != _TYPES:
            for (key, kind), value in zip(_FIELDS, values, strict=True):
                if type(value) is not kind:
                    raise ValueError(f"field {key!r} must be a {kind.__name__}, got {value!r}")
        path, size, is_dir, modification_time, block_replication, block_size, action = values
        if action not in (ADD, DELETE):
            raise ValueError(f"action must be {ADD!r} or {DELETE!r}, got {action!r}")
        return cls(path, size, is_dir, modification_time, block_replication, block_size, action)


#: The JSON fields of a file status, in the order of ``SinkFileStatus``'s fields, with their types.
_FIELDS: tuple[tuple[str, type], ...] = (
    ("path", str),
    ("size", int),
    ("isDir", bool),
    ("modificationTime", int),
    ("blockReplication", int),
    ("blockSize", int),
    ("action", str),
)
_TYPES = tuple(kind for _, kind in _FIELDS)


# ---- pure: names, batch arithmetic, format -------------------------------------------------------


def is_compaction_batch(batch_id: int, interval: int) -> bool:
    """Whether ``batch_id`` is a compaction: ids ``interval - 1``, ``2 * interval - 1``, ..."""
    return (batch_id + 1) % interval == 0


def entry_name(batch_id: int, interval: int) -> str:
    """The object name of ``batch_id``'s entry below ``_spark_metadata``."""
    if batch_id < 0:
        raise ValueError(f"batch ids are >= 0, not {batch_id}")
    return f"{batch_id}{COMPACT_SUFFIX}" if is_compaction_batch(batch_id, interval) else str(batch_id)


def batch_id_of(name: str) -> int | None:
    """The batch id an object name stands for, as Spark parses it (``12``, ``19.compact``); ``None``
    for other names (temporary files, ``.crc`` files)."""
    digits = name.removesuffix(COMPACT_SUFFIX)
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)


def checksum_name(name: str) -> str:
    """The checksum file Hadoop's local file system keeps next to ``name`` (``.<name>.crc``). It must
    go with its entry: Spark's next write of that name fails while it exists, and a reader checks an
    entry written anew against it."""
    return f".{name}.crc"


def last_compaction_at_or_before(batch_id: int, interval: int) -> int:
    """The compaction a reader of ``batch_id`` starts from (0 when there is none yet)."""
    return max(0, (batch_id + 1) // interval * interval - 1)


def valid_batches(batch_id: int, interval: int) -> range:
    """The entries a reader reads to list the files visible at ``batch_id``: the last compaction at or
    before it (or batch 0) through ``batch_id``."""
    if batch_id < 0:
        raise ValueError(f"batch ids are >= 0, not {batch_id}")
    return range(last_compaction_at_or_before(batch_id, interval), batch_id + 1)


def batches_before_compaction(batch_id: int, interval: int) -> range:
    """The entries a compaction at ``batch_id`` merges with its own files: the previous compaction (or
    batch 0) through ``batch_id - 1``."""
    if not is_compaction_batch(batch_id, interval):
        raise ValueError(f"{batch_id} is not a compaction batch under interval {interval}")
    return range(max(0, batch_id - interval), batch_id)


def derive_compact_interval(default_interval: int, compaction_ids: Iterable[int]) -> int:
    """The interval Spark uses for a log holding compactions ``compaction_ids``: ``default_interval``
    when there is none; the distance of the two newest when there are two or more; with one (at id
    ``c``, ``n = c + 1``), the smallest divisor of ``n`` from ``default_interval`` up to ``n // 2``,
    else ``n`` (also when the default is ``n // 2`` or more), so that ``c`` stays a compaction."""
    if default_interval <= 0:
        raise ValueError(f"{COMPACT_INTERVAL_CONF} must be positive, not {default_interval}")
    ids = sorted(set(compaction_ids), reverse=True)
    if len(ids) >= 2:
        return ids[0] - ids[1]
    if not ids:
        return default_interval
    n = ids[0] + 1
    if n <= default_interval or default_interval >= n // 2:
        return n
    return next((d for d in range(default_interval, n // 2 + 1) if n % d == 0), n)


def format_entry(files: Iterable[SinkFileStatus]) -> bytes:
    """An entry object's bytes: ``v1`` then one compact JSON object per line, no trailing newline."""
    lines = [f"v{VERSION}"]
    lines += [f.to_line() for f in files]
    return "\n".join(lines).encode("utf-8")


def parse_entry(data: bytes, name: str = "entry") -> tuple[SinkFileStatus, ...]:
    """The files an entry object lists; ``SinkLogError`` naming ``name`` for anything Spark would not
    read (an empty object, a version other than ``v1``, a line that is not a file status)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SinkLogError(f"{name}: not UTF-8 text ({e})") from e
    # Spark splits lines on "\n" and "\r\n"; a final newline ends the last line, it adds none.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if not lines:
        raise SinkLogError(f"{name}: empty, not a sink log entry (an incomplete write?)")
    head = lines[0]
    if not (head.startswith("v") and head[1:].isascii() and head[1:].isdigit()):
        raise SinkLogError(f"{name}: first line {head[:40]!r} is not a log version like 'v1'")
    if int(head[1:]) != VERSION:
        raise SinkLogError(
            f"{name}: log version {head}, this connector reads v{VERSION} "
            "(written by a Spark it does not know)"
        )
    body = lines[1:]
    try:
        # One decoder call for the whole object (a compaction lists every file of the table); a
        # line that is no JSON, or several values on one line, is found line by line below.
        objs = json.loads("[" + ",".join(body) + "]")
        if len(objs) != len(body):
            raise ValueError("not one JSON value per line")
    except ValueError:
        objs = []
        for number, line in enumerate(body, start=2):
            try:
                objs.append(json.loads(line))
            except ValueError as e:  # json.JSONDecodeError is a ValueError
                raise SinkLogError(f"{name} line {number}: not a file status: {e}") from e
    files = []
    for number, obj in enumerate(objs, start=2):
        try:
            files.append(SinkFileStatus.from_json(obj))
        except ValueError as e:
            raise SinkLogError(f"{name} line {number}: not a file status: {e}") from e
    return tuple(files)


def files_fingerprint(files: Iterable[SinkFileStatus]) -> int:
    """A 63-bit digest of ``files`` in order, every field: equal exactly when a log lists the same
    files in the same order."""
    digest = hashlib.sha256(format_entry(files)).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def visible_files(files: Iterable[SinkFileStatus]) -> tuple[SinkFileStatus, ...]:
    """The data files a Spark reader reads from these entries' files: every non-directory one."""
    return tuple(f for f in files if not f.is_dir)


# ---- on a Storage --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SparkSinkLog:
    """The file sink log of the table at ``table`` (a ``Storage`` rooted at the table directory).

    ``default_compact_interval`` is what the writer's or reader's
    ``spark.sql.streaming.fileSink.log.compactInterval`` says; it only matters while the log holds at
    most one compaction. ``interval`` fixes the interval instead of deriving it from the compactions
    present, as Spark does: only to finish a cut that a crash interrupted while it wrote entries back
    (a compaction written back below one not yet deleted misleads the derivation). Every method lists
    the log afresh (nothing is cached across calls)."""

    table: Storage
    default_compact_interval: int = DEFAULT_COMPACT_INTERVAL
    interval: int | None = None

    @property
    def log(self) -> Storage:
        return self.table.child(LOG_DIR)

    def _names(self) -> dict[int, str]:
        """Batch id -> object name of every entry present."""
        return self._listing()[0]

    def _listing(self) -> tuple[dict[int, str], set[str]]:
        """Batch id -> object name of every entry present, and every name in the log directory."""
        out: dict[int, str] = {}
        listing = self.log.list()
        for e in listing:
            batch = batch_id_of(e.name)
            if batch is None or e.is_dir:
                continue
            if batch in out:
                raise SinkLogError(
                    f"{self.log.uri()}: batch {batch} has two entries, {out[batch]!r} and {e.name!r}"
                )
            out[batch] = e.name
        return out, {e.name for e in listing}

    def _interval_of(self, names: Mapping[int, str]) -> int:
        return self.interval if self.interval is not None else self._derived_interval(names)

    def _derived_interval(self, names: Mapping[int, str]) -> int:
        compactions = [b for b, n in names.items() if n.endswith(COMPACT_SUFFIX)]
        return derive_compact_interval(self.default_compact_interval, compactions)

    def compact_interval(self) -> int:
        """The compaction interval Spark would use on this log now (``interval`` when fixed)."""
        return self._interval_of(self._names())

    def batch_ids(self) -> list[int]:
        """The batch ids with an entry present, ascending (old ones may have been cleaned up)."""
        return sorted(self._names())

    def latest_batch_id(self) -> int | None:
        """The latest batch, as Spark determines it: the largest id whose entry is present under the
        name the current interval gives it (``None`` for an empty or absent log)."""
        names = self._names()
        return _latest(names, self._interval_of(names))

    def read_entry(self, batch_id: int) -> tuple[SinkFileStatus, ...]:
        """The files entry ``batch_id`` itself lists (for a compaction: every file through it);
        ``FileNotFoundError`` when it is not present."""
        name = entry_name(batch_id, self.compact_interval())
        return parse_entry(self.log.read_bytes(name), self.log.uri(name))

    def entries_for(self, batch_id: int) -> dict[int, tuple[SinkFileStatus, ...]]:
        """The entries a reader of ``batch_id`` reads (``valid_batches``), by batch id;
        ``SinkLogError`` when one is missing (cleaned up, or never written)."""
        names = self._names()
        interval = self._interval_of(names)
        out: dict[int, tuple[SinkFileStatus, ...]] = {}
        for batch in valid_batches(batch_id, interval):
            name = entry_name(batch, interval)
            if names.get(batch) != name:
                raise SinkLogError(
                    f"{self.log.uri()}: entry {name!r} is missing, so the files of batch {batch_id} "
                    f"cannot be listed (compact interval {interval}; entries present: "
                    f"{_span(names)})"
                )
            try:
                out[batch] = parse_entry(self.log.read_bytes(name), self.log.uri(name))
            except FileNotFoundError as e:
                raise SinkLogError(f"{self.log.uri(name)} vanished while being read") from e
        return out

    def listed_at(self, batch_id: int) -> tuple[SinkFileStatus, ...]:
        """Every entry line a reader of ``batch_id`` reads, in log order (directories too). A
        compaction copies the entries it merges in order, so this is every batch's files through
        ``batch_id`` in batch order, whatever the layout: the list at an earlier batch is a prefix
        of it (unless the writer's ``retention`` option dropped old files from a compaction)."""
        entries = self.entries_for(batch_id)
        return tuple(f for batch in sorted(entries) for f in entries[batch])

    def files_at(self, batch_id: int | None = None) -> tuple[SinkFileStatus, ...]:
        """The data files a Spark reader sees when the log's latest batch is ``batch_id`` (default:
        the latest now), in log order; empty for an empty log."""
        if batch_id is None:
            batch_id = self.latest_batch_id()
            if batch_id is None:
                return ()
        return visible_files(self.listed_at(batch_id))

    def write_batch(self, batch_id: int, files: Sequence[SinkFileStatus]) -> bool:
        """Commit batch ``batch_id`` listing ``files``: write its entry only if absent (a compaction
        when ``batch_id`` is one: every file of the entries it merges, then ``files``). True when this
        call wrote it; False when the batch is already committed (its id is at most the latest, the
        rule by which Spark's own sink skips a batch, or another writer created it first).

        ``SinkLogError`` when ``batch_id`` would leave a gap after the latest batch."""
        names, everything = self._listing()
        interval = self._interval_of(names)
        latest = _latest(names, interval)
        if latest is not None and batch_id <= latest:
            return False
        expected = 0 if latest is None else latest + 1
        if batch_id != expected:
            raise SinkLogError(
                f"{self.log.uri()}: cannot write batch {batch_id}: the next batch is {expected} "
                "(a reader would meet a gap)"
            )
        content: list[SinkFileStatus] = []
        if is_compaction_batch(batch_id, interval):
            for batch in batches_before_compaction(batch_id, interval):
                name = entry_name(batch, interval)
                try:
                    data = self.log.read_bytes(name)
                except FileNotFoundError as e:
                    raise SinkLogError(
                        f"{self.log.uri(name)} is missing: compaction {batch_id} cannot list the "
                        "files before it"
                    ) from e
                content.extend(parse_entry(data, self.log.uri(name)))
        content.extend(files)
        name = entry_name(batch_id, interval)
        if checksum_name(name) in everything:  # left by an earlier delete of this name
            self.log.delete(checksum_name(name))
        try:
            self.log.write_bytes(name, format_entry(content), exclusive=True)
        except FileExistsError:
            return False
        return True

    def cut(
        self,
        batch_id: int,
        recorded: Mapping[int, Sequence[SinkFileStatus]] | None = None,
    ) -> CutResult:
        """Make ``batch_id`` the log's latest batch: delete every entry above it, newest first.

        ``recorded`` is what ``entries_for(batch_id)`` returned when the position was recorded (a
        snapshot). Every entry a reader of ``batch_id`` needs that is still present must equal it;
        entries Spark has cleaned up since (they lie below a newer compaction) are written back
        from it before the compaction that covered them is deleted, so no file at or below
        ``batch_id`` ever leaves the log. Without ``recorded`` such a cut is refused.

        Every check runs before the first change: ``SinkLogError`` (nothing changed) when the log is
        behind ``batch_id``, differs from ``recorded`` below the cut, or lacks an entry that nothing
        can restore. Deleting newest first means a concurrent reader sees the log at some batch
        between the old latest and ``batch_id``, each complete; only while cleaned-up entries are
        written back can a reader planning at that moment fail (or, when ``batch_id`` is itself a
        compaction, see an empty table), from the write of the compaction to the delete of the one
        above. A crash leaves a log that a repeated ``cut`` with the same arguments completes (on a
        log whose ``interval`` is fixed to the recorded one when the crash left two compactions that
        are not adjacent: ``SparkFileSink`` does that)."""
        plan = self.plan_cut(batch_id, recorded)
        for name in plan.delete_above:
            self.log.delete(name)
        for name, data in plan.write_back:
            self.log.delete(checksum_name(name))
            try:
                self.log.write_bytes(name, data, exclusive=True)
            except FileExistsError as e:
                # plan_cut saw it absent: another writer is at work on this log.
                raise SinkLogError(
                    f"{self.log.uri(name)} appeared while the cut wrote it back: another writer "
                    "is using this sink log; stop it and cut again"
                ) from e
        for name in plan.delete_last:
            self.log.delete(name)
        return CutResult(
            deleted=plan.delete_above + plan.delete_last,
            written_back=tuple(name for name, _ in plan.write_back),
        )

    def plan_cut(
        self,
        batch_id: int,
        recorded: Mapping[int, Sequence[SinkFileStatus]] | None = None,
    ) -> CutPlan:
        """The changes ``cut`` makes, computed and checked without changing anything."""
        names, everything = self._listing()
        interval = self._interval_of(names)
        latest = _latest(names, interval)
        where = self.log.uri()
        if latest is None or latest < batch_id:
            raise SinkLogError(
                f"{where}: the log ends at batch {latest}, before batch {batch_id}: the sink was "
                "cut back below it (or never reached it); restoring it would lose nothing it holds "
                "but cannot bring back what is gone"
            )
        recorded_norm = None if recorded is None else {b: tuple(fs) for b, fs in recorded.items()}
        needed = valid_batches(batch_id, interval)
        if recorded_norm is not None and sorted(recorded_norm) != list(needed):
            raise SinkLogError(
                f"{where}: the recorded entries are for batches {sorted(recorded_norm)}, a reader of "
                f"batch {batch_id} needs {list(needed)} (compact interval {interval}): the log's "
                "compaction interval changed since"
            )
        missing: list[int] = []
        for batch in needed:
            name = entry_name(batch, interval)
            if names.get(batch) != name:
                if batch in names:
                    raise SinkLogError(f"{where}: batch {batch} is named {names[batch]!r}, not {name!r}")
                missing.append(batch)
                continue
            if recorded_norm is not None:
                present = parse_entry(self.log.read_bytes(name), self.log.uri(name))
                if present != recorded_norm[batch]:
                    raise SinkLogError(
                        f"{self.log.uri(name)} differs from what was recorded for batch {batch}: "
                        "the sink's history below the cut changed since (a restore to an earlier "
                        "point, or another writer)"
                    )
        if missing and recorded_norm is None:
            raise SinkLogError(
                f"{where}: entries for batches {missing} are gone (cleaned up by Spark) and nothing "
                f"recorded them, so batch {batch_id} cannot be made the latest without losing files"
            )
        above = sorted((b for b in names if b > batch_id), reverse=True)
        write_back: list[tuple[str, bytes]] = []

        def with_checksums(batches: Sequence[int]) -> list[str]:
            out = []
            for b in batches:
                out.append(names[b])
                if checksum_name(names[b]) in everything:
                    out.append(checksum_name(names[b]))
            return out

        delete_above = with_checksums(above)
        delete_last: list[str] = []
        if missing:
            assert recorded_norm is not None
            # The newest compaction above the cut covers the missing entries' files: it stays until
            # they are back (plain entries first, they change no reader's view; the compaction
            # after), and goes last.
            if above:
                delete_above = with_checksums(above[:-1])
                delete_last = with_checksums(above[-1:])
            order = sorted(missing, key=lambda b: (is_compaction_batch(b, interval), b))
            write_back = [(entry_name(b, interval), format_entry(recorded_norm[b])) for b in order]
        # After the cut Spark derives the interval from the compactions left: it must name and
        # read the same entries (a single compaction left can give a larger interval, which is
        # fine exactly when the entries a reader of ``batch_id`` needs stay the same).
        after = {b: n for b, n in names.items() if b <= batch_id}
        after.update({b: entry_name(b, interval) for b in missing})
        post = self._derived_interval(after)
        post_needed = [(b, entry_name(b, post)) for b in valid_batches(batch_id, post)]
        if post_needed != [(b, entry_name(b, interval)) for b in needed] or any(
            after.get(b) != n for b, n in post_needed
        ):
            raise SinkLogError(
                f"{where}: after cutting to batch {batch_id} Spark would derive compact interval "
                f"{post} (now {interval}) and read other entries than those of batch {batch_id}; "
                f"set {COMPACT_INTERVAL_CONF} to {interval}"
            )
        return CutPlan(tuple(delete_above), tuple(write_back), tuple(delete_last))


@dataclass(frozen=True)
class CutPlan:
    """A cut's changes, in order: deletes (newest first, each entry followed by its checksum file
    where there is one), entries written back, the last deletes."""

    delete_above: tuple[str, ...]
    write_back: tuple[tuple[str, bytes], ...]
    delete_last: tuple[str, ...]


@dataclass(frozen=True)
class CutResult:
    deleted: tuple[str, ...]
    written_back: tuple[str, ...]


def _latest(names: Mapping[int, str], interval: int) -> int | None:
    for batch in sorted(names, reverse=True):
        if names[batch] == entry_name(batch, interval):
            return batch
    return None


def _span(names: Mapping[int, str]) -> str:
    if not names:
        return "none"
    ids = sorted(names)
    return f"{len(ids)} from {names[ids[0]]!r} to {names[ids[-1]]!r}"
