"""Storage whose calls are steps of a race (``scheduler.Gate``), interposed where the backend calls its
store, so that a race replays the real backend's calls in a chosen order.

- ``HadoopStorage``: its Hadoop ``FileSystem`` handle is replaced by a proxy that takes a step before
  each call that reaches the store (``exists``, ``create``, ``rename``, ``listStatus``, ...), and a
  stream it creates takes one before ``close`` (where an object store uploads the object). So an
  exclusive write on sftp is the backend's own ``exists``, then the write of its temporary file, then
  ``rename``, each a step; on
  S3A without conditional create it is ``create(overwrite=false)`` (S3A checks there) and the
  stream's ``close`` (the PUT). A check and a write inside one call (Hadoop's sftp ``rename`` checks
  the target, then posix-renames over it) stay one step: the harness cannot see between them.
- ``FsspecStorage``: its fsspec filesystem is replaced the same way (``exists``, ``open``, ``mv``, ...).
- any other ``Storage`` (``LocalStorage``): each ``Storage`` call is one step; the local store's exclusive
  write is one ``link`` system call, atomic, so there is nothing finer to interleave.

Each actor gets a ``Storage`` of its own (as two drivers have), so no lock inside one backend object
(fsspec's sftp lock) is shared by two actors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from snapcoord.spark_connector.storage import Entry, Storage
from snapcoord.spark_connector.storage.fsspec_storage import FsspecStorage
from snapcoord.spark_connector.storage.hadoop import HadoopStorage

from .scheduler import Gate

#: Hadoop ``FileSystem`` methods that reach the store.
HADOOP_CALLS = frozenset(
    {"exists", "getFileStatus", "listStatus", "open", "create", "createFile", "rename", "delete", "mkdirs"}
)
#: fsspec filesystem methods that reach the store.
FSSPEC_CALLS = frozenset({"exists", "info", "ls", "cat_file", "open", "makedirs", "mv", "rm_file", "rm"})


class _GatedHandle:
    """A backend object whose methods in ``calls`` take a step first; what ``create`` returns (a
    stream) takes a step before ``close``."""

    def __init__(self, target: Any, gate: Gate, calls: frozenset[str], kind: str) -> None:
        self._target = target
        self._gate = gate
        self._calls = calls
        self._kind = kind

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name not in self._calls:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._gate.step(f"{self._kind}.{name}")
            result = attr(*args, **kwargs)
            if name == "create":
                return _GatedHandle(result, self._gate, frozenset({"close"}), f"{self._kind}.stream")
            return result

        return call


def gated(storage: Storage, gate: Gate) -> Storage:
    """``storage`` with its store calls turned into steps of ``gate``'s actor (see the module docstring).
    The backend object is modified in place: ``storage`` must be this actor's own."""
    if isinstance(storage, HadoopStorage):
        storage._fs = _GatedHandle(storage._fs, gate, HADOOP_CALLS, "hadoop")
        return storage
    if isinstance(storage, FsspecStorage):
        storage._fs = _GatedHandle(storage._fs, gate, FSSPEC_CALLS, "fsspec")
        # The backend serialises one process's calls on one fsspec filesystem with a lock, and fsspec's
        # filesystems of equal arguments compare equal, so both actors' storages would share it: an
        # actor waiting at its gate inside a call would block the other. Two drivers are two
        # processes, each with its own lock.
        storage._lock = threading.RLock()
        return storage
    return GatedStorage(storage, gate)


class GatedStorage:
    """Any ``Storage``, each call one step."""

    def __init__(self, inner: Storage, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def _step(self, what: str) -> None:
        self._gate.step(f"storage.{what}")

    @property
    def location(self) -> str:
        return self._inner.location

    @property
    def atomic_exclusive(self) -> bool:
        return self._inner.atomic_exclusive

    def uri(self, path: str = "") -> str:
        return self._inner.uri(path)

    def list(self, path: str = "") -> list[Entry]:
        self._step("list")
        return self._inner.list(path)

    def exists(self, path: str) -> bool:
        self._step("exists")
        return self._inner.exists(path)

    def size(self, path: str) -> int:
        self._step("size")
        return self._inner.size(path)

    def read_bytes(self, path: str) -> bytes:
        self._step("read_bytes")
        return self._inner.read_bytes(path)

    def read_chunks(self, path: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        self._step("read_chunks")
        return self._inner.read_chunks(path, chunk_bytes)

    def write_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        self._step("write_bytes(exclusive)" if exclusive else "write_bytes")
        self._inner.write_bytes(path, data, exclusive=exclusive)

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        self._step("write_chunks")
        self._inner.write_chunks(path, chunks)

    def delete(self, path: str) -> bool:
        self._step("delete")
        return self._inner.delete(path)

    def delete_tree(self, path: str) -> None:
        self._step("delete_tree")
        self._inner.delete_tree(path)

    def download(self, path: str, local_file: Any) -> None:
        self._step("download")
        self._inner.download(path, local_file)

    def upload(self, local_file: Any, path: str) -> None:
        self._step("upload")
        self._inner.upload(local_file, path)

    def child(self, path: str) -> Storage:
        return GatedStorage(self._inner.child(path), self._gate)


#: Opens a fresh ``Storage`` of one store on a table directory (relative to the store's root), one
#: per actor and per run: the parameter that makes a race run on another store.
StorageFactory = Callable[[str], Storage]
