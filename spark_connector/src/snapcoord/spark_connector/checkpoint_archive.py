"""An immutable, restorable copy of one streaming query's checkpoint at its last committed batch.

Spark deletes offsets, commits and state older than ``minBatchesToRetain`` (100 batches by default),
so a snapshot that only names the live checkpoint soon cannot be restored. ``cut_checkpoint`` finds
the last batch ``N`` that has both ``offsets/N`` and ``commits/N``, and ``stage_cut`` copies what a
restart from ``N`` reads into a private directory (hard links when the file system allows: Spark never
rewrites a checkpoint file in place, it writes new names and deletes old ones):

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
  ``SSTs/`` file present (a superset); RocksDB is not exercised by the tests here.

Races: Spark keeps running while the copy is made. Files of later batches are never copied (they
are recognised by their version). A file Spark deletes while it is being copied (the cut fell out
of ``minBatchesToRetain``) raises ``FileNotFoundError`` on the copy, and a cut whose ``offsets/N-1``
(or ``offsets/N`` for ``N == 0``) is gone from the live checkpoint once the copy is done may miss
state files that maintenance removed while it was listed: both make ``stage_cut`` start over with
the newer last committed batch, a bounded number of times.

``archive_chunks`` streams a staged directory as an uncompressed POSIX tar, file by file in pieces
of at most 1 MiB (never whole in memory); ``extract_archive`` unpacks such a stream (``tarfile``'s
``data`` filter: no absolute paths, links or devices; ``unpack_archive`` stops before the
rename). Only local checkpoints (a path or a
``file:`` URI) can be cut: the copy is made by the process that calls it, which under Spark Connect
must see the server's checkpoint directory at the same path.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
#: ``1.delta``, ``7.snapshot``, ``12.zip``, ``12_<uuid>.zip`` (RocksDB checkpoint format v2), ...
_STATE_VERSION_RE = re.compile(r"^(?P<version>\d+)(?:_[^.]*)?\.(?:delta|snapshot|zip|changelog)$")


class CheckpointNotReady(RuntimeError):
    """The checkpoint has no committed batch yet (or no checkpoint at all)."""


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


def local_checkpoint(location: str) -> Path:
    """A checkpoint location as a local path (a plain path or a ``file:`` URI)."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # "C:" is a drive, not a scheme
        raise ValueError(f"only local checkpoints (a path or a file: URI) can be copied, not {location!r}")
    return Path(location)


def _log_entries(directory: Path) -> dict[int, Path]:
    """``<N>`` and ``<N>.compact`` files of a Spark metadata log (no temp or checksum files)."""
    out: dict[int, Path] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in directory.iterdir():
            name = entry.name.removesuffix(".compact")
            if name.isdigit():
                out[int(name)] = entry
    return out


def cut_checkpoint(checkpoint: Path) -> CheckpointCut:
    """The newest batch with both its offsets and its commit log entry (Spark writes ``offsets/N``
    before running batch N and ``commits/N`` after it: a batch with both is done)."""
    commits = _log_entries(checkpoint / "commits")
    offsets = _log_entries(checkpoint / "offsets")
    for batch_id in sorted(set(commits) & set(offsets), reverse=True):
        try:
            return CheckpointCut(batch_id, (checkpoint / "offsets" / str(batch_id)).read_text("utf-8"))
        except FileNotFoundError:  # purged since the listing: an older one cannot be newer
            continue
    raise CheckpointNotReady(f"{checkpoint} has no committed batch (no commits/N with an offsets/N)")


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


