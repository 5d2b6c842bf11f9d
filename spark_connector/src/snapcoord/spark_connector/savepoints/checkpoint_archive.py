"""An immutable, restorable copy of one streaming query's checkpoint at its last committed batch.

Spark deletes offsets, commits and state older than ``minBatchesToRetain`` (100 batches by default),
so a snapshot that only names the live checkpoint soon cannot be restored. ``cut_checkpoint`` finds
the last batch ``N`` that has both ``offsets/N`` and ``commits/N``, and ``cut_files`` lists what a
restart from ``N`` reads:

- ``metadata`` (the query id; ``restore`` gives the rebuilt checkpoint a new one);
- ``offsets/N-1``, ``offsets/N``, ``commits/N-1``, ``commits/N`` (a restart reads ``offsets/N-1`` to
  know where batch ``N`` started);
- ``sources/<i>/...`` up to the cut: a file source's metadata log up to the ``logOffset`` it has in
  ``offsets/N``; other sources' logs (Kafka and rate keep their start in ``sources/<i>/0``) up to
  batch ``N``. Later entries would list files that a restored upstream query's sink no longer has;
- ``state/``: every state store file of version ``<= N+1`` (batch ``N`` committed version ``N+1``),
  plus the operators' and stores' metadata and schema files. With the default HDFS-backed provider
  that is the latest snapshot file and the deltas after it (a superset: older files present at copy
  time come along). With RocksDB, the ``<v>.zip``/``<v>.changelog`` files up to ``N+1`` and every
  ``SSTs/`` file present (a superset).

The checkpoint is read through a ``Storage`` (any location Spark can use), and ``send_cut`` streams
the cut's files from it as an uncompressed POSIX tar (``archive_chunks``: file by file, in pieces of at
most 1 MiB, never whole in memory) to whatever consumes the stream (the coordinator's upload). Where
the store serves several requests at once (``storage.copy_concurrency``: object stores and HDFS through
Spark's Hadoop FileSystem), the next files are downloaded into a local spool directory while the
current one is sent (``file_copies.read_ahead``), so that the per-file round trips overlap; elsewhere
each file is read straight from the store when the stream reaches it.

Races: Spark keeps running while the copy is made. Files of later batches are never copied (they
are recognised by their version). Spark never rewrites a checkpoint file in place: it writes new
names and deletes old ones. So a file of the cut either reads whole, or it is gone: Spark deleted it
(the cut fell out of ``minBatchesToRetain``), the read raises ``FileNotFoundError`` (or returns
other than the listed size, ``CutChanged``) and ``send_cut`` starts over with the newer last
committed batch. Spark purges the offsets log and the state files at the same bound, so a cut whose
``offsets/N-1`` (``offsets/N`` for ``N == 0``) is gone from the live checkpoint once the stream is
done may miss state files that maintenance removed while they were listed: ``send_cut`` starts over
then too, a bounded number of times (the stream already sent is the consumer's to discard: an
upload no report names is removed by the coordinator's janitor).

``unpack_chunks`` reads such a stream back, member by member (regular files with clean relative
names only: no absolute paths, ``..``, links or devices); ``restore_target`` writes it into a new
checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import tarfile
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TypeVar

from snapcoord.spark_connector.savepoints.file_copies import read_ahead
from snapcoord.spark_connector.storage import Storage, clean_path, copy_concurrency, join
from snapcoord.spark_connector.storage.base import local_file_chunks

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
#: ``1.delta``, ``7.snapshot``, ``12.zip``, ``12_<uuid>.zip`` (RocksDB checkpoint format v2), ...
_STATE_VERSION_RE = re.compile(r"^(?P<version>\d+)(?:_[^.]*)?\.(?:delta|snapshot|zip|changelog)$")

T = TypeVar("T")


class CheckpointNotReady(RuntimeError):
    """The checkpoint has no committed batch yet (or no checkpoint at all)."""


class CutChanged(RuntimeError):
    """A file of the cut read back with another size than it was listed with: it changed meanwhile."""


@dataclass(frozen=True)
class CheckpointCut:
    """The last committed batch of a checkpoint, as its own logs say."""

    batch_id: int
    #: ``offsets/N`` as Spark wrote it (version line, metadata line, one line per source).
    offsets_entry: str

    @property
    def source_offsets(self) -> tuple[str | None, ...]:
        """Each source's offset JSON in ``offsets/N`` (None for a source without an offset)."""
        return tuple(None if line == "-" else line for line in self.offsets_entry.splitlines()[2:])


