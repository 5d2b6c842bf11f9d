"""Write a snapshot's checkpoint archive into a new checkpoint location so that it becomes complete
at exactly one write, on any store (no rename, no directory operations).

A streaming query started on a checkpoint reads ``metadata`` (and writes a new one where there is
none), the offsets log's latest entry ``offsets/<N>``, ``offsets/<N-1>``, ``commits/<N>``, the
sources' logs and ``state/``. An offsets log with no entry means a *new* query to Spark, which
would read every source from its start: so a partial checkpoint must never look empty, and must
never look complete. The protocol, for one query restored at batch ``N``:

1. **claim** (``claim_target``): the location must be empty, or hold an unfinished restore of the
   same snapshot's same query (below). The first write is the *placeholder* ``offsets/<N+1>``
   (create-if-absent), the offsets log's latest entry from then on: a text whose first line is not
   an offsets log version. Spark (4.x) refuses the location: while there is no ``metadata`` yet,
   ``start()`` fails with ``STREAMING_CHECKPOINT_MISSING_METADATA_FILE`` (offsets without
   metadata); once ``metadata`` is written, the query reads the latest offsets entry before it runs
   anything and fails with ``IllegalStateException: ... [MALFORMED_LOG_FILE] ...`` quoting the line,
   which says what happened and what to do. Either way it reads no input and writes nothing. The
   placeholder also names the restore: app, generation, query, batch and a token of this attempt.
2. **write** (``write_archive``): every file of the archive, ``metadata`` first with a new query id
   (without its old checksum file ``.metadata.crc``: Hadoop's local file system verifies a ``.crc``
   next to the file it reads). Where the store serves several requests at once
   (``storage.copy_concurrency``) the other files are written several at a time
   (``file_copies.SpooledWrites``), in any order; ``write_archive`` returns, or raises, only once no
   write it started is still running.
3. **complete** (``complete``): after checking that the placeholder is still this attempt's, remove a
   ``.metadata.crc`` a Spark query started on the partial target may have left, then delete the
   placeholder. **That delete is the completion point**: before it Spark refuses the location, after
   it the offsets log's latest entry is the snapshot's ``offsets/<N>`` (with ``commits/<N>``), a
   complete checkpoint at batch ``N``. A delete of one object is atomic on every store, where an
   overwrite is not on every file system (Hadoop's sftp and local file systems replace a file by a
   delete and a rename).

A crash anywhere before the completion point leaves the placeholder, so Spark still refuses the
location, and ``claim_target`` recognises it: a restore of the same snapshot's query takes it over
(rewrites the placeholder with its own token, deletes every other file: an earlier attempt's, or
a ``metadata`` a failed Spark start wrote) and completes it; any other restore, and any location
with other content, is refused with ``FileExistsError`` before anything is written. A complete
checkpoint is never overwritten. ``abandon`` removes a claimed, unfinished target (the placeholder
last) when a restore gives up. Two restores of the same query into the same location at the same
time are not supported: the later takes the location over, and the earlier then refuses to
complete it (its token is gone), but the two may interleave their writes until then.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from snapcoord.spark_connector.savepoints.checkpoint_archive import unpack_chunks
from snapcoord.spark_connector.savepoints.file_copies import SpooledWrites
from snapcoord.spark_connector.storage import Storage, copy_concurrency, join

log = logging.getLogger(__name__)

#: The first line of a placeholder ``offsets/<N>``: Spark quotes it in the error that stops a query.
PLACEHOLDER_LINE = (
    "snapcoord: this checkpoint is an unfinished restore (not an offsets log entry); run "
    "restore_snapshot for it again to complete it, or delete the directory"
)


@dataclass(frozen=True)
class RestoreMarker:
    """Which restore a placeholder belongs to (``token``: one attempt of it)."""

    app_id: str
    generation: int
    query_name: str
    batch_id: int
    token: str

    @staticmethod
    def new(app_id: str, generation: int, query_name: str, batch_id: int) -> RestoreMarker:
        return RestoreMarker(app_id, generation, query_name, batch_id, uuid.uuid4().hex)

    @property
    def path(self) -> str:
        """The placeholder's path: the offsets log entry after the snapshot's batch."""
        return join("offsets", str(self.batch_id + 1))

    def encode(self) -> bytes:
        doc = {
            "app_id": self.app_id,
            "generation": self.generation,
            "query_name": self.query_name,
            "batch_id": self.batch_id,
            "token": self.token,
        }
        return f"{PLACEHOLDER_LINE}\n{json.dumps(doc, sort_keys=True)}\n".encode()

    @staticmethod
    def decode(data: bytes) -> RestoreMarker | None:
        """The marker in ``data``; None when ``data`` is not a placeholder (a real offsets entry)."""
        lines = data.decode("utf-8", errors="replace").splitlines()
        if len(lines) < 2 or lines[0] != PLACEHOLDER_LINE:
            return None
        try:
            doc = json.loads(lines[1])
            return RestoreMarker(
                str(doc["app_id"]),
                int(doc["generation"]),
                str(doc["query_name"]),
                int(doc["batch_id"]),
                str(doc["token"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def same_restore(self, other: RestoreMarker) -> bool:
        """The same snapshot's same query (which fixes the batch too), any attempt."""
        return (self.app_id, self.generation, self.query_name) == (
            other.app_id,
            other.generation,
            other.query_name,
        )

    def describe(self) -> str:
        return f"{self.app_id} generation {self.generation} query {self.query_name} (batch {self.batch_id})"