def cut_files(checkpoint: Path, cut: CheckpointCut) -> Iterator[Path]:
    """Relative paths of the files a restart from ``cut`` needs (see the module docstring).

    Checksum files (``.<name>.crc``, written by Hadoop's local file system) follow their file.
    """
    n = cut.batch_id
    wanted: list[Path] = [Path("metadata")]
    for log_dir in ("offsets", "commits"):
        wanted += [Path(log_dir) / str(b) for b in (n - 1, n) if b >= 0]
    limits = {str(i): _source_limit(o, n) for i, o in enumerate(cut.source_offsets)}
    for source_dir in sorted(_subdirs(checkpoint / "sources")):
        limit = limits.get(source_dir.name, n)
        for entry, path in sorted(_log_entries(source_dir).items()):
            if entry <= limit:
                wanted.append(path.relative_to(checkpoint))
    state_version = n + 1
    state_root = checkpoint / "state"
    for dirpath, dirnames, filenames in os.walk(state_root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(".tmp"):
                continue  # checksums follow their file; temp files are unfinished writes
            m = _STATE_VERSION_RE.match(name)
            if m is None or int(m.group("version")) <= state_version:
                wanted.append((Path(dirpath) / name).relative_to(checkpoint))
    for rel in wanted:
        yield rel
        crc = rel.parent / f".{rel.name}.crc"
        if (checkpoint / crc).exists():
            yield crc


def _subdirs(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return []


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except FileNotFoundError:
        raise
    except OSError:  # another file system, or links not allowed: a real copy
        shutil.copyfile(src, dst)


def stage_cut(checkpoint: Path, staging: Path, *, attempts: int = 5) -> CheckpointCut:
    """Copy the checkpoint's last committed batch into ``staging`` (which must not exist) and return
    the cut it holds; starts over with a newer cut when Spark deleted files of the old one meanwhile.
    """
    last_error: Exception | None = None
    for attempt in range(1, attempts + 1):
        if staging.exists():
            shutil.rmtree(staging)
        cut = cut_checkpoint(checkpoint)
        try:
            for rel in cut_files(checkpoint, cut):
                _link_or_copy(checkpoint / rel, staging / rel)
        except FileNotFoundError as e:
            last_error = e
            log.info("%s: %s vanished copying batch %d (attempt %d)", checkpoint, e, cut.batch_id, attempt)
            continue
        # Spark purges the offsets log and the state files at the same bound: while the entry before
        # the cut is still there, so were the state files the listing above found (and linked).
        guard = checkpoint / "offsets" / str(max(cut.batch_id - 1, 0))
        if guard.exists():
            return cut
        last_error = FileNotFoundError(f"{guard} was purged while batch {cut.batch_id} was copied")
    shutil.rmtree(staging, ignore_errors=True)
    raise RuntimeError(
        f"{checkpoint}: could not copy a committed batch in {attempts} attempts, Spark purged files "
        f"faster than they were copied (raise spark.sql.streaming.minBatchesToRetain): {last_error}"
    )


def archive_chunks(directory: Path) -> Iterator[bytes]:
    """``directory``'s regular files as an uncompressed tar stream, in pieces of at most 1 MiB."""
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        info = tarfile.TarInfo(path.relative_to(directory).as_posix())
        info.size = path.stat().st_size
        info.mode = 0o644
        yield info.tobuf(format=tarfile.PAX_FORMAT)
        with path.open("rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk
        if info.size % tarfile.BLOCKSIZE:
            yield tarfile.NUL * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte pieces (what ``tarfile``'s stream mode reads)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._rest:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._rest = piece
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def unpack_archive(
    chunks: Iterable[bytes], target: Path, *, prepare: Callable[[Path], object] | None = None
) -> Path:
    """Unpack an ``archive_chunks`` stream into a new hidden directory next to ``target`` (which must
    not exist), ``prepare`` it and return it: the caller renames it to ``target`` when it is ready
    (``extract_archive``), or removes it. Nothing is left behind when this raises."""
    if target.exists():
        raise FileExistsError(f"{target} exists: restore into a new checkpoint directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.restoring-", dir=target.parent))
    try:
        with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), CHUNK_BYTES), mode="r|") as tar:
            tar.extractall(partial, filter="data")
        if prepare is not None:
            prepare(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return partial


def extract_archive(
    chunks: Iterable[bytes], target: Path, *, prepare: Callable[[Path], object] | None = None
) -> None:
    """Unpack an ``archive_chunks`` stream into ``target`` (created; must not exist), atomically: it
    is unpacked next to ``target``, ``prepare``d, and renamed into place only when complete."""
    partial = unpack_archive(chunks, target, prepare=prepare)
    try:
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
