"""The sink protocol of the exactly-once wrapper, and a file table that implements it.

A sink that cannot write transactionally can still be made exactly-once by ``exactly_once`` if it can
say where its output ends (``positions()``) and cut everything written after such a point
(``rollback_to(positions)``). Both run on the Spark driver; the data itself is written by executors.

``PartitionedFileSink`` is an append-only table of JSON-lines (or Parquet/CSV/ORC) files under a local
or shared filesystem path, partitioned Hive-style (``table/<col>=<value>/part-...``) and written in
parallel by Spark's executors. Every ``write`` gets the next *write sequence* number ``S``:

1. ``df.write`` puts the batch's part files into ``table/_staging/<seq>-<attempt>/`` (executors, in
   parallel; Spark's own committer; readers ignore ``_``-prefixed directories);
2. the driver moves each part file into its partition directory as
   ``part-<S:012d>-<attempt>-<n>.<ext>``, one atomic rename per file (this step is *not* atomic as a
   whole: a crash in the middle leaves part of the batch visible, exactly the failure the wrapper fixes);
3. the staging directory is removed.

``positions()`` is one ``Offset(name, 0, next_seq)``: every file with a sequence number below
``next_seq`` is the output of a finished or started earlier write. ``rollback_to`` deletes every
published file whose sequence number is ``>= next_seq`` of the given position, and every staging
directory. It is idempotent (a crash during a rollback is repaired by the next one).
Assumes one writer per table at a time (one streaming query).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from snapcoord.client import Offset
from snapcoord.spark_connector.driver import require_driver

_FILE_RE = re.compile(r"^part-(?P<seq>\d{12})-(?P<attempt>[0-9a-f]{12})-(?P<n>\d{5})(?P<ext>\..*)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
STAGING_DIR = "_staging"


@runtime_checkable
class RollbackSink(Protocol):
    """What ``exactly_once`` needs from a sink. Both methods run on the driver.

    - ``positions()``: where the sink's output ends right now, as a non-empty list of
      ``Offset(stream, partition, offset)`` (stream: an identifier of ``[A-Za-z0-9._:-]``; each
      (stream, partition) once; offset >= -1). Examples: one write sequence for a file table; the
      end offset of every partition of a Kafka topic the sink produces to; the max auto-increment id
      of a database table.
    - ``rollback_to(positions)``: delete (or truncate, or mark invalid) everything written after
      ``positions``, which an earlier ``positions()`` returned. Must be idempotent and must tolerate a
      half-finished earlier write or rollback.
    """

    def positions(self) -> Sequence[Offset]: ...

    def rollback_to(self, positions: Sequence[Offset]) -> None: ...


class PartitionedFileSink:
    """An append-only, Hive-partitioned file table written by executors (see the module docstring).

    ``path`` is a local or shared (NFS, mounted) filesystem directory, the same path on the driver
    and on every executor. ``partition_by`` names the columns that become directories. ``name`` is
    the stream name used in positions (default: the directory name, sanitised).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        partition_by: Sequence[str] = (),
        file_format: str = "json",
        name: str | None = None,
        write_options: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path).absolute()
        self.partition_by = tuple(partition_by)
        self.file_format = file_format
        stream = name if name is not None else re.sub(r"[^A-Za-z0-9._:-]", "_", self.path.name) or "table"
        if not _NAME_RE.fullmatch(stream) or stream in (".", ".."):
            raise ValueError(f"sink name {stream!r} must be 1-100 characters of [A-Za-z0-9._:-]")
        self.name = stream
        self.write_options = dict(write_options or {})
        self._next_seq: int | None = None  # cached after the first scan in this process

    def __repr__(self) -> str:
        return f"PartitionedFileSink({str(self.path)!r}, partition_by={self.partition_by!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as configuration (Spark Connect ships the sink with the foreachBatch function).

        The cached sequence number is this process's view: a copy that trusted a stale one would
        register too low a position, and a later rollback to it would delete committed output.
        """
        return {**self.__dict__, "_next_seq": None}

    # -- the protocol ------------------------------------------------------------------------------
    def positions(self) -> list[Offset]:
        require_driver("PartitionedFileSink.positions")
        return [Offset(self.name, 0, self._sequence())]

    def rollback_to(self, positions: Sequence[Offset]) -> None:
        require_driver("PartitionedFileSink.rollback_to")
        mine = [p for p in positions if p.stream == self.name and p.partition == 0]
        if len(mine) != 1:
            raise ValueError(f"positions {list(positions)!r} do not name this sink ({self.name!r}, 0)")
        keep_below = max(mine[0].offset, 0)
        shutil.rmtree(self.path / STAGING_DIR, ignore_errors=True)
        for file, seq in self._data_files():
            if seq >= keep_below:
                file.unlink(missing_ok=True)
        self._next_seq = keep_below

    # -- writing -----------------------------------------------------------------------------------
    def write(self, df: Any, batch_id: int | None = None) -> int:
        """Append ``df`` (a DataFrame) to the table; returns the write sequence number it used.

        ``batch_id`` is informational (it is not part of the file names: a retried batch writes new
        files, which is why this sink alone is at-least-once and needs ``exactly_once``).
        """
        require_driver("PartitionedFileSink.write")
        seq = self._sequence()
        self._next_seq = seq + 1  # consumed before any file appears: a failed write is never reused
        attempt = uuid.uuid4().hex[:12]
        staging = self.path / STAGING_DIR / f"{seq:012d}-{attempt}"
        # "error", not its alias "errorifexists", which Spark Connect's DataFrameWriter rejects.
        writer = df.write.format(self.file_format).mode("error").options(**self.write_options)
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(str(staging))
        for n, src in enumerate(sorted(_staged_part_files(staging))):
            rel_dir = src.parent.relative_to(staging)
            dst_dir = self.path / rel_dir
            dst_dir.mkdir(parents=True, exist_ok=True)
            ext = "".join(src.suffixes[-2:]) if src.name.endswith(".gz") else src.suffix
            self._publish_file(src, dst_dir / f"part-{seq:012d}-{attempt}-{n:05d}{ext}")
        shutil.rmtree(staging, ignore_errors=True)
        return seq

    def _publish_file(self, src: Path, dst: Path) -> None:
        """Make one part file visible (an atomic rename). Subclasses may hook here."""
        os.replace(src, dst)

    # -- reading -----------------------------------------------------------------------------------
    def files(self) -> list[Path]:
        """The published data files, in write order."""
        return [f for f, _ in sorted(self._data_files(), key=lambda fs: (fs[1], str(fs[0])))]

    def read_json_records(self) -> Iterator[dict[str, Any]]:
        """Every record of a JSON-lines table with its partition columns, without Spark (for tests,
        tools and small tables; use ``spark.read.format(fmt).load(path)`` otherwise)."""
        if self.file_format != "json":
            raise ValueError("read_json_records needs file_format='json'")
        for file in self.files():
            parts = dict(seg.split("=", 1) for seg in file.parent.relative_to(self.path).parts if "=" in seg)
            with file.open(encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield {**json.loads(line), **parts}

    # -- internals ---------------------------------------------------------------------------------
    def _sequence(self) -> int:
        if self._next_seq is None:
            self._next_seq = max((seq for _, seq in self._data_files()), default=-1) + 1
        return self._next_seq

    def _data_files(self) -> Iterator[tuple[Path, int]]:
        if not self.path.exists():
            return
        for dirpath, dirnames, filenames in os.walk(self.path):
            dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
            for fname in filenames:
                m = _FILE_RE.match(fname)
                if m:
                    yield Path(dirpath) / fname, int(m.group("seq"))


def _staged_part_files(staging: Path) -> Iterator[Path]:
    for dirpath, _, filenames in os.walk(staging):
        for fname in filenames:
            if fname.startswith("part-"):
                yield Path(dirpath) / fname