@dataclass(frozen=True)
class CutFile:
    """One file of a cut: its path below the checkpoint and its size when it was listed."""

    path: str
    size: int


def _log_entries(checkpoint: Storage, directory: str) -> dict[int, CutFile]:
    """``<N>`` and ``<N>.compact`` files of a Spark metadata log (no temp or checksum files)."""
    out: dict[int, CutFile] = {}
    for entry in checkpoint.list(directory):
        name = entry.name.removesuffix(".compact")
        if name.isdigit() and not entry.is_dir:
            out[int(name)] = CutFile(join(directory, entry.name), entry.size)
    return out


def cut_checkpoint(checkpoint: Storage) -> CheckpointCut:
    """The newest batch with both its offsets and its commit log entry (Spark writes ``offsets/N``
    before running batch N and ``commits/N`` after it: a batch with both is done)."""
    commits = _log_entries(checkpoint, "commits")
    offsets = _log_entries(checkpoint, "offsets")
    for batch_id in sorted(set(commits) & set(offsets), reverse=True):
        try:
            entry = checkpoint.read_bytes(offsets[batch_id].path).decode("utf-8")
        except FileNotFoundError:  # purged since the listing: an older one cannot be newer
            continue
        return CheckpointCut(batch_id, entry)
    raise CheckpointNotReady(f"{checkpoint.location} has no committed batch (no commits/N with an offsets/N)")


def _source_limit(offset_json: str | None, batch_id: int) -> int:
    """The newest ``sources/<i>/<k>`` entry batch ``N`` may need: a file source's ``logOffset``,
    else ``N`` (Kafka, rate and most sources write only ``sources/<i>/0``)."""
    if offset_json is not None:
        with contextlib.suppress(ValueError):
            value = json.loads(offset_json)
            if isinstance(value, dict) and isinstance(value.get("logOffset"), int):
                return int(value["logOffset"])
    return batch_id


def _is_log_file(name: str) -> bool:
    return name.removesuffix(".compact").isdigit()


def _walk_files(checkpoint: Storage, directory: str) -> Iterator[CutFile]:
    """Every file below ``directory``, depth first, in name order."""
    for entry in checkpoint.list(directory):
        path = join(directory, entry.name)
        if entry.is_dir:
            yield from _walk_files(checkpoint, path)
        else:
            yield CutFile(path, entry.size)


