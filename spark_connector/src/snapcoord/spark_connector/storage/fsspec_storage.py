"""A location reached through fsspec, where no Spark JVM is at hand (a Spark Connect client, the Connect
server's Python workers).

The URI is the one Spark is given (``s3a://bucket/cp``, ``abfss://...``, ``gs://...``, ``hdfs://...``,
``sftp://user@host:port/path``); its scheme is mapped to the fsspec protocol that serves it, and the
store's standard credential chain applies (for S3: the AWS environment, profiles and instance roles;
``storage_options`` adds or overrides anything, such as an endpoint).

Whole-object writes stay all-or-nothing:

- object stores (S3, GCS, Azure blobs) show an object only once its upload completes. On S3 an
  exclusive write is a conditional request (``If-None-Match: *``, through s3fs): atomic against a
  concurrent writer, on every S3 server that implements conditional writes. gcsfs and adlfs are not
  known here to make fsspec's ``"xb"`` mode conditional, so on GCS and Azure an exclusive write checks
  first and then writes (``atomic_exclusive`` is False);
- file systems (sftp, HDFS) show a file while it is written, so a write goes to a hidden temporary name
  next to the target and is renamed into place; an exclusive write checks the name and renames without
  overwriting, which is two steps (``atomic_exclusive`` is False).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import uuid
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from snapcoord.spark_connector.storage.base import (
    COPY_CHUNK_BYTES,
    Entry,
    Storage,
    StorageError,
    UnsupportedLocation,
    clean_path,
    download_by_chunks,
    local_file_chunks,
)

if TYPE_CHECKING:
    from snapcoord.spark_connector.storage import FsspecScheme

#: fsspec protocols of object stores whose ``"xb"`` write is a conditional (create-if-absent) request.
CONDITIONAL_CREATE_PROTOCOLS = frozenset({"s3"})
#: fsspec protocols of object stores (an object appears whole when its upload completes).
OBJECT_STORE_PROTOCOLS = frozenset({"s3", "abfs", "gcs"})


#: fsspec protocols whose filesystem object must not be used by two threads at once: fsspec's sftp
#: shares one paramiko SFTP session between them, and concurrent requests on it hang.
SERIAL_PROTOCOLS = frozenset({"sftp"})

_locks: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def _lock_for(fs: Any) -> threading.RLock:
    """The lock of one fsspec filesystem object (fsspec hands out one object per set of arguments)."""
    with _locks_guard:
        lock = _locks.get(fs)
        if lock is None:
            lock = _locks[fs] = threading.RLock()
        return lock


def install_hint(scheme: FsspecScheme) -> str:
    return f"pip install 'snapcoord-spark[{scheme.extra}]'"


def open_fsspec(location: str, scheme: FsspecScheme, storage_options: dict[str, Any]) -> Storage:
    """The ``Storage`` at ``location`` through fsspec's ``scheme.protocol``; ``UnsupportedLocation`` when
    the library that reaches it is not installed (the message names the extra)."""
    missing = [m for m in ("fsspec", scheme.module) if importlib.util.find_spec(m) is None]
    if missing:
        raise UnsupportedLocation(
            f"{location!r}: reaching {urlparse(location).scheme}:// without Spark's JVM needs "
            f"{' and '.join(missing)}: {install_hint(scheme)}"
        )
    import fsspec

    url = f"{scheme.protocol}://{location.split('://', 1)[1]}"
    try:
        # Some filesystems (sftp) connect here; others on their first request.
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
    except (ValueError, TypeError) as e:
        raise UnsupportedLocation(f"{location!r}: {scheme.module} refuses it: {e}") from e
    except Exception as e:
        raise StorageError(f"{location!r}: cannot reach the store: {type(e).__name__}: {e}") from e
    if scheme.protocol == "sftp":
        root = "/" + str(root).lstrip("/")  # sftp paths are absolute from the server's root
    return FsspecStorage(fs, scheme.protocol, str(root).rstrip("/"), location.rstrip("/"))


def _missing(e: BaseException) -> bool:
    return isinstance(e, FileNotFoundError) or (isinstance(e, OSError) and e.errno == 2)


def _precondition_failed(e: BaseException) -> bool:
    """Whether ``e`` (or an error it was raised from) is an HTTP 412 answer to a conditional request.

    s3fs raises ``FileExistsError`` for it only when the store names the failed condition (AWS does);
    other S3 servers (SeaweedFS) answer a bare ``PreconditionFailed``, which s3fs turns into EINVAL.
    """
    seen: BaseException | None = e
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            error = response.get("Error", {})
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if error.get("Code") == "PreconditionFailed" or status == 412:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


class FsspecStorage:
    """``Storage`` over an fsspec filesystem ``fs`` below ``root`` (a path in ``fs``'s own terms);
    ``location`` is the URI as the caller gave it, used for ``uri()`` and messages."""

    def __init__(self, fs: Any, protocol: str, root: str, location: str) -> None:
        self._fs = fs
        self.protocol = protocol
        self._root = root
        self._location = location
        self._object_store = protocol in OBJECT_STORE_PROTOCOLS
        self.atomic_exclusive: bool = protocol in CONDITIONAL_CREATE_PROTOCOLS
        self._lock: contextlib.AbstractContextManager[Any] = (
            _lock_for(fs) if protocol in SERIAL_PROTOCOLS else contextlib.nullcontext()
        )

    def __repr__(self) -> str:
        return f"FsspecStorage({self._location!r}, {type(self._fs).__name__})"

    @property
    def location(self) -> str:
        return self._location

    def uri(self, path: str = "") -> str:
        rel = clean_path(path)
        return f"{self._location}/{rel}" if rel else self._location

    def _path(self, path: str) -> str:
        rel = clean_path(path)
        return f"{self._root}/{rel}" if rel else self._root

    @contextlib.contextmanager
    def _errors(self, what: str, path: str) -> Iterator[None]:
        """One call to the store, serialised where the filesystem object is not thread-safe; its errors
        as ``FileNotFoundError``/``FileExistsError`` or ``StorageError`` naming the URI."""
        try:
            with self._lock:
                yield
        except (FileNotFoundError, FileExistsError, IsADirectoryError, ValueError):
            raise
        except OSError as e:
            if _missing(e):
                raise FileNotFoundError(f"{what} {self.uri(path)}: {e}") from e
            raise StorageError(f"{what} {self.uri(path)}: {type(e).__name__}: {e}") from e
        except Exception as e:  # botocore, paramiko and aiohttp errors have no common root
            raise StorageError(f"{what} {self.uri(path)}: {type(e).__name__}: {e}") from e

    # -- reads -------------------------------------------------------------------------------------------
    def list(self, path: str = "") -> list[Entry]:
        target = self._path(path)
        try:
            with self._errors("list", path):
                self._invalidate(path)
                infos = self._fs.ls(target, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for info in infos:
            full = str(info["name"])
            name = full.rstrip("/").rpartition("/")[2]
            is_dir = info["type"] == "directory"
            if not is_dir and full.rstrip("/") == target.rstrip("/"):
                if full.endswith("/"):
                    # S3's directory marker (an empty ``path/`` object: S3A keeps one for every
                    # directory it makes, as consoles do for folders): not a file, and not listed.
                    continue
                return []  # ``path`` is a file: nothing is below it
            out.append(Entry(name, is_dir, 0 if is_dir else int(info.get("size") or 0)))
        return sorted(out, key=lambda e: e.name)

    def exists(self, path: str) -> bool:
        with self._errors("exists", path):
            self._invalidate(path)
            return bool(self._fs.exists(self._path(path)))

    def size(self, path: str) -> int:
        with self._errors("size", path):
            self._invalidate(path)
            info = self._fs.info(self._path(path))
        return int(info.get("size") or 0)

    def read_bytes(self, path: str) -> bytes:
        with self._errors("read", path):
            return bytes(self._fs.cat_file(self._path(path)))

    def read_chunks(self, path: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        with self._errors("read", path):
            f = self._fs.open(self._path(path), "rb", block_size=max(chunk_bytes, 1 << 16))
            if self.protocol == "sftp":
                # paramiko asks for 32 KiB per round trip; prefetching keeps many requests in flight.
                f.prefetch()
        try:
            while True:
                with self._errors("read", path):
                    chunk = f.read(chunk_bytes)
                if not chunk:
                    return
                yield bytes(chunk)
        finally:
            with contextlib.suppress(Exception), self._lock:
                f.close()

    def _invalidate(self, path: str) -> None:
        """Forget fsspec's listing cache: another writer may have changed the store since."""
        with contextlib.suppress(Exception):
            self._fs.invalidate_cache(self._path(path))

    # -- writes ------------------------------------------------------------------------------------------
    def _upload(self, target: str, chunks: Iterable[bytes], mode: str) -> None:
        f = self._fs.open(target, mode)
        if self.protocol == "sftp":
            # paramiko waits for each write's acknowledgement unless pipelined; errors then surface at
            # close, which this method always reaches before the write counts as done.
            f.set_pipelined(True)
        try:
            for chunk in chunks:
                f.write(chunk)
        except BaseException:
            # Closing would publish the partial object on an object store: abort its upload instead
            # (a temporary file on a file system is the caller's to remove).
            with contextlib.suppress(Exception):
                if self._object_store:
                    f.discard()
                    f.closed = True
                else:
                    f.close()
            raise
        f.close()

    def _write(
        self, path: str, chunks: Iterable[bytes], *, exclusive: bool, data: bytes | None = None
    ) -> None:
        if not clean_path(path):
            raise ValueError("a write needs a file path below the root")
        target = self._path(path)
        with self._errors("exclusive write" if exclusive else "write", path):
            self._invalidate(path)
            if self._object_store:
                if exclusive and not self.atomic_exclusive and self._fs.exists(target):
                    raise FileExistsError(f"exclusive write {self.uri(path)}: the object exists")
                try:
                    if data is not None and self.protocol == "s3":
                        # One PUT, with If-None-Match: * when exclusive (s3fs's "xb" mode skips the
                        # condition for an empty object).
                        self._fs.pipe_file(target, data, mode="create" if exclusive else "overwrite")
                    else:
                        self._upload(target, chunks, "xb" if exclusive and self.atomic_exclusive else "wb")
                except OSError as e:
                    if exclusive and _precondition_failed(e):
                        raise FileExistsError(f"exclusive write {self.uri(path)}: the object exists") from e
                    raise
                return
            parent, _, name = target.rpartition("/")
            if exclusive and self._fs.exists(target):
                raise FileExistsError(f"exclusive write {self.uri(path)}: the object exists")
            self._fs.makedirs(parent, exist_ok=True)
            temp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
            try:
                self._upload(temp, chunks, "wb")
                self._rename_into_place(temp, target, path, exclusive=exclusive)
            finally:
                with contextlib.suppress(Exception):
                    if self._fs.exists(temp):
                        self._fs.rm_file(temp)

    def _rename_into_place(self, temp: str, target: str, path: str, *, exclusive: bool) -> None:
        try:
            self._fs.mv(temp, target)
            return
        except OSError:
            if not self._fs.exists(target):
                raise
        # The target exists: a plain SFTP rename never overwrites (OpenSSH links, then unlinks).
        if exclusive:
            raise FileExistsError(f"exclusive write {self.uri(path)}: the object exists")
        self._fs.rm_file(target)
        self._fs.mv(temp, target)

    def write_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        self._write(path, [data], exclusive=exclusive, data=data)

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        self._write(path, chunks, exclusive=False)

    def delete(self, path: str) -> bool:
        target = self._path(path)
        with self._errors("delete", path):
            self._invalidate(path)
            try:
                info = self._fs.info(target)
            except FileNotFoundError:
                return False
            if info["type"] == "directory":
                raise IsADirectoryError(f"delete {self.uri(path)}: a directory (use delete_tree)")
            self._fs.rm_file(target)
        return True

    def delete_tree(self, path: str) -> None:
        target = self._path(path)
        with self._errors("delete tree", path):
            self._invalidate(path)
            if self._fs.exists(target):
                self._fs.rm(target, recursive=True)

    def download(self, path: str, local_file: str | os.PathLike[str]) -> None:
        download_by_chunks(self, path, local_file)

    def upload(self, local_file: str | os.PathLike[str], path: str) -> None:
        self.write_chunks(path, local_file_chunks(local_file, COPY_CHUNK_BYTES))

    def child(self, path: str) -> Storage:
        rel = clean_path(path)
        if not rel:
            return self
        return FsspecStorage(self._fs, self.protocol, self._path(rel), self.uri(rel))
