"""The sink protocol of the exactly-once wrapper, and a file table that implements it.

A sink that cannot write transactionally can still be made exactly-once by ``exactly_once`` if it can
say where its output ends (``positions()``) and cut everything written after such a point
(``rollback_to(positions)``). Sinks that can also *fence* (``FencedSink``: hide every write of an
older run once a newer run started) are safe against zombie drivers too. All of it runs on the Spark
driver; the data itself is written by executors.

``PartitionedFileSink`` is an append-only table of JSON-lines (or Parquet/CSV/ORC) files under a local
or shared filesystem path, partitioned Hive-style and written in parallel by Spark's executors, with a
commit log (``commit_log``) that makes each batch visible atomically. Every ``write`` gets the next
*write sequence* number ``S`` and runs under the sink's epoch ``E``:

1. ``df.write`` puts the batch's part files into ``table/_staging/<S>-e<E>-<attempt>/`` (executors, in
   parallel; Spark's own committer);
2. the driver renames each part file into its partition directory as
   ``part-<S:012d>-e<E:012d>-<attempt>-<n>.<ext>`` (not yet visible: no commit names them), then
   fsyncs the files and their directories (``_sync_published``);
3. the driver checks that no newer epoch fenced the sink and writes the commit file
   ``_commits/<S>-e<E>.json`` listing those files, atomically (the batch's visibility point), then
   checks again: when a newer epoch announced its fence meanwhile, ``write`` raises ``Fenced`` (the
   commit may be visible or hidden), so Spark never records such a batch as committed and its re-run
   rolls it back;
4. the staging directory is removed.

``fence(E)`` goes in two steps: it announces ``E`` (``_fences/e<E>.intent``: from then on every lower
epoch's check fails), then computes ``from_seq`` from the visible commits and writes the fence. A
commit linked before the announcement is seen by that computation and stays visible; one linked
after it fails its writer's second check. So a commit whose ``write`` returned is never hidden by a
later fence, and a hidden commit was never reported as written.

Readers use ``committed_files()`` / ``read(spark)``: files no visible commit lists (a crashed or
rolled-back write, a zombie's late write) are never read. ``positions()`` is
``[Offset(name, 0, next_seq), Offset(name, 1, epoch)]``; ``rollback_to`` removes the commits at or
after ``next_seq`` written by the epoch named in the positions (the attempt that took them), then every
file of this or an older epoch that no visible commit lists. It is idempotent.

A snapshot records ``batch_end_positions``: ``[Offset(name, 0, cut), Offset(name, 2, fingerprint)]``,
the fingerprint a digest of the visible commits below ``cut`` (``commit_log.commits_fingerprint``).
``restore_to`` (and ``check_restore``, which a restore runs for every sink before it cuts any) refuses
with ``RestoreRefused`` when the visible commits below the cut are no longer those: another restore
cut the sink below it since (a restore of an older snapshot), so the snapshot's checkpoint would
resume after output the sink no longer holds. Nothing a legitimate run does changes them: a rollback
removes only commits at or above its attempt's positions (above every batch Spark committed), and a
fence hides only lower epochs' commits at or above the newest visible one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from snapcoord.client import Offset
from snapcoord.spark_connector.commit_log import (
    COMMITS_DIR,
    FENCES_DIR,
    Commit,
    Fence,
    commits_fingerprint,
    fence_file_name,
    fence_intent_name,
    is_visible,
    parse_commit_name,
    parse_fence_intent_name,
    parse_fence_name,
    visible,
)
from snapcoord.spark_connector.driver import require_driver
from snapcoord.spark_connector.epochs import Fenced

_FILE_RE = re.compile(
    r"^part-(?P<seq>\d{12})-e(?P<epoch>\d{12})-(?P<attempt>[0-9a-f]{12})-(?P<n>\d{5})(?P<ext>\..*)?$"
)
_STAGING_RE = re.compile(r"^(?P<seq>\d{12})-e(?P<epoch>\d{12})-(?P<attempt>[0-9a-f]{12})$")
_NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
STAGING_DIR = "_staging"
#: The partition of ``batch_end_positions`` that holds the fingerprint of the visible commits below the
#: cut (``commit_log.commits_fingerprint``); positions without it (older snapshots) are not checked.
FINGERPRINT_PARTITION = 2


class RestoreRefused(RuntimeError):
    """The sink no longer holds the output a snapshot recorded below its cut (another restore cut it
    back further since): restoring it would lose output silently, so nothing was cut."""


@runtime_checkable
class RollbackSink(Protocol):
    """What ``exactly_once`` needs from a sink. Both methods run on the driver.

    - ``positions()``: where the sink's output ends right now, as a non-empty list of
      ``Offset(stream, partition, offset)`` (stream: an identifier of ``[A-Za-z0-9._:-]`` not starting
      with ``_eo:``; each (stream, partition) once; offset >= -1).
    - ``rollback_to(positions)``: delete (or truncate, or mark invalid) what the attempt that took
      ``positions`` wrote after them. Must be idempotent and must tolerate a half-finished earlier
      write or rollback.
    """

    def positions(self) -> Sequence[Offset]: ...

    def rollback_to(self, positions: Sequence[Offset]) -> None: ...


@runtime_checkable
class FencedSink(RollbackSink, Protocol):
    """A ``RollbackSink`` that can shut out the writes of older runs (zombie drivers).

    - ``max_epoch()``: the highest epoch fenced so far (0 when none); durable.
    - ``fence(epoch)``: from now on, writes of any lower epoch are invisible (also those committed
      after this call by a driver that checked just before it), and this sink object writes as
      ``epoch``. Raises ``Fenced`` when a higher epoch already fenced. A lower epoch's write that
      a fence hides must raise, never return: Spark would record its batch as committed.
    - ``check_epoch()``: raise ``Fenced`` when a higher epoch than this object's fenced the sink.
    """

    def max_epoch(self) -> int: ...

    def fence(self, epoch: int) -> None: ...

    def check_epoch(self) -> None: ...


@runtime_checkable
class RestorableSink(FencedSink, Protocol):
    """A ``FencedSink`` that a snapshot can record and a restore can put back (``app_snapshots``).

    - ``batch_end_positions(batch_id)``: the positions right after the (visible) output of
      ``batch_id`` written by the run that wrote the sink's newest output (never a batch of the same
      id that a reset checkpoint's earlier run wrote). Raises ``LookupError`` when that run has no
      visible output of that batch.
    - ``last_batch_id()``: the batch id of the newest visible output (None when empty): how far a
      downstream reader may have read.
    - ``restore_to(positions)``: make the content exactly what it was at ``positions``: remove every
      write at or after them, of any run up to the caller's epoch, and never anything before them.
      The caller holds the newest epoch (``fence``); it never touches a newer epoch's writes and
      raises ``Fenced`` when a newer epoch fenced before or while it cut. When the sink no longer
      holds what ``positions`` recorded below them (the output they name was cut by another
      restore since), it must raise before removing anything instead of cutting.
    """

    def batch_end_positions(self, batch_id: int) -> Sequence[Offset]: ...

    def last_batch_id(self) -> int | None: ...

    def restore_to(self, positions: Sequence[Offset]) -> None: ...


@runtime_checkable
class RestoreCheckedSink(RestorableSink, Protocol):
    """A ``RestorableSink`` that can tell, before any fence or cut, whether ``restore_to(positions)``
    would refuse: ``check_restore(positions)`` raises then (``RestoreRefused`` or ``ValueError``) and
    changes nothing. ``restore_snapshot`` runs it for every sink of the restore before it cuts the
    first one, so a refusal leaves every sink as it was."""

    def check_restore(self, positions: Sequence[Offset]) -> None: ...


class PartitionedFileSink:
    """An append-only, Hive-partitioned file table with an atomic commit per batch (see the module
    docstring).

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
        if not _NAME_RE.fullmatch(stream) or stream in (".", "..") or stream.startswith("_eo:"):
            raise ValueError(f"sink name {stream!r} must be 1-100 characters of [A-Za-z0-9._:-]")
        self.name = stream
        self.write_options = dict(write_options or {})
        #: The epoch this object writes as (0 until ``fence``: a sink used without the wrapper).
        self.epoch = 0
        self._next_seq: int | None = None  # cached after the first scan in this process

    def __repr__(self) -> str:
        return f"PartitionedFileSink({str(self.path)!r}, partition_by={self.partition_by!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as configuration (Spark Connect ships the sink with the foreachBatch function):
        the copy starts at epoch 0 and rescans, like a new object on the same path.

        Both fields are this process's view. A copy that trusted a stale cached sequence would register
        too low a position, and a later rollback to it would delete committed output. A copy that kept
        the sender's epoch would act as that run without having claimed it: its ``rollback_to`` deletes
        every file of that epoch no commit lists yet, which includes the real holder's in-flight write,
        and its writes would pass the fence. At epoch 0 a copy on a fenced table can neither write nor
        roll back (``Fenced``) until its writer claims and fences a new epoch.
        """
        return {**self.__dict__, "_next_seq": None, "epoch": 0}

    # -- the protocol ------------------------------------------------------------------------------
    def positions(self) -> list[Offset]:
        require_driver("PartitionedFileSink.positions")
        return [Offset(self.name, 0, self._sequence()), Offset(self.name, 1, self.epoch)]

    def rollback_to(self, positions: Sequence[Offset]) -> None:
        require_driver("PartitionedFileSink.rollback_to")
        mine = {p.partition: p.offset for p in positions if p.stream == self.name}
        if 0 not in mine:
            raise ValueError(f"positions {list(positions)!r} do not name this sink ({self.name!r}, 0)")
        keep_below = max(mine[0], 0)
        attempt_epoch = mine.get(1, self.epoch)
        if attempt_epoch > self.epoch:
            raise Fenced(f"{self!r}: cannot roll back epoch {attempt_epoch}'s write as epoch {self.epoch}")
        self.check_epoch()
        fences = self._fences()
        commits = self._commits()
        shown = {c.file_name for c in visible(commits, fences)}
        # 1. The attempt's own commits (one unlink hides a whole batch), and commits of older epochs
        #    that are invisible anyway (a zombie's fenced leftovers). Never a newer epoch's.
        for c in commits:
            own_attempt = c.seq >= keep_below and c.epoch == attempt_epoch
            dead = c.file_name not in shown and c.epoch < self.epoch
            if own_attempt or dead:
                self._remove(self.path / COMMITS_DIR / c.file_name)
        # 2. Files that no visible commit lists, of this or an older epoch (an in-flight write of a
        #    newer epoch is not ours to touch), and staging directories of those epochs.
        remaining = self._commits()
        listed = {f for c in visible(remaining, fences) for f in c.files}
        for file, _, epoch in self._data_files():
            if epoch <= self.epoch and file.relative_to(self.path).as_posix() not in listed:
                self._remove(file)
        for staging, epoch in self._staging_dirs():
            if epoch <= self.epoch:
                shutil.rmtree(staging, ignore_errors=True)
        self._next_seq = None  # rescan: the next write takes a number above everything left

    # -- snapshots and restores ------------------------------------------------------------------------
    def batch_end_positions(self, batch_id: int) -> list[Offset]:
        """``[Offset(name, 0, S + 1), Offset(name, 2, F)]`` where ``S`` is the sequence of the newest
        visible commit of ``batch_id`` *in the current run of batch ids*: every write below ``S + 1``
        is the output of that batch or of earlier ones; ``F`` is the fingerprint of the visible
        commits below ``S + 1`` (``commit_log.commits_fingerprint``), which ``restore_to`` checks.

        The current run is the visible commits after the last place where batch ids go down (a
        checkpoint reset starts again at a lower id; one checkpoint's batches only go up, a
        rolled-back attempt is no longer visible). A batch id that only an earlier run wrote is
        another checkpoint's batch: taking its position would cut the current run's output, so that
        raises ``LookupError`` like a batch without any visible commit."""
        shown = self.commits()
        commits = [(c.seq, c.batch_id) for c in shown if c.batch_id is not None]
        start = 0
        for i in range(1, len(commits)):
            if commits[i][1] < commits[i - 1][1]:
                start = i
        ours = [seq for seq, b in commits[start:] if b == batch_id]
        if not ours:
            earlier = any(b == batch_id for _, b in commits[:start])
            why = (
                f"no visible commit of batch {batch_id} in its current run of batch ids (from sequence "
                f"{commits[start][0]}); an earlier run (a reset checkpoint) wrote one, which is not this "
                "checkpoint's"
                if earlier
                else f"no visible commit of batch {batch_id}"
            )
            raise LookupError(
                f"{self!r} has {why}: write every batch with sink.write (exactly_once's default) so "
                "that a snapshot can find where the batch's output ends"
            )
        cut = ours[-1] + 1
        return [
            Offset(self.name, 0, cut),
            Offset(self.name, FINGERPRINT_PARTITION, commits_fingerprint(shown, cut)),
        ]

    def last_batch_id(self) -> int | None:
        commits = self.commits()
        return commits[-1].batch_id if commits else None

    def check_restore(self, positions: Sequence[Offset]) -> None:
        """Raise, changing nothing, when ``restore_to(positions)`` would refuse for the sink's content:
        ``ValueError`` when the positions do not name this sink, ``RestoreRefused`` when its visible
        commits below the cut differ from those the positions' fingerprint recorded. Positions
        without a fingerprint (snapshots taken before it existed) pass. ``restore_to`` checks again
        after its fence (no older run can change the visible commits any more)."""
        require_driver("PartitionedFileSink.check_restore")
        keep_below, recorded = self._restore_point(positions)
        self._check_kept(self.commits(), keep_below, recorded)

    def _restore_point(self, positions: Sequence[Offset]) -> tuple[int, int | None]:
        mine = {p.partition: p.offset for p in positions if p.stream == self.name}
        if 0 not in mine:
            raise ValueError(f"positions {list(positions)!r} do not name this sink ({self.name!r}, 0)")
        return max(mine[0], 0), mine.get(FINGERPRINT_PARTITION)

    def _check_kept(self, shown: Iterable[Commit], keep_below: int, recorded: int | None) -> None:
        """Refuse a cut at ``keep_below`` when the visible commits below it are not the recorded ones.

        What legitimately changes the visible commits after a snapshot does not reach below its cut:
        a rollback removes commits at or above its attempt's positions, which lie above every batch
        Spark committed; a fence (a later run's, a restore's, also this restore's own) hides only
        lower epochs' commits at or above the newest visible one; a zombie's late commit is hidden.
        So a restore of the same snapshot again, after the query ran on, or after a zombie wrote, passes.
        A restore of an older snapshot in between removed commits below this cut (and the runs after it
        wrote other commits): this snapshot's checkpoint would resume after batches the sink lost."""
        if recorded is None:
            return
        below = [c for c in shown if c.seq < keep_below]
        if commits_fingerprint(below, keep_below) == recorded:
            return
        if below:
            now = (
                f"{len(below)} visible commit(s) below it, sequences {below[0].seq}..{below[-1].seq}, "
                f"the newest of batch {below[-1].batch_id} (epoch {below[-1].epoch})"
            )
        else:
            now = "no visible commit below it"
        raise RestoreRefused(
            f"{self!r}: refusing to restore to sequence {keep_below}: the sink no longer holds the output "
            f"the snapshot recorded below it (fingerprint {recorded}, now "
            f"{commits_fingerprint(below, keep_below)}; the sink has {now}). Another restore cut the "
            "sink back further since this snapshot was taken (a restore of an older snapshot), or "
            "something else removed or rewrote committed batches; the snapshot's checkpoint would "
            "resume after batches the sink no longer has, and they would be lost. Nothing was cut. "
            "Restore the snapshot that cut the sink, or one taken after it (take_snapshot of the query "
            "running on the restored checkpoint)."
        )

    def restore_to(self, positions: Sequence[Offset]) -> None:
        """Remove every commit at or above the snapshot's sequence (whichever run wrote it, up to
        this object's epoch) and every file of those epochs that no remaining visible commit lists;
        commits below it stay, visible ones intact.

        It refuses (``RestoreRefused``), before removing anything, when the positions carry a
        fingerprint and the visible commits below the cut are not those it recorded
        (``check_restore``).

        Only the holder of the newest epoch may do this (``fence`` first): a run still writing
        would otherwise commit again behind the cut. A run that fences a newer epoch while the cut
        is under way is never touched (its files, commits and staging directories are of a higher
        epoch), and the cut then raises ``Fenced`` at its end: that run may have counted on output
        the cut removed, so the restore must not be taken as done.
        """
        require_driver("PartitionedFileSink.restore_to")
        keep_below, recorded = self._restore_point(positions)
        if self.epoch <= 0:
            raise Fenced(f"{self!r}: fence the sink with a new epoch before restoring it")
        self.check_epoch()
        commits = self._commits()
        self._check_kept(visible(commits, self._fences()), keep_below, recorded)
        for c in commits:
            if c.seq >= keep_below and c.epoch <= self.epoch:
                self._remove(self.path / COMMITS_DIR / c.file_name)
        listed = {f for c in visible(self._commits(), self._fences()) for f in c.files}
        for file, _, epoch in self._data_files():
            if epoch <= self.epoch and file.relative_to(self.path).as_posix() not in listed:
                self._remove(file)
        for staging, epoch in self._staging_dirs():
            if epoch <= self.epoch:
                shutil.rmtree(staging, ignore_errors=True)
        self._next_seq = None
        self.check_epoch()  # a newer run that fenced during the cut: the restore is not done

    # -- fencing -------------------------------------------------------------------------------------
    def max_epoch(self) -> int:
        """The highest epoch fenced or announced (a fence's first step) so far."""
        names = [p.name for p in _list_dir(self.path / FENCES_DIR)]
        epochs = [parse_fence_name(n) for n in names] + [parse_fence_intent_name(n) for n in names]
        return max((e for e in epochs if e is not None), default=0)

    def fence(self, epoch: int) -> None:
        require_driver("PartitionedFileSink.fence")
        if epoch <= 0:
            raise ValueError(f"epoch must be positive, got {epoch}")
        highest = self.max_epoch()
        if highest > epoch:
            raise Fenced(f"{self!r} is fenced by epoch {highest}; this run holds {epoch}")
        if not (self.path / FENCES_DIR / fence_file_name(epoch)).exists():
            # 1. Announce: every lower epoch's check fails from here on, also the check a writer makes
            #    right after linking its commit file.
            with contextlib.suppress(FileExistsError):  # announced before, by a fence that failed
                _create_exclusive(self.path / FENCES_DIR, fence_intent_name(epoch), "")
            highest = self.max_epoch()
            if highest > epoch:
                raise Fenced(f"{self!r} is fenced by epoch {highest}; this run holds {epoch}")
            # 2. Everything committed so far stays visible; a lower epoch's commit at or above from_seq,
            #    now or later, is hidden. A commit linked after the announcement is not seen here, and
            #    its writer fails its check after the link (never reports it written). A zombie cannot
            #    commit below from_seq: its next sequence is above its own last commit, and every
            #    visible commit is below from_seq.
            from_seq = max((c.seq for c in visible(self._commits(), self._fences())), default=-1) + 1
            payload = json.dumps({"epoch": epoch, "from_seq": from_seq})
            _create_exclusive(self.path / FENCES_DIR, fence_file_name(epoch), payload)
        self.epoch = epoch
        self._next_seq = None

    def check_epoch(self) -> None:
        highest = self.max_epoch()
        if highest > self.epoch:
            raise Fenced(f"{self!r} is fenced by epoch {highest}; this writer holds {self.epoch}")

    # -- writing -----------------------------------------------------------------------------------
    def write(self, df: Any, batch_id: int | None = None) -> int:
        """Append ``df`` (a DataFrame) as one atomically committed batch; returns its write sequence.

        ``batch_id`` is recorded in the commit file (informational: a retried batch writes new files,
        which is why this sink alone is at-least-once and needs ``exactly_once``).
        """
        require_driver("PartitionedFileSink.write")
        self.check_epoch()
        seq = self._sequence()
        self._next_seq = seq + 1  # consumed before any file appears: a failed write is never reused
        attempt = uuid.uuid4().hex[:12]
        staging = self.path / STAGING_DIR / f"{seq:012d}-e{self.epoch:012d}-{attempt}"
        # "error", not its alias "errorifexists", which Spark Connect's DataFrameWriter rejects.
        writer = df.write.format(self.file_format).mode("error").options(**self.write_options)
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(str(staging))
        files: list[str] = []
        for n, src in enumerate(sorted(_staged_part_files(staging))):
            dst_dir = self.path / src.parent.relative_to(staging)
            dst_dir.mkdir(parents=True, exist_ok=True)
            ext = "".join(src.suffixes[-2:]) if src.name.endswith(".gz") else src.suffix
            dst = dst_dir / f"part-{seq:012d}-e{self.epoch:012d}-{attempt}-{n:05d}{ext}"
            self._publish_file(src, dst)
            files.append(dst.relative_to(self.path).as_posix())
        # Spark wrote the part files without fsync, and the renames are directory entries: both go
        # to disk before the commit (which is fsynced), so that after a power loss a commit never
        # lists a file that was lost.
        _sync_published(self.path, files)
        self._commit(Commit(seq, self.epoch, batch_id, tuple(files)))
        shutil.rmtree(staging, ignore_errors=True)
        return seq

    def _publish_file(self, src: Path, dst: Path) -> None:
        """Move one part file to its final name (invisible until the commit). Subclasses may hook here."""
        os.replace(src, dst)

    def _commit(self, commit: Commit) -> None:
        """The visibility point of a batch. The fence check makes a zombie fail here in the common
        case. One that passes it just before a newer run announces its fence links its commit file
        and fails the check after it (``Fenced``): its commit is hidden by that fence, or visible
        and rolled back by the batch's re-run; either way Spark never records the batch committed."""
        self.check_epoch()
        payload = json.dumps(
            {
                "seq": commit.seq,
                "epoch": commit.epoch,
                "batch_id": commit.batch_id,
                "files": list(commit.files),
            }
        )
        _create_exclusive(self.path / COMMITS_DIR, commit.file_name, payload)
        highest = self.max_epoch()
        if highest > self.epoch:
            state = "visible" if is_visible(commit, self._fences()) else "hidden by its fence"
            raise Fenced(
                f"{self!r}: epoch {highest} fenced the sink while epoch {self.epoch} committed sequence "
                f"{commit.seq} (batch {commit.batch_id}, {state}): not reported as written; its "
                "re-run rolls it back"
            )

    def _remove(self, path: Path) -> None:
        """Delete one file of a rollback. Subclasses may hook here."""
        path.unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------------------------------
    def commits(self) -> list[Commit]:
        """The visible commits (one per batch), in write order."""
        return visible(self._commits(), self._fences())

    def committed_files(self) -> list[Path]:
        """The data files of every visible commit, in write order: the table's content."""
        return [self.path / f for c in self.commits() for f in c.files]

    def files(self) -> list[Path]:
        """Alias of ``committed_files``."""
        return self.committed_files()

    def read(self, spark: Any, schema: Any = None) -> Any:
        """A DataFrame of the committed files only (with the partition columns). Never point
        ``spark.read`` at the table directory itself: it would also read uncommitted files."""
        files = [str(f) for f in self.committed_files()]
        if not files:
            from pyspark.sql.types import StructType

            return spark.createDataFrame([], schema if schema is not None else StructType([]))
        reader = spark.read.format(self.file_format).option("basePath", str(self.path))
        if schema is not None:
            reader = reader.schema(schema)
        return reader.options(**self.write_options).load(files)

    def read_json_records(self) -> Iterator[dict[str, Any]]:
        """Every committed record of a JSON-lines table with its partition columns, without Spark (for
        tests, tools and small tables; use ``read(spark)`` otherwise)."""
        if self.file_format != "json":
            raise ValueError("read_json_records needs file_format='json'")
        for file in self.committed_files():
            parts = dict(seg.split("=", 1) for seg in file.parent.relative_to(self.path).parts if "=" in seg)
            with file.open(encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield {**json.loads(line), **parts}

    # -- internals ---------------------------------------------------------------------------------
    def _sequence(self) -> int:
        if self._next_seq is None:
            seqs = [c.seq for c in self._commits()]
            seqs += [seq for _, seq, _ in self._data_files()]
            seqs += [f.from_seq - 1 for f in self._fences()]
            seqs += [int(d.name[:12]) for d, _ in self._staging_dirs()]
            self._next_seq = max(seqs, default=-1) + 1
        return self._next_seq

    def _commits(self) -> list[Commit]:
        out = []
        for entry in _list_dir(self.path / COMMITS_DIR):
            if parse_commit_name(entry.name) is None:
                continue
            with contextlib.suppress(FileNotFoundError):  # removed by a concurrent rollback
                doc = json.loads(entry.read_text(encoding="utf-8"))
                out.append(
                    Commit(int(doc["seq"]), int(doc["epoch"]), doc.get("batch_id"), tuple(doc["files"]))
                )
        return out

    def _fences(self) -> list[Fence]:
        out = []
        for entry in _list_dir(self.path / FENCES_DIR):
            if parse_fence_name(entry.name) is not None:
                doc = json.loads(entry.read_text(encoding="utf-8"))
                out.append(Fence(int(doc["epoch"]), int(doc["from_seq"])))
        return out

    def _data_files(self) -> Iterator[tuple[Path, int, int]]:
        if not self.path.exists():
            return
        for dirpath, dirnames, filenames in os.walk(self.path):
            dirnames[:] = [d for d in dirnames if not d.startswith(("_", "."))]
            for fname in filenames:
                m = _FILE_RE.match(fname)
                if m:
                    yield Path(dirpath) / fname, int(m.group("seq")), int(m.group("epoch"))

    def _staging_dirs(self) -> list[tuple[Path, int]]:
        out = []
        for entry in _list_dir(self.path / STAGING_DIR):
            m = _STAGING_RE.match(entry.name)
            if m:
                out.append((entry, int(m.group("epoch"))))
        return out


def _list_dir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except FileNotFoundError:
        return []


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_published(root: Path, files: Sequence[str]) -> None:
    """fsync each published file, then each directory between it and ``root`` (the renames'
    entries, and those of partition directories made for them). A file's failure raises: the batch
    is not committed. A directory's is ignored where the filesystem cannot fsync one."""
    directories: set[Path] = set()
    for name in files:
        path = root / name
        _fsync_path(path)
        parent = path.parent
        while parent != root and parent not in directories:
            directories.add(parent)
            parent = parent.parent
    for directory in [*sorted(directories, key=lambda d: len(d.parts), reverse=True), root]:
        with contextlib.suppress(OSError):
            _fsync_path(directory)


def _create_exclusive(directory: Path, name: str, text: str) -> None:
    """Write ``directory/name`` whole or not at all, failing if it exists: a temp file, fsync, then a
    hard link (atomic, and refuses to replace), so no reader ever sees a partial file."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{uuid.uuid4().hex}"
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, directory / name)
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        _fsync_path(directory)


def _staged_part_files(staging: Path) -> Iterator[Path]:
    for dirpath, _, filenames in os.walk(staging):
        for fname in filenames:
            if fname.startswith("part-"):
                yield Path(dirpath) / fname