def cut_files(checkpoint: Storage, cut: CheckpointCut) -> list[CutFile]:
    """The files a restart from ``cut`` needs (see the module docstring), with their listed sizes.
    ``FileNotFoundError`` when one of the cut's log entries is gone already.

    Checksum files (``.<name>.crc``, written by Hadoop's local file system) follow their file.
    """
    n = cut.batch_id
    wanted: list[CutFile] = []
    listings: dict[str, dict[str, CutFile]] = {}

    def listed(directory: str) -> dict[str, CutFile]:
        if directory not in listings:
            listings[directory] = {
                e.name: CutFile(join(directory, e.name), e.size)
                for e in checkpoint.list(directory)
                if not e.is_dir
            }
        return listings[directory]

    def need(directory: str, name: str) -> None:
        found = listed(directory).get(name)
        if found is None:
            raise FileNotFoundError(f"{checkpoint.uri(join(directory, name))} is gone")
        wanted.append(found)

    need("", "metadata")
    for log_dir in ("offsets", "commits"):
        for b in (n - 1, n):
            if b >= 0:
                need(log_dir, str(b))
    limits = {str(i): _source_limit(o, n) for i, o in enumerate(cut.source_offsets)}
    for source_dir in checkpoint.list("sources"):
        if source_dir.is_dir:
            limit = limits.get(source_dir.name, n)
            directory = join("sources", source_dir.name)
            for name, file in sorted(listed(directory).items()):
                if _is_log_file(name) and int(name.removesuffix(".compact")) <= limit:
                    wanted.append(file)
    state_files = list(_walk_files(checkpoint, "state"))
    for file in state_files:  # one listing per directory serves its checksums too
        directory, _, name = file.path.rpartition("/")
        listings.setdefault(directory, {})[name] = file
    state_version = n + 1
    for file in state_files:
        name = file.path.rpartition("/")[2]
        if name.startswith(".") or name.endswith(".tmp"):
            continue  # checksums follow their file; temp files are unfinished writes
        m = _STATE_VERSION_RE.match(name)
        if m is None or int(m.group("version")) <= state_version:
            wanted.append(file)
    out: list[CutFile] = []
    for file in wanted:
        out.append(file)
        directory, _, name = file.path.rpartition("/")
        crc = listed(directory).get(f".{name}.crc")
        if crc is not None:
            out.append(crc)
    return out


def _file_reads(checkpoint: Storage, files: Sequence[CutFile]) -> Generator[Iterator[bytes], None, None]:
    """Each file's bytes in pieces, in order: read ahead where the store allows (module docstring)."""
    concurrency = copy_concurrency(checkpoint)
    if concurrency == 1:
        for file in files:
            yield checkpoint.read_chunks(file.path, CHUNK_BYTES)
        return
    for local in read_ahead(checkpoint, [f.path for f in files], concurrency):
        yield local_file_chunks(local, CHUNK_BYTES)


def archive_chunks(checkpoint: Storage, files: Sequence[CutFile]) -> Generator[bytes, None, None]:
    """``files`` of ``checkpoint`` as an uncompressed tar stream, in pieces of at most 1 MiB, read
    from the store as the stream is consumed (or a few files ahead, see the module docstring).
    ``FileNotFoundError`` when a file is gone, ``CutChanged`` when one reads back with another size
    than listed."""
    with contextlib.closing(_file_reads(checkpoint, files)) as reads:
        for file, chunks in zip(files, reads, strict=True):
            yield from _member(checkpoint, file, chunks)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)


