"""``PartitionedFileSink``: a file table that implements the sink protocols (``protocols``).

``PartitionedFileSink`` is an append-only table of JSON-lines (or Parquet/CSV/ORC) files at any location
``storage.open_location`` reaches (a local path, ``hdfs://``, ``s3a://``, ``abfss://``, ``gs://``, ...),
partitioned Hive-style and written in parallel by Spark's executors. Its commit log is Spark's own file
sink log, ``_spark_metadata`` (``commit_log``): every Spark reader of the table (``spark.read.json(table)``,
``spark.readStream`` on it) reads exactly the files of the batches in the log, and nothing a crashed,
rolled-back or fenced write left behind. The driver uses only what every object store offers: listing,
whole-object writes, create-if-absent and delete; no rename, no copy of data.

Every ``write`` takes the next log number ``S`` (the *write sequence*) and runs under the sink's epoch
``E``:

1. Spark's executors write the batch's part files straight into the table, in a directory of their own
   per partition: ``<col>=<value>/.../_w-s<S>-e<E>-a<attempt>-p<k>/part-*`` (one Spark write per
   partition value of the batch; ``_w-s<S>-e<E>-a<attempt>/`` for an unpartitioned table). The write
   directory sits *below* the partition directories so that readers still infer the partition columns
   from the path (Spark refuses a table whose partition directories hang below different directories);
2. the driver lists those directories and checks that no newer epoch announced a fence;
3. it creates log entry ``S`` (create-if-absent) listing the files: the batch's visibility point.
   Then it checks again: when a newer epoch announced its fence meanwhile, ``write`` raises ``Fenced``
   (the batch may be visible), so Spark never records the batch as committed and its re-run rolls it
   back.

Entries are never deleted. A rollback or a restore *voids* an entry: it is replaced by an empty batch
(and every compact file above it is rewritten without its files). Deleting would leave a gap, which
stops every Spark reader, and would free the number for a zombie's late create.

Fencing with an append-only, numbered log that plain readers read without knowing of fences:
``fence(E)`` (a) announces ``E`` (``_fences/e<E>.intent``: from then on every lower epoch's check
fails), then (b) lists the log and creates the first free number ``F`` itself, create-if-absent, as an
empty ``fence`` entry, then (c) writes ``_fences/e<E>.json``. A writer of a lower epoch creates its
entry only after a check that passed, so before (a); it took its number from a listing made before that
too, so its number is at most ``F``. Below ``F`` every number is taken and its create fails. At ``F``
either the fence created it first, and the writer's create fails, or the writer did, after the listing
in (b), so after (a): its check after the create fails, its batch is never reported written, and the
fence replaces that entry with its own. So no entry of an older run that was created after a newer run
announced itself stays in the log, and none that a ``write`` reported written is ever replaced by a
fence. A zombie's rollback that passed its check before (a) can still void its own unreported entries
below ``F``; voiding replaces, so the log keeps no gap.

All of the above holds where the store's create-if-absent is atomic. Where it is a check and then a
write (``Storage.atomic_exclusive`` False), the coordinator is the commit point (``claims``): the fence
first raises the table's fence there and takes the number it claimed for it as ``F`` (above every
number the coordinator granted an older run), and a write creates its entry only after the
coordinator granted it its number, so of two writers of one number only one writes, and a writer
of a fenced epoch writes nothing. A write granted its number just before a newer fence, whose create
lands after that run's rollback listed the log, finds the fence after its create and voids its own
entry: no one else writes that number. No coordinator, or one without ``CommitClaimService``, is
``CoordinatorRequired``; the store-only protocol is never used in its place.

``positions()`` is ``[Offset(name, 0, next_seq), Offset(name, 1, epoch)]``; ``rollback_to`` voids the
data entries at or after ``next_seq`` written by the epoch named in the positions (the attempt that
took them) or an older one (a zombie's, created after that epoch's fence, so never reported written),
then deletes every write directory of this or an older epoch that no entry lists. It is idempotent.

A snapshot records ``batch_end_positions``: ``[Offset(name, 0, cut), Offset(name, 2, fingerprint)]``,
the fingerprint a digest of the data entries below ``cut`` (``commit_log.commits_fingerprint``).
``restore_to`` (and ``check_restore``, which a restore runs for every sink before it cuts any) refuses
with ``RestoreRefused`` when the data entries below the cut are no longer those: another restore cut
the sink below it since (a restore of an older snapshot), so the snapshot's checkpoint would resume
after output the sink no longer holds. Nothing a legitimate run does changes them: a rollback voids
only entries at or above its attempt's positions (above every batch Spark committed), and a fence only
adds an entry above the newest.

A table written by an earlier release of this sink (a ``_commits/`` directory) is refused
(``LegacyTable``) rather than read: its batches are not in ``_spark_metadata``, and writing on would
hide them from every reader.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

from snapcoord.client import CoordinatorClient, Offset
from snapcoord.spark_connector.driver import require_driver
from snapcoord.spark_connector.sink.claims import CommitPoint, CoordinatorRequired, table_id_of
from snapcoord.spark_connector.sink.commit_log import (
    DATA,
    DEFAULT_COMPACT_INTERVAL,
    FENCE,
    FENCES_DIR,
    LEGACY_COMMITS_DIR,
    METADATA_DIR,
    VOID,
    Commit,
    FileLine,
    commits_fingerprint,
    fence_file_name,
    fence_intent_name,
    parse_entry,
    parse_fence_intent_name,
    parse_fence_name,
    render_entry,
)
from snapcoord.spark_connector.sink.epochs import Fenced
from snapcoord.spark_connector.sink.protocols import RestoreRefused
from snapcoord.spark_connector.sink.spark_sink_log import (
    COMPACT_SUFFIX,
    batch_id_of,
    derive_compact_interval,
    entry_name,
    is_compaction_batch,
)
from snapcoord.spark_connector.storage import Entry, LocalStorage, Storage, join, open_location

_WRITE_DIR_RE = re.compile(r"^_w-s(?P<seq>\d+)-e(?P<epoch>\d+)-a(?P<attempt>[0-9a-f]+)(-p\d+)?$")
_PART_JOB_RE = re.compile(r"^part-\d+-(?P<job>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_NAME_RE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
#: Spark's name for a null or empty partition value, and the characters it escapes in partition
#: directory names (``ExternalCatalogUtils.escapePathName``).
DEFAULT_PARTITION_NAME = "__HIVE_DEFAULT_PARTITION__"
_ESCAPED = frozenset([*map(chr, range(1, 32)), '"', "#", "%", "'", "*", "/", ":", "=", "?", "\\", "\x7f"]) | {
    "{",
    "[",
    "]",
    "^",
}
#: What ``java.net.URI`` leaves unescaped in a path.
_URI_PATH_SAFE = "/,;:$&+=@-_.!~*'()"
#: The partition of ``batch_end_positions`` that holds the fingerprint of the data entries below the
#: cut (``commit_log.commits_fingerprint``); positions without it (older snapshots) are not checked.
FINGERPRINT_PARTITION = 2


class LegacyTable(RuntimeError):
    """The table holds a commit log of an earlier release of ``PartitionedFileSink`` (``_commits/``),
    which Spark readers and this release do not read. Nothing was read or written."""


class PartitionedFileSink:
    """An append-only, Hive-partitioned file table with Spark's file sink log as its commit log (see
    the module docstring).

    ``location`` is the table: a URI Spark can write (``s3a://bucket/t``, ``hdfs://nn/t``, ``file:/t``)
    or a path, opened with ``storage.open_location`` (Spark's own Hadoop FileSystem next to a classic
    driver, fsspec with ``storage_options`` where no JVM is reachable). A location the connector
    cannot reach raises ``UnsupportedLocation`` here; nothing is created. ``partition_by`` names the
    columns that become directories. ``name`` is the stream name used in positions (default: the
    table directory's name, sanitised). ``compact_interval`` must match the readers'
    ``spark.sql.streaming.fileSink.log.compactInterval`` (Spark's default, 10).
    """

    def __init__(
        self,
        location: str | os.PathLike[str],
        *,
        partition_by: Sequence[str] = (),
        file_format: str = "json",
        name: str | None = None,
        write_options: dict[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
        compact_interval: int = DEFAULT_COMPACT_INTERVAL,
        coordinator: CoordinatorClient | str | None = None,
        table_id: str | None = None,
    ) -> None:
        #: A ``Path`` (any ``os.PathLike``) names a local or mounted directory of this machine: it is
        #: opened as one, without Spark's qualification of plain paths against ``fs.defaultFS``.
        self.local = isinstance(location, os.PathLike)
        if isinstance(location, os.PathLike):
            location = str(Path(location).absolute())
        if not isinstance(location, str) or not location:
            raise ValueError(f"a table location must be a non-empty string or path, not {location!r}")
        if compact_interval < 1:
            raise ValueError(f"compact_interval must be positive, got {compact_interval}")
        self.location = location
        self.partition_by = tuple(partition_by)
        self.file_format = file_format
        self.compact_interval = compact_interval
        self.storage_options = dict(storage_options or {})
        base = unquote(urlparse(location).path if "://" in location else location).rstrip("/")
        stream = name if name is not None else re.sub(r"[^A-Za-z0-9._:-]", "_", base.rpartition("/")[2])
        stream = stream or "table"
        if not _NAME_RE.fullmatch(stream) or stream in (".", "..") or stream.startswith("_eo:"):
            raise ValueError(f"sink name {stream!r} must be 1-100 characters of [A-Za-z0-9._:-]")
        self.name = stream
        self.write_options = dict(write_options or {})
        #: The epoch this object writes as (0 until ``fence``: a sink used without the wrapper).
        self.epoch = 0
        self._next_seq: int | None = None  # cached after the first scan in this process
        self._storage: Storage | None = None
        self._format_checked = False
        #: The coordinator that is the commit point where the store's create is not atomic: a client,
        #: or a target string (a client is made on first use), or None until ``use_coordinator``.
        self.coordinator = coordinator
        self._client: CoordinatorClient | None = (
            coordinator if isinstance(coordinator, CoordinatorClient) else None
        )
        self._table_id = table_id
        self.storage  # noqa: B018  (opens now: an unreachable location fails here, not mid-batch)

    @property
    def storage(self) -> Storage:
        """The table's ``Storage``, opened in this process on first use."""
        if self._storage is None:
            self._storage = (
                LocalStorage(self.location)
                if self.local
                else open_location(self.location, storage_options=self.storage_options or None)
            )
        return self._storage

    def __repr__(self) -> str:
        return f"PartitionedFileSink({self.location!r}, partition_by={self.partition_by!r})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as configuration (Spark Connect ships the sink with the foreachBatch function):
        the copy starts at epoch 0, rescans and opens the location again, like a new object on the
        same table (a ``Storage`` holds connections or a JVM handle of this process).

        The sequence and the epoch are this process's view. A copy that trusted a stale cached
        sequence would register too low a position, and a later rollback to it would void committed
        output. A copy that kept the sender's epoch would act as that run without having claimed it:
        its ``rollback_to`` would delete the real holder's in-flight write directories, and its
        writes would pass the fence. At epoch 0 a copy on a fenced table can neither write nor roll
        back (``Fenced``) until its writer claims and fences a new epoch. A coordinator given as an
        address travels; a live client (a channel of this process) does not: the copy's writer
        hands it its own (``use_coordinator``).
        """
        coordinator = None if isinstance(self.coordinator, CoordinatorClient) else self.coordinator
        return {
            **self.__dict__,
            "_next_seq": None,
            "epoch": 0,
            "_storage": None,
            "_format_checked": False,
            "coordinator": coordinator,
            "_client": None,
        }

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
        # The attempt's own batches, and those of older epochs at or above its positions (created
        # after the attempt's epoch fenced, so their writers failed): newest first. Never a newer
        # epoch's, never anything below the positions.
        voided = [
            c
            for c in reversed(self._commits())
            if c.seq >= keep_below and c.is_data and c.epoch <= attempt_epoch
        ]
        for c in voided:
            self._void(c)
        self._delete_unlisted_writes(voided)
        self._next_seq = None

    # -- snapshots and restores ------------------------------------------------------------------------
    def batch_end_positions(self, batch_id: int) -> list[Offset]:
        """``[Offset(name, 0, S + 1), Offset(name, 2, F)]`` where ``S`` is the sequence of the newest
        data entry of ``batch_id`` *in the current run of batch ids*: every write below ``S + 1`` is
        the output of that batch or of earlier ones; ``F`` is the fingerprint of the data entries below
        ``S + 1`` (``commit_log.commits_fingerprint``), which ``restore_to`` checks.

        The current run is the data entries after the last place where batch ids go down (a
        checkpoint reset starts again at a lower id; one checkpoint's batches only go up, a
        rolled-back attempt is void). A batch id that only an earlier run wrote is another
        checkpoint's batch: taking its position would cut the current run's output, so that raises
        ``LookupError`` like a batch without any data entry."""
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
                f"no batch {batch_id} in its current run of batch ids (from sequence "
                f"{commits[start][0]}); an earlier run (a reset checkpoint) wrote one, which is not this "
                "checkpoint's"
                if earlier
                else f"no batch {batch_id} in its log"
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
        ``ValueError`` when the positions do not name this sink, ``RestoreRefused`` when its data
        entries below the cut differ from those the positions' fingerprint recorded. Positions
        without a fingerprint (snapshots taken before it existed) pass. ``restore_to`` checks again
        after its fence (no older run can change the log any more)."""
        require_driver("PartitionedFileSink.check_restore")
        keep_below, recorded = self._restore_point(positions)
        self._check_kept(self.commits(), keep_below, recorded)

    def _restore_point(self, positions: Sequence[Offset]) -> tuple[int, int | None]:
        mine = {p.partition: p.offset for p in positions if p.stream == self.name}
        if 0 not in mine:
            raise ValueError(f"positions {list(positions)!r} do not name this sink ({self.name!r}, 0)")
        return max(mine[0], 0), mine.get(FINGERPRINT_PARTITION)

    def _check_kept(self, shown: Iterable[Commit], keep_below: int, recorded: int | None) -> None:
        """Refuse a cut at ``keep_below`` when the data entries below it are not the recorded ones.

        What legitimately changes the log after a snapshot does not reach below its cut: a rollback
        voids entries at or above its attempt's positions, which lie above every batch Spark
        committed; a fence (a later run's, a restore's, also this restore's own) adds an empty entry
        above the newest. So a restore of the same snapshot again, after the query ran on, or after a
        zombie wrote, passes. A restore of an older snapshot in between voided entries below this cut
        (and the runs after it wrote others): this snapshot's checkpoint would resume after batches
        the sink lost."""
        if recorded is None:
            return
        below = [c for c in shown if c.seq < keep_below]
        if commits_fingerprint(below, keep_below) == recorded:
            return
        if below:
            now = (
                f"{len(below)} batch(es) below it, sequences {below[0].seq}..{below[-1].seq}, "
                f"the newest of batch {below[-1].batch_id} (epoch {below[-1].epoch})"
            )
        else:
            now = "no batch below it"
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
        """Void every data entry at or above the snapshot's sequence (whichever run wrote it, up to
        this object's epoch) and delete every write directory of those epochs that no entry lists;
        entries below it stay intact.

        It refuses (``RestoreRefused``), before changing anything, when the positions carry a
        fingerprint and the data entries below the cut are not those it recorded (``check_restore``).

        Only the holder of the newest epoch may do this (``fence`` first): a run still writing
        would otherwise commit again behind the cut. A run that fences a newer epoch while the cut
        is under way is never touched (its entries and write directories are of a higher epoch),
        and the cut then raises ``Fenced`` at its end: that run may have counted on output the cut
        removed, so the restore must not be taken as done.
        """
        require_driver("PartitionedFileSink.restore_to")
        keep_below, recorded = self._restore_point(positions)
        if self.epoch <= 0:
            raise Fenced(f"{self!r}: fence the sink with a new epoch before restoring it")
        self.check_epoch()
        commits = self._commits()
        self._check_kept([c for c in commits if c.is_data], keep_below, recorded)
        voided = [c for c in reversed(commits) if c.seq >= keep_below and c.is_data and c.epoch <= self.epoch]
        for c in voided:
            self._void(c)
        self._delete_unlisted_writes(voided)
        self._next_seq = None
        self.check_epoch()  # a newer run that fenced during the cut: the restore is not done

    # -- the commit point ----------------------------------------------------------------------------
    @property
    def table_id(self) -> str:
        """The table's name in the coordinator's commit claims: given, or derived from the table's
        URI (``claims.table_id_of``), so every driver of every run of the table names it alike."""
        if self._table_id is None:
            self._table_id = table_id_of(self.storage.uri(""))
        return self._table_id

    def use_coordinator(self, client: CoordinatorClient) -> None:
        """Take ``client`` as the commit point (``exactly_once`` passes its own before it fences)."""
        self.coordinator = client
        self._client = client

    def needs_coordinator(self) -> bool:
        """Whether fences and commits take their exclusivity from the coordinator: where the store's
        create-if-absent is a check and then a write (``Storage.atomic_exclusive`` False)."""
        return not self.storage.atomic_exclusive

    def _commit_point(self) -> CommitPoint | None:
        """The coordinator's claims of this table where the store needs them, else None (the
        store-only protocol, no RPC). Never falls back to the store-only protocol where the store
        needs them: no coordinator is ``CoordinatorRequired``, an unreachable one fails the call."""
        if not self.needs_coordinator():
            return None
        if self._client is None:
            if self.coordinator is None:
                raise CoordinatorRequired(
                    f"{self!r}: the store's create-if-absent is not atomic "
                    f"({type(self.storage).__name__}), so the table's commit point is the coordinator's "
                    "CommitClaimService: pass coordinator= (its address or a CoordinatorClient), or "
                    "write through exactly_once. Nothing was written."
                )
            self._client = (
                self.coordinator
                if isinstance(self.coordinator, CoordinatorClient)
                else CoordinatorClient(self.coordinator)
            )
        return CommitPoint(self._client, self.table_id, repr(self))

    # -- fencing -------------------------------------------------------------------------------------
    def max_epoch(self) -> int:
        """The highest epoch fenced or announced (a fence's first step) so far."""
        names = [e.name for e in self.storage.list(FENCES_DIR)]
        epochs = [parse_fence_name(n) for n in names] + [parse_fence_intent_name(n) for n in names]
        return max((e for e in epochs if e is not None), default=0)

    def fence(self, epoch: int) -> None:
        require_driver("PartitionedFileSink.fence")
        if epoch <= 0:
            raise ValueError(f"epoch must be positive, got {epoch}")
        self._check_format()
        highest = self.max_epoch()
        if highest > epoch:
            raise Fenced(f"{self!r} is fenced by epoch {highest}; this run holds {epoch}")
        claims = self._commit_point()
        if not self.storage.exists(join(FENCES_DIR, fence_file_name(epoch))):
            # With the coordinator as the commit point, the fence is first raised there: from here on
            # no lower epoch is granted a number, and ``from_seq`` lies above every number granted.
            from_seq = claims.fence(epoch, self._latest() + 1) if claims is not None else -1
            # (a) Announce: every lower epoch's check fails from here on, also the check a writer
            #     makes right after creating its entry.
            with contextlib.suppress(FileExistsError):  # announced before, by a fence that failed
                self.storage.write_bytes(join(FENCES_DIR, fence_intent_name(epoch)), b"", exclusive=True)
            self.check_fence_of(epoch)
            # (b) Take the first free number as an empty batch (see the module docstring); the
            #     coordinator's claim of it where it is the commit point.
            if claims is None:
                from_seq = self._latest() + 1
            marker = Commit(from_seq, epoch, None, (), FENCE, "f")
            try:
                self._create_entry(marker, [])
            except FileExistsError:
                found = self._entry(from_seq)
                if [c for c, _ in found] != [marker]:
                    # Created after this fence's listing, so after its announcement: its writer's
                    # check after the create fails, and the batch is never reported written.
                    self.check_fence_of(epoch)
                    self._replace_entry(marker, [])
            self._fill_gaps(from_seq, epoch)
            # (c) The fence is complete.
            payload = f'{{"epoch": {epoch}, "from_seq": {from_seq}}}'.encode()
            with contextlib.suppress(FileExistsError):
                self.storage.write_bytes(join(FENCES_DIR, fence_file_name(epoch)), payload, exclusive=True)
        self.epoch = epoch
        self._next_seq = None

    def check_fence_of(self, epoch: int) -> None:
        highest = self.max_epoch()
        if highest > epoch:
            raise Fenced(f"{self!r} is fenced by epoch {highest}; this run holds {epoch}")

    def check_epoch(self) -> None:
        highest = self.max_epoch()
        if highest > self.epoch:
            raise Fenced(f"{self!r} is fenced by epoch {highest}; this writer holds {self.epoch}")

    def _fill_gaps(self, below: int, epoch: int) -> None:
        """Create an empty entry at every free number below ``below`` (readers stop at a gap): this
        sink never leaves one, but a log that something else cut or left incomplete may have one."""
        taken = self._entry_names()
        for seq in range(below):
            if seq not in taken:
                with contextlib.suppress(FileExistsError):
                    self._create_entry(Commit(seq, epoch, None, (), VOID, "gap"), [])

    # -- writing -----------------------------------------------------------------------------------
    def write(self, df: Any, batch_id: int | None = None) -> int:
        """Append ``df`` (a DataFrame) as one atomically committed batch; returns its write sequence.

        ``batch_id`` is recorded in the entry's marker (a retried batch writes new files, which is
        why this sink alone is at-least-once and needs ``exactly_once``).
        """
        require_driver("PartitionedFileSink.write")
        self.check_epoch()
        seq = self._sequence()
        self._commit_point()  # a table that needs a coordinator and has none fails before Spark writes
        self._next_seq = seq + 1  # consumed before any file appears: a failed write is never reused
        attempt = uuid.uuid4().hex[:12]
        write_dir = f"_w-s{seq}-e{self.epoch}-a{attempt}"
        files = self._write_files(df, write_dir)
        if isinstance(self.storage, LocalStorage):
            # Spark wrote the part files without fsync: they go to disk before the entry (which is
            # fsynced), so that after a power loss an entry never lists a file that was lost.
            _sync_published(self.storage.root, [f.path for f in files])
        self._commit(Commit(seq, self.epoch, batch_id, tuple(f.path for f in files), DATA, attempt), files)
        return seq

    def _write_files(self, df: Any, write_dir: str) -> list[FileLine]:
        """Spark's executors write the batch's part files; the files they wrote, in a stable order."""
        now_ms = int(time.time() * 1000)
        if not self.partition_by:
            return [FileLine(e.name, e.size, now_ms) for e in self._write_into_root(df)]
        from pyspark.sql import functions as F

        cols = self.partition_by
        leaves: list[str] = []
        df = df.persist()  # one Spark write per partition value reads the batch once
        try:
            keys = df.select(*[F.col(c).cast("string").alias(c) for c in cols]).distinct().collect()
            ordered = sorted(keys, key=lambda r: [(v is None, v or "") for v in r])
            for k, row in enumerate(ordered):
                values = [row[c] for c in cols]
                condition = None
                for c, v in zip(cols, values, strict=True):
                    term = F.col(c).cast("string").eqNullSafe(F.lit(v))
                    condition = term if condition is None else condition & term
                leaf = join(partition_path(cols, values), f"{write_dir}-p{k}")
                self._spark_write(df.where(condition).drop(*cols), leaf, mode="error")
                leaves.append(leaf)
                self._wrote_part(k)
        finally:
            df.unpersist()
        return [
            FileLine(join(leaf, e.name), e.size, now_ms)
            for leaf in leaves
            for e in self.storage.list(leaf)
            if _is_part_file(e)
        ]

    def _write_into_root(self, df: Any) -> list[Entry]:
        """An unpartitioned batch: Spark readers read only the files directly in the table, so Spark
        writes there, and the batch's files are those of the one Spark job that appeared meanwhile.

        Spark's committer stages in ``_temporary/<n>``; a number of this write's own, and no cleanup
        of the whole ``_temporary``, keep a concurrent writer's staged files (a zombie's) apart. A
        part file of another job that appears meanwhile (such a zombie's) makes the write fail: its
        files cannot be told from this batch's."""
        before = {e.name for e in self.storage.list("") if _is_part_file(e)}
        staging = secrets.randbelow(1 << 30) + 1
        options = {
            "mapreduce.job.application.attempt.id": str(staging),
            "mapreduce.fileoutputcommitter.cleanup.skipped": "true",
            "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        }
        try:
            self._spark_write(df, "", mode="append", extra=options)
            self._wrote_part(0)
        finally:
            self.storage.delete_tree(join("_temporary", str(staging)))
        new = [e for e in self.storage.list("") if _is_part_file(e) and e.name not in before]
        jobs = {_job_of(e.name) for e in new}
        if len(jobs) > 1:
            raise RuntimeError(
                f"{self!r}: part files of {len(jobs)} Spark jobs appeared in the table during this write "
                f"({sorted(e.name for e in new)[:4]}...): another writer (a zombie driver) writes it too; "
                "this batch is not committed, and its re-run rolls it back"
            )
        return sorted(new, key=lambda e: e.name)

    def _spark_write(self, df: Any, path: str, *, mode: str, extra: dict[str, str] | None = None) -> None:
        # "error", not its alias "errorifexists", which Spark Connect's DataFrameWriter rejects.
        options = {**self.write_options, **(extra or {})}
        df.write.format(self.file_format).mode(mode).options(**options).save(self.storage.uri(path))

    def _wrote_part(self, n: int) -> None:
        """Called after each Spark write of a batch (one per partition value). Subclasses may hook here."""

    def _commit(self, commit: Commit, files: Sequence[FileLine]) -> None:
        """The visibility point of a batch. The fence check makes a zombie fail here in the common
        case. One that passes it just before a newer run announces its fence creates its entry and
        fails the check after it (``Fenced``): the entry is replaced by that fence, or stays and is
        voided by the batch's re-run; either way Spark never records the batch committed.

        Where the coordinator is the commit point, the entry is written only after the coordinator
        granted this write its number (``claims.CommitPoint.claim``): a write refused there writes
        nothing. A write granted its number before a newer run fenced the table that finds the fence
        after its create voids its own entry before it raises ``Fenced``: the newer run's rollback
        may have read the log before the entry appeared, and no one else writes that number."""
        self.check_epoch()
        claims = self._commit_point()
        if claims is not None:
            claims.claim(commit.seq, self.epoch, commit.attempt, commit.batch_id)
        try:
            self._create_entry(commit, files)
        except FileExistsError:
            highest = self.max_epoch()
            if highest > self.epoch:
                raise Fenced(
                    f"{self!r}: epoch {highest} fenced the sink and took sequence {commit.seq} before "
                    f"epoch {self.epoch} committed batch {commit.batch_id} there: not written"
                ) from None
            raise RuntimeError(
                f"{self!r}: log entry {commit.seq} was created by another writer of epoch {self.epoch} "
                "(two sink objects writing one table as one run); batch not written"
            ) from None
        highest = self.max_epoch()
        if highest > self.epoch:
            if claims is not None:
                self._void(commit)
            raise Fenced(
                f"{self!r}: epoch {highest} fenced the sink while epoch {self.epoch} committed sequence "
                f"{commit.seq} (batch {commit.batch_id}): not reported as written; its re-run or the "
                "fence voids it"
            )

    # -- the log's entries -------------------------------------------------------------------------
    def _entry_names(self) -> dict[int, str]:
        """Sequence -> object name of every entry of the log, under the names Spark reads now."""
        self._check_format()
        found: dict[int, str] = {}
        for e in self.storage.list(METADATA_DIR):
            seq = batch_id_of(e.name)
            if seq is not None and not e.is_dir:
                found[seq] = e.name
        interval = self._interval(found)
        return {seq: name for seq, name in found.items() if name == entry_name(seq, interval)}

    def _interval(self, names: dict[int, str]) -> int:
        """The compaction interval Spark's readers derive for this log (``compact_interval`` while
        it holds fewer than two compactions)."""
        compactions = [seq for seq, name in names.items() if name.endswith(COMPACT_SUFFIX)]
        return derive_compact_interval(self.compact_interval, compactions)

    def _name_of(self, seq: int, names: dict[int, str] | None = None) -> str:
        """Entry ``seq``'s object name, from ``names`` (one listing of the log) or a new listing."""
        names = self._entry_names() if names is None else names
        return join(METADATA_DIR, entry_name(seq, self._interval(names)))

    def _latest(self) -> int:
        return max(self._entry_names(), default=-1)

    def _entry(self, seq: int, names: dict[int, str] | None = None) -> list[tuple[Commit, list[FileLine]]]:
        """The commits in entry ``seq`` (a compact file holds those of every entry before it)."""
        name = self._name_of(seq, names)
        return parse_entry(self.storage.read_bytes(name), self._relative, self.storage.uri(name))

    def _log(self, names: dict[int, str] | None = None) -> list[tuple[Commit, list[FileLine]]]:
        """Every entry of the log with its files, in order, read as a Spark reader reads it: the
        newest compact file, then the entries after it."""
        names = self._entry_names() if names is None else names
        if not names:
            return []
        latest = max(names)
        compacts = [s for s, n in names.items() if n.endswith(COMPACT_SUFFIX)]
        start = max(compacts, default=-1)
        out: list[tuple[Commit, list[FileLine]]] = []
        for seq in range(max(start, 0), latest + 1):
            if seq not in names:
                continue  # a gap (readers fail on it; fence fills it)
            found = self._entry(seq, names)
            if seq == start:
                out += found
            else:
                out += [(c, fs) for c, fs in found if c.seq in (seq, -1)]
        return out

    def _commits(self) -> list[Commit]:
        """Every entry of the log (data, fence and void), in order."""
        return [c for c, _ in self._log()]

    def _create_entry(self, commit: Commit, files: Sequence[FileLine]) -> None:
        names = self._entry_names()  # one listing names the entry and renders it
        data = self._render(commit, files, names)
        self.storage.write_bytes(self._name_of(commit.seq, names), data, exclusive=True)

    def _render(
        self, commit: Commit, files: Sequence[FileLine], names: dict[int, str] | None = None
    ) -> bytes:
        """Entry ``commit.seq``'s bytes: the commit alone, or for a compact file every entry before it
        too (as the log holds them now, ``names`` or a new listing) followed by it."""
        now_ms = int(time.time() * 1000)
        names = self._entry_names() if names is None else names
        if not is_compaction_batch(commit.seq, self._interval(names)):
            return render_entry([commit], [files], self._log_uri, now_ms)
        names = {s: n for s, n in names.items() if s < commit.seq}
        before = [(c, fs) for c, fs in self._log(names) if c.seq < commit.seq]
        return render_entry(
            [c for c, _ in before] + [commit],
            [fs for _, fs in before] + [list(files)],
            self._log_uri,
            now_ms,
        )

    def _replace_entry(self, commit: Commit, files: Sequence[FileLine]) -> None:
        """Overwrite entry ``commit.seq`` (never delete it), then every compact file above it, which
        holds the old entry's files too."""
        names = self._entry_names()
        self.storage.write_bytes(self._name_of(commit.seq, names), self._render(commit, files, names))
        for seq, name in sorted(names.items()):
            if seq > commit.seq and name.endswith(COMPACT_SUFFIX):
                own = [(c, fs) for c, fs in self._entry(seq, names) if c.seq == seq]
                if own:
                    self.storage.write_bytes(join(METADATA_DIR, name), self._render(*own[0], names))

    def _void(self, commit: Commit) -> None:
        """Replace a data entry by an empty one of this epoch. Subclasses may hook here."""
        self._replace_entry(Commit(commit.seq, self.epoch, commit.batch_id, (), VOID, commit.attempt), [])

    def _log_uri(self, path: str) -> str:
        """The URI a log entry gives for ``path``: the Hadoop path Spark writes to, percent-encoded as
        ``java.net.URI`` expects it (Spark's reader decodes it with ``new Path(new URI(...))``)."""
        return _encode_hadoop_path(self.storage.uri(path))

    def _relative(self, uri: str) -> str:
        root = urlparse(self._log_uri("")).path.rstrip("/") + "/"
        path = urlparse(uri).path  # file:/x and file:///x alike
        if path.startswith(root):
            return unquote(path[len(root) :])
        raise ValueError(f"{self!r}: the log lists {uri!r}, which is not below the table ({root!r})")

    def _check_format(self) -> None:
        if self._format_checked:
            return
        if self.storage.list(LEGACY_COMMITS_DIR):
            raise LegacyTable(
                f"{self!r} holds a commit log of an earlier release of PartitionedFileSink "
                f"({LEGACY_COMMITS_DIR}/), which neither Spark readers nor this release read: writing on "
                "would hide its batches. "
                "Nothing was read or written. Copy its committed rows into a new table with the earlier "
                "release (PartitionedFileSink(old).read(spark), written to a new location), or keep "
                "writing this table with that release."
            )
        self._format_checked = True

    # -- write directories -------------------------------------------------------------------------
    def _write_dirs(self) -> Iterator[tuple[str, int]]:
        """Every write directory in the table (relative path, epoch), below its partition directories."""
        level = [""]
        for _ in range(len(self.partition_by)):
            level = [
                join(p, e.name) for p in level for e in self.storage.list(p) if e.is_dir and "=" in e.name
            ]
        for parent in level:
            for e in self.storage.list(parent):
                m = _WRITE_DIR_RE.match(e.name)
                if e.is_dir and m:
                    yield join(parent, e.name), int(m.group("epoch"))

    def _delete_unlisted_writes(self, voided: Sequence[Commit]) -> None:
        """Delete the files of the ``voided`` entries, and the write directories of this or an older
        epoch that no entry lists (crashed, rolled-back or fenced writes); an in-flight write of a
        newer epoch is not ours to touch. Part files a crashed write left directly in an unpartitioned
        table carry no epoch, so they stay (no entry lists them: no reader reads them)."""
        for c in voided:
            for f in c.files:
                self.storage.delete(f)
        listed = {f.rpartition("/")[0] for c in self._commits() for f in c.files}
        for path, epoch in list(self._write_dirs()):
            if epoch <= self.epoch and path not in listed:
                self.storage.delete_tree(path)

    # -- reading -----------------------------------------------------------------------------------
    def commits(self) -> list[Commit]:
        """The batches in the log (data entries), in write order."""
        return [c for c in self._commits() if c.is_data]

    def committed_files(self) -> list[str]:
        """The data files of every batch in the log, in write order, relative to the table: its content."""
        return [f for c in self.commits() for f in c.files]

    def files(self) -> list[str]:
        """Alias of ``committed_files``."""
        return self.committed_files()

    def read(self, spark: Any, schema: Any = None) -> Any:
        """A DataFrame of the committed batches (with the partition columns): Spark's own reader of the
        table, which honours the log like any other reader."""
        if not self.committed_files():  # Spark cannot infer a schema from no files
            from pyspark.sql.types import StructType

            return spark.createDataFrame([], schema if schema is not None else StructType([]))
        reader = spark.read.format(self.file_format)
        if schema is not None:
            reader = reader.schema(schema)
        return reader.options(**self.write_options).load(self.storage.uri(""))

    def read_json_records(self) -> Iterator[dict[str, Any]]:
        """Every committed record of a JSON-lines table with its partition columns, without Spark (for
        tests, tools and small tables; use ``read(spark)`` otherwise)."""
        if self.file_format != "json":
            raise ValueError("read_json_records needs file_format='json'")
        import json

        for file in self.committed_files():
            parts = dict(_unescape_segment(seg) for seg in file.split("/")[:-1] if "=" in seg)
            for line in self.storage.read_bytes(file).decode("utf-8").splitlines():
                if line.strip():
                    yield {**json.loads(line), **parts}

    # -- internals ---------------------------------------------------------------------------------
    def _sequence(self) -> int:
        if self._next_seq is None:
            self._next_seq = self._latest() + 1
        return self._next_seq


def _is_part_file(entry: Entry) -> bool:
    return not entry.is_dir and entry.name.startswith("part-") and not entry.name.endswith(".crc")


def _job_of(name: str) -> str:
    """The Spark job that wrote part file ``name`` (``part-<task>-<job uuid>-c<n>.<ext>``)."""
    m = _PART_JOB_RE.match(name)
    return m.group("job") if m else name


def partition_path(columns: Sequence[str], values: Sequence[str | None]) -> str:
    """The partition directories Spark's writer makes for ``values`` (the columns cast to strings)."""
    return "/".join(
        f"{_escape(c)}={DEFAULT_PARTITION_NAME if v is None or v == '' else _escape(v)}"
        for c, v in zip(columns, values, strict=True)
    )


def _encode_hadoop_path(location: str) -> str:
    """A Hadoop path string (``scheme://authority/path``, unescaped) as a URI string."""
    scheme, sep, rest = location.partition(":")
    if not sep:
        return quote(location, safe=_URI_PATH_SAFE)
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        return f"{scheme}://{authority}{slash}{quote(path, safe=_URI_PATH_SAFE)}"
    return f"{scheme}:{quote(rest, safe=_URI_PATH_SAFE)}"


def _escape(text: str) -> str:
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in text)


def _unescape_segment(segment: str) -> tuple[str, str | None]:
    name, _, value = segment.partition("=")
    return unquote(name), None if value == DEFAULT_PARTITION_NAME else unquote(value)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_published(root: Path, files: Sequence[str]) -> None:
    """fsync each written file, then each directory between it and ``root``. A file's failure raises:
    the batch is not committed. A directory's is ignored where the filesystem cannot fsync one."""
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
