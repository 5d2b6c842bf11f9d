"""A local (or mounted) directory as a ``Storage``.

Writes go to a temporary file next to the target, are fsynced, and then appear whole: ``os.replace``
for a plain write, ``os.link`` for an exclusive one (a link fails when the name exists, atomically, and
the object appears with all of its bytes). The directory is fsynced after a name appears or goes, so
an acknowledged write or delete survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from snapcoord.spark_connector.storage.base import (
    COPY_CHUNK_BYTES,
    Entry,
    Storage,
    clean_path,
    download_by_chunks,
    local_file_chunks,
)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage:
    """``Storage`` over the local directory ``root`` (absolute; need not exist yet)."""

    atomic_exclusive = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    @property
    def location(self) -> str:
        return self.root.as_uri()

    def _path(self, path: str) -> Path:
        rel = clean_path(path)
        return self.root / rel if rel else self.root

    def uri(self, path: str = "") -> str:
        return self._path(path).as_uri()

    def list(self, path: str = "") -> list[Entry]:
        directory = self._path(path)
        out: list[Entry] = []
        try:
            with os.scandir(directory) as it:
                for e in it:
                    with contextlib.suppress(FileNotFoundError):  # removed since the listing
                        is_dir = e.is_dir()
                        out.append(Entry(e.name, is_dir, 0 if is_dir else e.stat().st_size))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(out, key=lambda e: e.name)

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def size(self, path: str) -> int:
        return self._path(path).stat().st_size

    def read_bytes(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def read_chunks(self, path: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        with self._path(path).open("rb") as f:
            while chunk := f.read(chunk_bytes):
                yield chunk

    def _write_temp(self, target: Path, chunks: Iterable[bytes]) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        try:
            with temp.open("wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return temp

    def write_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        target = self._path(path)
        temp = self._write_temp(target, [data])
        try:
            if exclusive:
                os.link(temp, target)  # FileExistsError when the name exists
            else:
                os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        _fsync_dir(target.parent)

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        target = self._path(path)
        temp = self._write_temp(target, chunks)
        try:
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)
        _fsync_dir(target.parent)

    def delete(self, path: str) -> bool:
        target = self._path(path)
        try:
            target.unlink()
        except FileNotFoundError:
            return False
        _fsync_dir(target.parent)
        return True

    def delete_tree(self, path: str) -> None:
        target = self._path(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)

    def download(self, path: str, local_file: str | os.PathLike[str]) -> None:
        download_by_chunks(self, path, local_file)

    def upload(self, local_file: str | os.PathLike[str], path: str) -> None:
        self.write_chunks(path, local_file_chunks(local_file, COPY_CHUNK_BYTES))

    def child(self, path: str) -> Storage:
        return LocalStorage(self._path(path))