def _member(checkpoint: Storage, file: CutFile, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """One file's tar header, bytes (checked against its listed size) and padding."""
    info = tarfile.TarInfo(file.path)
    info.size = file.size
    info.mode = 0o644
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    sent = 0
    for chunk in chunks:
        sent += len(chunk)
        if sent > file.size:
            break
        yield chunk
    if sent != file.size:
        raise CutChanged(f"{checkpoint.uri(file.path)} was listed with {file.size} bytes, read {sent}")
    if file.size % tarfile.BLOCKSIZE:
        yield tarfile.NUL * (tarfile.BLOCKSIZE - file.size % tarfile.BLOCKSIZE)


class _Recorded:
    """The chunks of one attempt, remembering the error that ended them: a gRPC upload that reads its
    request stream in another thread reports a failing stream only as a cancelled call."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks
        except Exception as e:  # not GeneratorExit: a consumer that stopped early closes it
            self.error = e
            raise


_RETRY_CUT = (FileNotFoundError, CutChanged)


def _close(archive: Generator[bytes, None, None]) -> None:
    """End a stream its consumer left unfinished: its reads ahead stop and its spool goes. While a
    consumer thread is still inside it (a gRPC call ending), that happens once the thread drops it."""
    with contextlib.suppress(ValueError):  # "generator already executing"
        archive.close()


def send_cut(
    checkpoint: Storage,
    send: Callable[[CheckpointCut, Iterable[bytes]], T],
    *,
    attempts: int = 5,
) -> tuple[CheckpointCut, T]:
    """Stream the checkpoint's last committed batch to ``send(cut, chunks)`` and return the cut and
    what ``send`` returned; starts over with a newer cut when Spark deleted files of the old one
    meanwhile (see the module docstring). ``send`` must consume ``chunks`` to the end."""
    last_error: BaseException | None = None
    for attempt in range(1, attempts + 1):
        cut = cut_checkpoint(checkpoint)
        try:
            files = cut_files(checkpoint, cut)
        except FileNotFoundError as e:
            last_error = e
            continue
        archive = archive_chunks(checkpoint, files)
        chunks = _Recorded(archive)
        try:
            result = send(cut, chunks)
        except Exception as e:
            _close(archive)
            if isinstance(chunks.error, _RETRY_CUT):
                last_error = chunks.error
                log.info(
                    "%s: %s copying batch %d (attempt %d)",
                    checkpoint.location,
                    chunks.error,
                    cut.batch_id,
                    attempt,
                )
                continue
            if chunks.error is not None and chunks.error is not e:
                raise chunks.error from e
            raise
        # Spark purges the offsets log and the state files at the same bound: while the entry before
        # the cut is still there, so were the state files the listing above found (and read).
        guard = join("offsets", str(max(cut.batch_id - 1, 0)))
        if checkpoint.exists(guard):
            return cut, result
        last_error = FileNotFoundError(
            f"{checkpoint.uri(guard)} was purged while batch {cut.batch_id} was copied"
        )
    raise RuntimeError(
        f"{checkpoint.location}: could not copy a committed batch in {attempts} attempts, Spark purged files "
        f"faster than they were copied (raise spark.sql.streaming.minBatchesToRetain): {last_error}"
    )


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte pieces (what ``tarfile``'s stream mode reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._rest = b""
        #: Bytes taken from the pieces so far.
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._rest:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._rest = piece
            self.total += len(piece)
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


@dataclass(frozen=True)
class Member:
    """One file of an archive stream: its clean relative path, and its bytes in pieces (read them
    before the next member: the stream moves on)."""

    path: str
    size: int
    chunks: Iterator[bytes]


def _pieces(f: IO[bytes], size: int) -> Iterator[bytes]:
    left = size
    while left > 0:
        chunk = f.read(min(CHUNK_BYTES, left))
        if not chunk:
            raise EOFError("the archive ended inside a file (truncated stream)")
        left -= len(chunk)
        yield chunk


def unpack_chunks(chunks: Iterable[bytes]) -> Iterator[Member]:
    """The members of an ``archive_chunks`` stream, in order. ``ValueError`` for anything but a
    regular file with a clean relative name; ``tarfile.ReadError``/``EOFError`` for a cut-short
    stream, also one cut at a member's end (``tarfile`` takes that for the end of the archive: the
    stream must go on with the two zero blocks that end an archive)."""
    raw = _ChunkReader(chunks)
    with tarfile.open(fileobj=io.BufferedReader(raw, CHUNK_BYTES), mode="r|") as tar:
        for info in tar:
            if not info.isreg():
                raise ValueError(f"archive member {info.name!r} is not a regular file")
            path = clean_path(info.name)
            if not path:
                raise ValueError(f"archive member {info.name!r} has no name")
            f = tar.extractfile(info)
            assert f is not None
            yield Member(path, info.size, _pieces(f, info.size))
        end = tar.offset  # where the header that ended the iteration starts
    while raw.readinto(bytearray(CHUNK_BYTES)):
        pass
    if raw.total < end + 2 * tarfile.BLOCKSIZE:
        raise EOFError(
            f"the archive ended after {raw.total} bytes, without its end marker (truncated stream)"
        )
