"""The few storage operations the connector needs, as every object store gives them.

A ``Storage`` is rooted at one location (a checkpoint directory, a table); every method takes a path
relative to that root, ``/``-separated, without ``.`` or ``..`` segments. The operations are exactly what
S3, ADLS, GCS and HDFS all provide: whole-object writes, whole or streamed reads, listing one level,
delete, and create-if-absent (``write_bytes(..., exclusive=True)``) where the store has it. There is no
rename, no hard link, no fsync and no atomic directory: code built on this interface makes a multi-file
change visible by writing one object last (a commit point), never by moving a directory into place.

Directories are implicit: a write creates whatever parents the store needs, and a listing reports a
name that has objects below it as a directory. An empty directory may or may not be listed.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


class StorageError(RuntimeError):
    """A storage operation failed for a reason other than a missing or an already existing object."""


class UnsupportedLocation(ValueError):
    """A location the connector cannot reach: its scheme is unknown, or the library that reaches it is
    not installed. The message names the scheme and what to install; nothing was read or written."""


class ExclusiveWriteUnsupported(StorageError):
    """The store cannot create an object only if it is absent, and the caller needs that guarantee."""


@dataclass(frozen=True)
class Entry:
    """One name in a listing: a file (with its size in bytes) or a directory (size 0)."""

    name: str
    is_dir: bool
    size: int = 0


@runtime_checkable
class Storage(Protocol):
    """A location's objects; see the module docstring. Missing objects raise ``FileNotFoundError``,
    an exclusive write over an existing one ``FileExistsError``."""

    #: The root as a URI (``file:/abs/path`` for local directories), for messages and for Spark.
    @property
    def location(self) -> str: ...

    #: Whether ``write_bytes(..., exclusive=True)`` is atomic against a concurrent writer of the same
    #: name (True on local disks, HDFS, S3 with conditional writes, ADLS, GCS; False where the store
    #: can only check first and then write).
    @property
    def atomic_exclusive(self) -> bool: ...

    def uri(self, path: str = "") -> str:
        """The URI of ``path`` below the root (what Spark would be given for it)."""
        ...

    def list(self, path: str = "") -> list[Entry]:
        """The names directly below ``path``, sorted; empty when ``path`` does not exist."""
        ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int:
        """The size in bytes of the file ``path``."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def read_chunks(self, path: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        """The file's bytes in pieces of at most ``chunk_bytes`` (never whole in memory)."""
        ...

    def write_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        """Write the whole object. With ``exclusive``, only if no object of that name exists
        (``FileExistsError`` otherwise); a reader sees the old object, none, or all of ``data``."""
        ...

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        """Write the whole object from pieces (a large file, streamed); visible once complete on object
        stores, possibly partially on file systems while it is written."""
        ...

    def delete(self, path: str) -> bool:
        """Delete the file ``path``; False when there was none."""
        ...

    def delete_tree(self, path: str) -> None:
        """Delete ``path`` and everything below it; nothing when it does not exist."""
        ...

    def download(self, path: str, local_file: str | os.PathLike[str]) -> None:
        """Copy the file ``path`` to ``local_file`` on this machine, which appears whole (replacing any
        file of that name) once complete. Backends copy large files by the fastest way they have (the
        Hadoop backend inside Spark's JVM)."""
        ...

    def upload(self, local_file: str | os.PathLike[str], path: str) -> None:
        """Write the whole object ``path`` from the local file ``local_file`` (as ``write_chunks``)."""
        ...

    def child(self, path: str) -> Storage:
        """The same store rooted at ``path`` below this root."""
        ...


def copy_concurrency(storage: Storage) -> int:
    """How many files of ``storage`` a copy of many files (a snapshot's cut, a restore) moves at once:
    the backend's ``concurrent_copies`` where it declares one (Spark's Hadoop FileSystems on object
    stores and HDFS, whose clients serve concurrent calls), else 1."""
    value = getattr(storage, "concurrent_copies", 1)
    return value if isinstance(value, int) and value >= 1 else 1


def download_by_chunks(storage: Storage, path: str, local_file: str | os.PathLike[str]) -> None:
    """``download`` from ``read_chunks``: a temporary file next to ``local_file``, renamed into place."""
    target = Path(local_file)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        with temp.open("wb") as f:
            for chunk in storage.read_chunks(path, COPY_CHUNK_BYTES):
                f.write(chunk)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)


def local_file_chunks(local_file: str | os.PathLike[str], chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of a local file in pieces (for ``upload`` through ``write_chunks``)."""
    with open(local_file, "rb") as f:
        while chunk := f.read(chunk_bytes):
            yield chunk


#: The piece size of streamed copies.
COPY_CHUNK_BYTES = 4 << 20


def clean_path(path: str) -> str:
    """``path`` as a relative ``/``-separated path; ``ValueError`` for ``..``, absolute or empty segments."""
    if path in ("", "."):
        return ""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a relative storage path: {path!r}")
    return path


def join(*parts: str) -> str:
    """Relative paths joined with ``/`` (empty parts are skipped)."""
    return posixpath.join(*[p for p in parts if p]) if any(parts) else ""
