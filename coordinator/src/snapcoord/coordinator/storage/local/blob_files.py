"""Local blob store: one file per object in a directory, the embedded default next to SQLite metadata.

Layout: ``<dir>/objects/<key>`` holds the objects, ``<dir>/tmp/`` the uploads in flight. A put
writes a temp file, fsyncs it and renames it over the key, so a reader sees the old object or the
new one, never a torn one, and a crash leaves at most a temp file, which is never listed (it lives
outside ``objects/``). Renaming within one file system is atomic, which is why ``tmp/`` is inside
the store's directory rather than in ``/tmp``.

Unlike S3, a key cannot be both an object and a "directory" of other objects (``a`` and ``a/b``);
the coordinator never does that (keys end in a UUID), and it is rejected as an invalid argument.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from snapcoord.coordinator.errors import BlobNotFound, InvalidArgument, StoreUnavailable
from snapcoord.coordinator.storage.blobs import BlobInfo, BlobStore, validate_key
from snapcoord.coordinator.storage.uris import directory_from_file_uri

OBJECTS_DIR = "objects"
TMP_DIR = "tmp"
#: Temp files older than this at open time belong to writers that died; newer ones may be live
#: uploads of another process sharing the directory.
STALE_TMP_AGE_S = 3600
#: Attempts at a rename that races with directory pruning; each lost race means another thread
#: made progress, so a handful is plenty.
_RACE_RETRIES = 20


class LocalBlobStore(BlobStore):
    """Objects as files under a directory; safe for concurrent threads (and processes)."""

    @classmethod
    def from_uri(cls, uri: str) -> LocalBlobStore:
        """Open (creating if needed) the store in the directory of ``file:///dir`` or ``file:dir``."""
        return cls(directory_from_file_uri(uri), uri=uri)

    def __init__(self, directory: Path, *, uri: str | None = None) -> None:
        self.uri = uri or directory.resolve().as_uri()
        self._objects = directory / OBJECTS_DIR
        self._tmp = directory / TMP_DIR
        self._closed = False
        try:
            self._objects.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
            self._remove_stale_temp_files()
        except OSError as e:
            raise StoreUnavailable(f"cannot open the blob directory {directory}: {e}") from e

    def put(self, key: str, data: bytes) -> None:
        self.put_stream(key, (data,))

    def put_stream(self, key: str, pieces: Iterable[bytes]) -> None:
        # A temp file renamed into place: readers never see a partial object, and a failure
        # midway (of the store or of ``pieces``) leaves only the temp file, removed here.
        target = self._path(key)
        tmp = self._tmp / f"{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "xb") as f:
                for piece in pieces:
                    f.write(piece)
                f.flush()
                os.fsync(f.fileno())
            self._rename_into_place(tmp, target, key)
            _fsync_directory(target.parent)
        except OSError as e:
            raise StoreUnavailable(f"cannot store blob {key} in {self.uri}: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            raise BlobNotFound(f"no blob {key} in {self.uri}") from e
        except OSError as e:
            raise StoreUnavailable(f"cannot read blob {key} from {self.uri}: {e}") from e

    def get_stream(self, key: str, chunk_bytes: int) -> Generator[bytes, None, None]:
        path = self._path(key)
        try:
            f = open(path, "rb")  # noqa: SIM115 -- closed by _chunks, which outlives this call
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            raise BlobNotFound(f"no blob {key} in {self.uri}") from e
        except OSError as e:
            raise StoreUnavailable(f"cannot read blob {key} from {self.uri}: {e}") from e
        return self._chunks(f, key, chunk_bytes)

    def _chunks(self, f: BinaryIO, key: str, chunk_bytes: int) -> Generator[bytes, None, None]:
        """The open file in pieces; closed however the reader stops. (An object is replaced by
        rename, never rewritten in place, so an open file keeps the version it opened.)"""
        with f:
            while True:
                try:
                    piece = f.read(chunk_bytes)
                except OSError as e:
                    raise StoreUnavailable(f"cannot read blob {key} from {self.uri}: {e}") from e
                if not piece:
                    return
                yield piece

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # no object by that name, only longer keys under it
        except OSError as e:
            raise StoreUnavailable(f"cannot delete blob {key} from {self.uri}: {e}") from e
        # Durable before the caller withdraws the intent naming the object: after a power loss
        # the file would come back named by nothing (the metadata store's write is durable).
        directory = path.parent
        while True:
            try:
                _fsync_directory(directory)
                break
            except FileNotFoundError:
                # A concurrent delete pruned it, entry and all: its removal is what must last.
                if directory == self._objects:
                    raise StoreUnavailable(f"cannot delete blob {key}: {self.uri} is gone") from None
                directory = directory.parent
            except OSError as e:
                raise StoreUnavailable(f"cannot delete blob {key} from {self.uri}: {e}") from e
        # Prune directories left empty, so that the janitor's deletes do not leave a growing tree
        # of empty directories behind; rmdir refuses a non-empty one, which ends the walk.
        parent = path.parent
        while parent != self._objects:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list(self, prefix: str = "", *, modified_before_ms: int | None = None) -> Iterator[BlobInfo]:
        self._check_open()
        # Start at the deepest directory the prefix names, and filter the rest by name.
        head, _, _ = prefix.rpartition("/")
        start = self._objects / head if head else self._objects
        if head:
            validate_key(head)
        return self._walk(start, f"{head}/" if head else "", prefix, modified_before_ms)

    def check(self) -> None:
        for directory in (self._objects, self._tmp):
            if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
                raise StoreUnavailable(
                    f"blob directory {directory} is missing or not writable by uid {os.getuid()}"
                )

    def close(self) -> None:
        self._closed = True

    # --- internals ------------------------------------------------------------------------------

    def _walk(
        self, directory: Path, key_prefix: str, prefix: str, before_ms: int | None
    ) -> Iterator[BlobInfo]:
        """Yield objects under ``directory`` in key order, lazily.

        Sorting a directory's entries by name, with ``/`` appended to subdirectory names, sorts them
        as their full keys sort: every key under ``a/`` compares as ``a/`` does against a sibling
        such as ``a-b`` or ``ab``.
        """
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return  # pruned by a concurrent delete, or never there
        except OSError as e:
            raise StoreUnavailable(f"cannot list {directory} in {self.uri}: {e}") from e
        keyed = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            keyed.append((entry.name + "/" if is_dir else entry.name, is_dir, entry))
        keyed.sort(key=lambda t: t[0])
        for sort_name, is_dir, entry in keyed:
            key = key_prefix + sort_name
            # Skip what cannot match: the key must start with the prefix, or (for a directory)
            # the prefix must continue inside it.
            if not (key.startswith(prefix) or (is_dir and prefix.startswith(key))):
                continue
            if is_dir:
                yield from self._walk(Path(entry.path), key, prefix, before_ms)
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while we listed
            modified_ms = st.st_mtime_ns // 1_000_000
            if before_ms is not None and modified_ms >= before_ms:
                continue
            yield BlobInfo(key=key, size=st.st_size, last_modified_ms=modified_ms)

    def _rename_into_place(self, tmp: Path, target: Path, key: str) -> None:
        # A concurrent delete may prune a directory on the target's path between our mkdir and our
        # rename (ENOENT), or while we make the directories: transient, so make them again and
        # retry. Only an object where a directory must be (or the reverse) is a real conflict.
        for _ in range(_RACE_RETRIES):
            try:
                self._make_directories(target.parent)
                os.replace(tmp, target)
                return
            except (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as e:
                if target.is_dir() or self._object_above(key):
                    raise InvalidArgument(f"blob key {key!r} conflicts with an existing key: {e}") from e
                if not tmp.exists():
                    raise
        raise StoreUnavailable(f"cannot store blob {key} in {self.uri}: its directory keeps disappearing")

    def _object_above(self, key: str) -> bool:
        """Whether an object sits where ``key`` needs a directory (``a`` for ``a/b``)."""
        parts = key.split("/")[:-1]
        return any((self._objects.joinpath(*parts[:n])).is_file() for n in range(1, len(parts) + 1))

    @staticmethod
    def _make_directories(directory: Path) -> None:
        """``mkdir -p`` that makes every new directory durable.

        The object is written before the metadata commit that references it; if a power loss could
        take back a directory entry, a committed reference could point at nothing.
        """
        missing: list[Path] = []
        while not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            # Made meanwhile by a concurrent put, or a file: then the rename reports the conflict.
            with contextlib.suppress(FileExistsError):
                os.mkdir(new)
            _fsync_directory(new.parent)

    def _path(self, key: str) -> Path:
        self._check_open()
        return self._objects / validate_key(key)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable(f"blob store {self.uri} is closed")

    def _remove_stale_temp_files(self) -> None:
        cutoff = time.time() - STALE_TMP_AGE_S
        for entry in os.scandir(self._tmp):
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (the new entry lives in the directory's data)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:  # some file systems cannot fsync a directory
            raise
    finally:
        os.close(fd)
