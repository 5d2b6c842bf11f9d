"""Savepoints for Spark's built-in file sink: ``writeStream.format("parquet"|"json"|"csv"|"orc")
.option("path", table)`` without ``exactly_once``.

Spark's file sink commits batch ``N`` by writing entry ``N`` of the table's sink log
(``spark_sink_log``), whose batch ids are the query's batch ids, before the query's checkpoint commits
``N``; every Spark reader of the table reads exactly the files the log lists. So a snapshot cut at
batch ``N`` records the log at ``N``, and a restore makes the log end at ``N`` again: the restored
query (checkpoint at ``N``) runs ``N + 1`` next, and Spark's sink writes it, since it skips only
batches at or below the log's latest. Every reader then sees the batches through ``N`` plus what the
restored query writes, each once.

``SparkFileSink(table)`` is the sink object for ``SnapshotQuery(..., sink=...)`` and
``RestoreTarget(..., sink=...)``. Its positions (``batch_end_positions``) record where batch ``N``
ends in the log, small enough for the snapshot's report:

- ``Offset(name, 0, N + 1)``: the first batch a restore removes;
- ``Offset(name, 1, interval)``: the log's compaction interval then;
- ``Offset(name, 2, F)``: a fingerprint of every entry line a reader of ``N`` read, in order;
- ``Offset(name, 3, C)``: the compaction (or batch 0) those lines start from;
- ``Offset(name, 100 + i, n_i)``: how many of those lines the entries ``C`` .. ``C + i`` hold.

A compaction copies the entries it merges in order, so the lines a reader of ``N`` reads are always
the first ``n_last`` lines of what a reader of any later batch reads, however Spark compacted or
cleaned the log since. The restore takes them from the log as it is now, checks them against ``F``
and cuts the log back to ``N`` (``SparkSinkLog.cut``): entries above ``N`` go, newest first, and
entries at or below ``N`` that Spark's log retention has deleted since are written back, split by
the recorded counts, before the compaction that held them goes. It refuses (``RestoreRefused``,
changing nothing) when the log now ends below ``N`` or its first lines are not the recorded ones (a
restore to an earlier point cut it since, and the query wrote other batches after), or when a data
file the restored log would list is gone.

Spark's sink cannot be fenced: nothing stops a query that still runs from writing after the cut. Stop
the query before restoring it (``restore_to`` checks afterwards that the log ends at ``N`` and
raises otherwise). Part files of the removed batches stay in the directory, unread by every reader
that goes through the log, as Spark leaves those of a failed batch.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

from snapcoord.client import Offset
from snapcoord.spark_connector.sink.protocols import RestoreRefused
from snapcoord.spark_connector.sink.spark_sink_log import (
    COMPACT_INTERVAL_CONF,
    DEFAULT_COMPACT_INTERVAL,
    SinkFileStatus,
    SinkLogError,
    SparkSinkLog,
    files_fingerprint,
    valid_batches,
    visible_files,
)
from snapcoord.spark_connector.storage import Storage, open_location

CUT_PARTITION = 0
INTERVAL_PARTITION = 1
FINGERPRINT_PARTITION = 2
START_PARTITION = 3
COUNTS_PARTITION = 100
_NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")


@runtime_checkable
class UnfencedRestorableSink(Protocol):
    """A sink that a snapshot can record and a restore can put back, but that no epoch can fence:
    Spark itself writes it (``SparkFileSink``), so nothing shuts out a query that still runs. The
    methods are those of ``sinks.RestorableSink`` and ``sinks.RestoreCheckedSink`` of the same names;
    ``restore_snapshot`` checks it with every other sink before the first cut and then cuts it
    without claiming an epoch: stop its query first."""

    def batch_end_positions(self, batch_id: int) -> Sequence[Offset]: ...

    def last_batch_id(self) -> int | None: ...

    def check_restore(self, positions: Sequence[Offset]) -> None: ...

    def restore_to(self, positions: Sequence[Offset]) -> None: ...


class SparkFileSink:
    """The table a query writes with Spark's built-in file sink, as a sink that snapshots record and
    restores cut back (see the module docstring).

    ``table`` is the sink's ``path`` option (any location ``open_location`` reaches, with ``spark``'s
    Hadoop configuration where a classic session is given or active) or a ``Storage`` rooted there.
    ``compact_interval``: the query's ``spark.sql.streaming.fileSink.log.compactInterval`` (default:
    ``spark``'s setting, else Spark's default); it matters only while the log has at most one
    compaction. ``name``: the stream name in positions (default: the directory's name)."""

    def __init__(
        self,
        table: str | Storage,
        *,
        spark: Any | None = None,
        compact_interval: int | None = None,
        name: str | None = None,
    ) -> None:
        storage = open_location(table, spark=spark) if isinstance(table, str) else table
        if compact_interval is None:
            compact_interval = _conf_interval(spark)
        self.log = SparkSinkLog(storage, compact_interval)
        base = posixpath.basename(unquote(urlparse(storage.location).path).rstrip("/"))
        stream = name if name is not None else re.sub(r"[^A-Za-z0-9._:-]", "_", base) or "table"
        if not _NAME_RE.fullmatch(stream) or stream in (".", "..") or stream.startswith("_eo:"):
            raise ValueError(f"sink name {stream!r} must be 1-100 characters of [A-Za-z0-9._:-]")
        self.name = stream

    @property
    def table(self) -> Storage:
        return self.log.table

    def __repr__(self) -> str:
        return f"SparkFileSink({self.table.location!r})"

    # -- what a snapshot records ------------------------------------------------------------------
    def last_batch_id(self) -> int | None:
        return self.log.latest_batch_id()

    def batch_end_positions(self, batch_id: int) -> list[Offset]:
        """Where batch ``batch_id`` ends in the sink log (module docstring). ``LookupError`` when the
        log has not reached ``batch_id``, or no longer holds the entries a reader of it reads."""
        latest = self.log.latest_batch_id()
        if latest is None or latest < batch_id:
            raise LookupError(
                f"{self!r}: the sink log ends at batch {latest}, before the query's batch {batch_id}: "
                "is this the path the query writes to?"
            )
        try:
            entries = self.log.entries_for(batch_id)
        except SinkLogError as e:
            raise LookupError(f"{self!r}: cannot record batch {batch_id}: {e}") from e
        interval = self.log.compact_interval()
        start = min(entries)
        positions = [
            Offset(self.name, CUT_PARTITION, batch_id + 1),
            Offset(self.name, INTERVAL_PARTITION, interval),
            Offset(self.name, FINGERPRINT_PARTITION, 0),
            Offset(self.name, START_PARTITION, start),
        ]
        listed: list[SinkFileStatus] = []
        for i, batch in enumerate(sorted(entries)):
            listed.extend(entries[batch])
            positions.append(Offset(self.name, COUNTS_PARTITION + i, len(listed)))
        positions[2] = Offset(self.name, FINGERPRINT_PARTITION, files_fingerprint(listed))
        return positions

    # -- what a restore does ----------------------------------------------------------------------
    def check_restore(self, positions: Sequence[Offset]) -> None:
        """Raise, changing nothing, when ``restore_to(positions)`` would refuse: ``ValueError`` for
        positions that are not this sink's, ``RestoreRefused`` when the sink no longer holds what they
        recorded below the cut."""
        batch_id, recorded, log = self._recorded(positions)
        self._plan(log, batch_id, recorded)

    def restore_to(self, positions: Sequence[Offset]) -> None:
        """Make the sink log end at the recorded batch, with exactly the files it listed then (module
        docstring); checks first, like ``check_restore``."""
        batch_id, recorded, log = self._recorded(positions)
        self._plan(log, batch_id, recorded)
        try:
            log.cut(batch_id, recorded)
        except SinkLogError as e:
            raise RestoreRefused(f"{self!r}: {e}") from e
        latest = self.log.latest_batch_id()
        if latest != batch_id:
            raise RuntimeError(
                f"{self!r}: after the cut to batch {batch_id} the sink log ends at {latest}: a query "
                "still writes to this table; stop it and restore again"
            )

    def _recorded(
        self, positions: Sequence[Offset]
    ) -> tuple[int, dict[int, tuple[SinkFileStatus, ...]], SparkSinkLog]:
        """The batch; per entry a reader of it reads, the lines it held, taken from the log as it is
        now and checked against the positions' fingerprint; and the log to cut.

        The log is read with the interval Spark derives; when that fails and the recorded interval
        differs, with the recorded one: a restore that a crash interrupted after writing entries back
        below a compaction it had not yet deleted leaves two compactions that mislead the derivation
        (the same restore again then completes the cut; the cut checks that Spark's derivation reads
        the right entries afterwards)."""
        mine = {p.partition: p.offset for p in positions if p.stream == self.name}
        need = (CUT_PARTITION, INTERVAL_PARTITION, FINGERPRINT_PARTITION, START_PARTITION)
        if any(k not in mine for k in need):
            raise ValueError(
                f"positions {list(positions)!r} are not those of a {type(self).__name__} named {self.name!r}"
            )
        batch_id = mine[CUT_PARTITION] - 1
        interval, start = mine[INTERVAL_PARTITION], mine[START_PARTITION]
        batches = list(valid_batches(batch_id, interval)) if batch_id >= 0 and interval > 0 else []
        counts = [mine.get(COUNTS_PARTITION + i) for i in range(len(batches))]
        if not batches or batches[0] != start or any(c is None for c in counts):
            raise ValueError(f"positions {list(positions)!r} do not describe batch {batch_id} of {self!r}")
        first: RestoreRefused | None = None
        for log in (self.log, replace(self.log, interval=interval)):
            if log is not self.log and self.log.compact_interval() == interval:
                break
            try:
                return batch_id, self._lines(log, batch_id, batches, counts, mine), log
            except RestoreRefused as e:
                first = first or e
        assert first is not None
        raise first

    def _lines(
        self,
        log: SparkSinkLog,
        batch_id: int,
        batches: list[int],
        counts: list[int | None],
        mine: dict[int, int],
    ) -> dict[int, tuple[SinkFileStatus, ...]]:
        latest = log.latest_batch_id()
        if latest is None or latest < batch_id:
            raise RestoreRefused(
                f"{self!r}: refusing to restore to batch {batch_id}: the sink log ends at batch {latest}. "
                "It was cut below the snapshot since (a restore of an earlier one): the snapshot's "
                "checkpoint would resume after batches the table no longer lists"
            )
        try:
            listed = log.listed_at(latest)
        except SinkLogError as e:
            raise RestoreRefused(f"{self!r}: cannot read the sink log now: {e}") from e
        total = counts[-1]
        assert total is not None
        prefix = listed[:total]
        if len(prefix) != total or files_fingerprint(prefix) != mine[FINGERPRINT_PARTITION]:
            raise RestoreRefused(
                f"{self!r}: refusing to restore to batch {batch_id}: the sink log no longer begins with "
                f"the {total} file(s) the snapshot recorded through it (fingerprint "
                f"{mine[FINGERPRINT_PARTITION]}, now {files_fingerprint(prefix)} over {len(prefix)}). "
                "A restore of an earlier snapshot cut it below this one since and the query wrote "
                "other batches, or the writer's retention option dropped old files from a compaction"
            )
        recorded: dict[int, tuple[SinkFileStatus, ...]] = {}
        low = 0
        for batch, count in zip(batches, counts, strict=True):
            assert count is not None
            recorded[batch] = prefix[low:count]
            low = count
        return recorded

    def _plan(
        self, log: SparkSinkLog, batch_id: int, recorded: dict[int, tuple[SinkFileStatus, ...]]
    ) -> None:
        try:
            log.plan_cut(batch_id, recorded)
        except SinkLogError as e:
            raise RestoreRefused(f"{self!r}: refusing to restore to batch {batch_id}: {e}") from e
        self._check_data_files(
            batch_id, visible_files(f for batch in sorted(recorded) for f in recorded[batch])
        )

    def _check_data_files(self, batch_id: int, files: Sequence[SinkFileStatus]) -> None:
        """Refuse when a data file the restored log would list is gone or changed size (one listing
        per directory)."""
        by_dir: dict[str, dict[str, int]] = defaultdict(dict)
        for f in files:
            rel = _relative(f.path, self.table.uri())
            if rel is None:
                raise RestoreRefused(
                    f"{self!r}: the sink log lists {f.path}, which is not below the table "
                    f"{self.table.uri()}: not a table this sink reaches"
                )
            directory, leaf = posixpath.split(rel)
            by_dir[directory][leaf] = f.size
        for directory, want in by_dir.items():
            have = {e.name: e.size for e in self.table.list(directory) if not e.is_dir}
            gone = sorted(n for n, size in want.items() if have.get(n) != size)
            if gone:
                shown = ", ".join(posixpath.join(directory, n) for n in gone[:5])
                raise RestoreRefused(
                    f"{self!r}: refusing to restore to batch {batch_id}: {len(gone)} data file(s) its "
                    f"log lists are gone or changed ({shown}{', ...' if len(gone) > 5 else ''})"
                )


def _conf_interval(spark: Any | None) -> int:
    if spark is None:
        return DEFAULT_COMPACT_INTERVAL
    value = spark.conf.get(COMPACT_INTERVAL_CONF, str(DEFAULT_COMPACT_INTERVAL))
    try:
        return int(value)
    except ValueError as e:
        raise ValueError(f"{COMPACT_INTERVAL_CONF} is {value!r}, not a number of batches") from e


def _relative(path: str, root: str) -> str | None:
    """``path`` (a URI as Spark's sink log holds it) relative to the URI ``root``; None when it is not
    below it. ``file:/a`` and ``file:///a`` are the same; user info in the authority is ignored."""
    p, r = urlparse(path), urlparse(root)
    if p.scheme.lower() != r.scheme.lower():
        return None
    if (p.hostname, p.port) != (r.hostname, r.port):
        return None
    p_path = unquote(p.path)
    r_path = unquote(r.path).rstrip("/") + "/"
    if not p_path.startswith(r_path) or p_path == r_path:
        return None
    rel = p_path[len(r_path) :]
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return None
    return rel