def unfinished_restore(target: Storage) -> RestoreMarker | None:
    """The marker of the unfinished restore at ``target`` (the placeholder is the offsets log's
    latest entry), else None."""
    entries = [int(e.name) for e in target.list("offsets") if e.name.isdigit() and not e.is_dir]
    if not entries:
        return None
    try:
        return RestoreMarker.decode(target.read_bytes(join("offsets", str(max(entries)))))
    except FileNotFoundError:
        return None


def check_target(target: Storage, marker: RestoreMarker) -> bool:
    """Raise ``FileExistsError`` unless ``target`` is empty (False) or an unfinished restore of the
    same snapshot's query (True). Writes nothing."""
    if not target.list(""):
        return False
    found = unfinished_restore(target)
    if found is None:
        raise FileExistsError(
            f"{target.location} is not empty: restore {marker.query_name} into a new checkpoint location"
        )
    if not found.same_restore(marker):
        raise FileExistsError(
            f"{target.location} holds an unfinished restore of {found.describe()}, not of "
            f"{marker.describe()}: complete that restore, or delete the location"
        )
    return True


def _delete_all_but(target: Storage, keep: str) -> None:
    """Delete every file of ``target`` except ``keep`` (a file directly below a directory)."""
    keep_dir, _, keep_name = keep.rpartition("/")
    for entry in target.list(""):
        if entry.name != keep_dir:
            target.delete_tree(entry.name)
            continue
        for inner in target.list(keep_dir):
            if inner.name != keep_name:
                target.delete_tree(join(keep_dir, inner.name))


def claim_target(target: Storage, marker: RestoreMarker) -> None:
    """Step 1 of the protocol: write ``marker``'s placeholder into ``target`` (see the module
    docstring); ``FileExistsError`` when the location is someone else's."""
    if not check_target(target, marker):
        try:
            target.write_bytes(marker.path, marker.encode(), exclusive=True)
            return
        except FileExistsError:
            check_target(target, marker)  # another restore claimed it meanwhile: the same one?
    log.warning("%s: taking over an unfinished restore of %s", target.location, marker.describe())
    target.write_bytes(marker.path, marker.encode())
    _delete_all_but(target, marker.path)


def _new_query_id(metadata: bytes) -> tuple[bytes, str]:
    """``metadata`` with a new query id (Spark keeps the id in the JSON of its first line)."""
    doc = json.loads(metadata.decode("utf-8").splitlines()[0])
    doc["id"] = str(uuid.uuid4())
    return (json.dumps(doc) + "\n").encode(), str(doc["id"])


@dataclass(frozen=True)
class PendingRestore:
    """A target written up to its completion point, and the new query id in its ``metadata``."""

    marker: RestoreMarker
    query_id: str


def write_archive(target: Storage, chunks: Iterable[bytes], marker: RestoreMarker) -> PendingRestore:
    """Step 2: write the archive's files into the claimed ``target``."""
    offsets_entry = join("offsets", str(marker.batch_id))
    seen_offsets = False
    query_id: str | None = None
    with SpooledWrites(target, copy_concurrency(target)) as writes:
        for member in unpack_chunks(chunks):
            if member.path == marker.path:
                raise ValueError(f"the archive of {marker.describe()} holds {marker.path}, after its cut")
            if member.path == "metadata":
                data, query_id = _new_query_id(b"".join(member.chunks))
                target.write_bytes("metadata", data)
            elif member.path == ".metadata.crc":
                for _ in member.chunks:
                    pass
            else:
                seen_offsets = seen_offsets or member.path == offsets_entry
                writes.write(member.path, member.chunks)
    if not seen_offsets or query_id is None:
        raise ValueError(
            f"the archive of {marker.describe()} has no {offsets_entry} or no metadata: not a checkpoint cut"
        )
    return PendingRestore(marker, query_id)


def _require_own(target: Storage, marker: RestoreMarker) -> None:
    try:
        found = RestoreMarker.decode(target.read_bytes(marker.path))
    except FileNotFoundError:
        found = None
    if found != marker:
        raise FileExistsError(
            f"{target.location}: the restore of {marker.describe()} was taken over by another attempt "
            f"(its placeholder {marker.path} is gone or someone else's)"
        )


def complete(target: Storage, pending: PendingRestore) -> None:
    """Step 3, the completion point: the placeholder goes, ``offsets/<N>`` is the latest entry."""
    _require_own(target, pending.marker)
    target.delete(".metadata.crc")  # a failed Spark start on the partial target wrote one for its metadata
    target.delete(pending.marker.path)


def abandon(target: Storage, marker: RestoreMarker) -> None:
    """Remove a target this attempt claimed and did not complete: every file, the placeholder last
    (until then Spark still refuses the location). Nothing when another attempt took it over."""
    try:
        _require_own(target, marker)
    except FileExistsError:
        return
    _delete_all_but(target, marker.path)
    target.delete(marker.path)
    target.delete_tree("offsets")  # held the placeholder alone
    if not target.list(""):  # the location was empty before the claim: leave no empty directories
        target.delete_tree("")
