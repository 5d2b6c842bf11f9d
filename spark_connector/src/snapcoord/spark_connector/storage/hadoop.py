"""A location reached through Spark's own Hadoop ``FileSystem``, from the classic PySpark driver (py4j).

The connector opens the location exactly as the query does: ``Path(location).getFileSystem(conf)`` with
the session's Hadoop configuration (``sessionState().newHadoopConf()``: ``spark.hadoop.*`` and the
session's SQL settings applied), so whatever credentials, endpoints and FileSystem classes the query
uses apply here too, with no configuration of the connector's own. A plain path means what it means to
Spark: it is qualified against ``fs.defaultFS``; one that lands on the local filesystem is served by
``LocalStorage`` directly (same files, no JVM round trips, real create-if-absent).

How a whole-object write stays all-or-nothing depends on the store:

- object stores (S3A, GCS and other blob stores without directories) make an object visible only when
  its stream closes, so a write goes straight to its name. Where the FileSystem declares the path
  capability ``fs.option.create.conditional.overwrite`` (S3A from Hadoop 3.4.2 on stores with
  conditional writes, unless ``fs.s3a.create.conditional.enabled`` is false), an exclusive write asks for
  it (``createFile(...).must(...)``): the store checks for an existing object when the upload completes,
  atomically. Elsewhere an exclusive write is ``create(overwrite=false)``, a check and then a write;
- file systems (HDFS, sftp, local, ...) show a file while it is written, so a write goes to a hidden
  temporary name next to the target and is renamed into place. An exclusive write renames without
  overwriting: on HDFS the NameNode refuses a rename onto an existing name atomically; elsewhere the
  check and the rename are two steps (``atomic_exclusive`` is False).

py4j moves a ``byte[]`` at a few MiB/s, so only small objects travel through it: a larger read or
write (``read_chunks``, ``write_chunks``, ``download``, ``upload``) is a copy that the JVM makes itself
between the store and a local (temporary) file.

Java's ``FileNotFoundException`` and ``FileAlreadyExistsException`` become Python's ``FileNotFoundError``
and ``FileExistsError``; other Java errors become ``StorageError`` with the Java class and message.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from snapcoord.spark_connector.storage.base import (
    Entry,
    Storage,
    StorageError,
    UnsupportedLocation,
    clean_path,
    local_file_chunks,
)
from snapcoord.spark_connector.storage.local import LocalStorage

#: FileSystem classes whose exclusive create is atomic against a concurrent writer of the same name.
ATOMIC_EXCLUSIVE_CLASSES = frozenset(
    {
        "org.apache.hadoop.hdfs.DistributedFileSystem",
        "org.apache.hadoop.hdfs.ViewDistributedFileSystem",
    }
)

#: The ``createFile`` option (and path capability) of a create-if-absent checked atomically at close.
CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"

#: How often a plain write deletes the target and renames onto it while other writers recreate it.
_REPLACE_ATTEMPTS = 5

#: Objects larger than this are copied between the JVM and local files rather than sent through py4j.
JVM_COPY_MIN_BYTES = 4 << 20

#: The output stream capability of streams whose upload can be abandoned unpublished.
ABORTABLE_STREAM = "fs.capability.outputstream.abortable"

#: Schemes of blob stores: an object is visible only once its writer closes it, and there is no rename
#: worth the name (S3A, GCS, OSS, COS, OBS copy the bytes).
OBJECT_STORE_SCHEMES = frozenset({"s3a", "s3", "s3n", "gs", "oss", "cosn", "obs"})

#: Files copied at once (``concurrent_copies``) where the FileSystem serves concurrent calls well: the
#: object stores and HDFS. Elsewhere (Hadoop's sftp FileSystem fails under concurrent use) one at a time.
CONCURRENT_COPIES = 8
_CONCURRENT_SCHEMES = OBJECT_STORE_SCHEMES | {"hdfs"}

_NOT_FOUND = "java.io.FileNotFoundException"
_EXISTS = "org.apache.hadoop.fs.FileAlreadyExistsException"
_NO_FILESYSTEM = "org.apache.hadoop.fs.UnsupportedFileSystemException"
#: A scheme whose FileSystem class is configured (core-default.xml names S3AFileSystem for s3a://) but
#: not on the class path: Hadoop wraps it in a RuntimeException.
_NO_CLASS = "java.lang.ClassNotFoundException"
#: The AWS SDK v2's S3 error (``statusCode()`` is the HTTP status), named by suffix: S3A may shade it.
_S3_EXCEPTION = "awssdk.services.s3.model.S3Exception"


class _Jvm:
    """The py4j handles one session gives: the gateway, its ``jvm`` view, the Hadoop configuration."""

    def __init__(self, session: Any) -> None:
        self.gateway = session.sparkContext._gateway
        self.jvm = session._jvm
        self.conf = session._jsparkSession.sessionState().newHadoopConf()

    def path(self, uri: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(uri)

    def is_a(self, java_object: Any, class_name: str) -> bool:
        from py4j.java_gateway import is_instance_of

        return bool(is_instance_of(self.gateway, java_object, class_name))


@contextlib.contextmanager
def _translated(jvm: _Jvm, what: str) -> Iterator[None]:
    """Java errors from the block as Python ones (see the module docstring); ``what`` names the call."""
    from py4j.protocol import Py4JJavaError

    try:
        yield
    except Py4JJavaError as e:
        java = e.java_exception
        message = f"{what}: {java.getClass().getName()}: {java.getMessage()}"
        if jvm.is_a(java, _NOT_FOUND):
            raise FileNotFoundError(message) from None
        if jvm.is_a(java, _EXISTS):
            raise FileExistsError(message) from None
        raise StorageError(message) from e


def open_hadoop(session: Any, location: str) -> Storage:
    """The ``Storage`` at ``location`` through ``session``'s Hadoop FileSystem; a location that Hadoop
    qualifies to the local filesystem is a ``LocalStorage`` (see the module docstring)."""
    storage = hadoop_storage(session, location)
    if storage.scheme == "file":
        return LocalStorage(storage.local_path())
    return storage


def hadoop_storage(session: Any, location: str) -> HadoopStorage:
    """``location`` through Hadoop whatever its scheme, ``file:`` included (``open_hadoop`` hands those
    to ``LocalStorage``; this is for comparing the two)."""
    jvm = _Jvm(session)
    with _unsupported_scheme(jvm, location):
        path = jvm.path(location)
        fs = path.getFileSystem(jvm.conf)
        qualified = fs.makeQualified(path)
    return HadoopStorage(jvm, fs, str(qualified.toString()))


def _caused_by(jvm: _Jvm, java: Any, class_name: str) -> bool:
    """Whether ``java`` or an exception in its cause chain is a ``class_name``."""
    seen = 0
    while java is not None and seen < 16:
        if jvm.is_a(java, class_name):
            return True
        java, seen = java.getCause(), seen + 1
    return False


def _precondition_failed(java: Any) -> bool:
    """Whether ``java`` or an exception in its cause chain is an S3 answer with HTTP status 412."""
    seen = 0
    while java is not None and seen < 16:
        if str(java.getClass().getName()).endswith(_S3_EXCEPTION) and int(java.statusCode()) == 412:
            return True
        java, seen = java.getCause(), seen + 1
    return False


@contextlib.contextmanager
def _unsupported_scheme(jvm: _Jvm, location: str) -> Iterator[None]:
    from py4j.protocol import Py4JJavaError

    try:
        yield
    except Py4JJavaError as e:
        java = e.java_exception
        if jvm.is_a(java, _NO_FILESYSTEM) or _caused_by(jvm, java, _NO_CLASS):
            raise UnsupportedLocation(
                f"{location!r}: Spark's Hadoop configuration has no FileSystem for this scheme "
                f"({java.getMessage()}); put the scheme's Hadoop connector on Spark's class path (for "
                "example hadoop-aws for s3a://, hadoop-azure for abfss://, gcs-connector for gs://) and "
                "configure it as for the query itself"
            ) from None
        raise StorageError(f"opening {location!r}: {java.getClass().getName()}: {java.getMessage()}") from e


class HadoopStorage:
    """``Storage`` over one Hadoop ``FileSystem`` below the qualified URI ``root``."""

    def __init__(self, jvm: _Jvm, fs: Any, root: str) -> None:
        self._jvm = jvm
        self._fs = fs
        self._root = root  # a qualified Path's string: no trailing "/" except for a filesystem's root
        self.fs_class: str = str(fs.getClass().getName())
        self.scheme: str = str(fs.getUri().getScheme() or "").lower()
        self._object_store = self.scheme in OBJECT_STORE_SCHEMES
        self._conditional_create = self._object_store and bool(
            fs.hasPathCapability(jvm.path(root), CONDITIONAL_CREATE)
        )
        self.atomic_exclusive: bool = self.fs_class in ATOMIC_EXCLUSIVE_CLASSES or self._conditional_create
        #: How many files a copy of many files moves at once (``storage.copy_concurrency``).
        self.concurrent_copies: int = CONCURRENT_COPIES if self.scheme in _CONCURRENT_SCHEMES else 1

    def __repr__(self) -> str:
        return f"HadoopStorage({self._root!r}, {self.fs_class})"

    @property
    def location(self) -> str:
        return self._root

    def uri(self, path: str = "") -> str:
        rel = clean_path(path)
        if not rel:
            return self._root
        return f"{self._root.rstrip('/')}/{rel}"

    def local_path(self) -> str:
        """The root's path component (for ``file:`` roots, the local directory)."""
        return str(self._jvm.path(self._root).toUri().getPath())

    def _path(self, path: str) -> Any:
        return self._jvm.path(self.uri(path))

    def _errors(self, what: str, path: str) -> contextlib.AbstractContextManager[None]:
        return _translated(self._jvm, f"{what} {self.uri(path)}")

    # -- reads -------------------------------------------------------------------------------------------
    def list(self, path: str = "") -> list[Entry]:
        target = self._path(path)
        try:
            with self._errors("list", path):
                statuses = self._fs.listStatus(target)
        except FileNotFoundError:
            return []
        out = []
        for status in statuses:
            is_dir = bool(status.isDirectory())
            if not is_dir and str(status.getPath().toUri().getPath()) == str(target.toUri().getPath()):
                return []  # ``path`` is a file: nothing is below it
            out.append(Entry(str(status.getPath().getName()), is_dir, 0 if is_dir else int(status.getLen())))
        return sorted(out, key=lambda e: e.name)

    def exists(self, path: str) -> bool:
        with self._errors("exists", path):
            return bool(self._fs.exists(self._path(path)))

    def size(self, path: str) -> int:
        with self._errors("size", path):
            return int(self._fs.getFileStatus(self._path(path)).getLen())

    def read_bytes(self, path: str) -> bytes:
        with self._errors("read", path):
            stream = self._fs.open(self._path(path))
            try:
                data = self._jvm.jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            finally:
                stream.close()
        return bytes(data)

    def read_chunks(self, path: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        # py4j moves a byte[] at a few MiB/s; a file larger than a few pieces is copied by the JVM to
        # a local temporary file first (tens to hundreds of MiB/s) and streamed from there.
        if self.size(path) > JVM_COPY_MIN_BYTES:
            with tempfile.TemporaryDirectory(prefix="snapcoord-read-") as spool:
                local = Path(spool) / "object"
                self.download(path, local)
                yield from local_file_chunks(local, chunk_bytes)
            return
        with self._errors("read", path):
            stream = self._fs.open(self._path(path))
        try:
            while True:
                with self._errors("read", path):
                    chunk = stream.readNBytes(chunk_bytes)  # up to chunk_bytes; empty at the end
                if not chunk:
                    return
                yield bytes(chunk)
        finally:
            with contextlib.suppress(Exception):
                stream.close()

    def download(self, path: str, local_file: str | os.PathLike[str]) -> None:
        target = Path(local_file).absolute()
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
        try:
            with self._errors("download", path):
                # useRawLocalFileSystem=True: no .crc file next to the copy.
                self._fs.copyToLocalFile(False, self._path(path), self._jvm.path(temp.as_uri()), True)
            os.replace(temp, target)
        finally:
            temp.unlink(missing_ok=True)

    # -- writes ------------------------------------------------------------------------------------------
    def _create(self, target: Any, *, overwrite: bool) -> Any:
        if overwrite or not self._conditional_create:
            return self._fs.create(target, overwrite)
        return self._fs.createFile(target).overwrite(False).must(CONDITIONAL_CREATE, True).build()

    def _stream_to(self, chunks: Iterable[bytes]) -> Callable[[Any, bool], None]:
        """A ``fill`` for ``_write`` that sends ``chunks`` through py4j (for small objects)."""

        def fill(target: Any, overwrite: bool) -> None:
            out = self._create(target, overwrite=overwrite)
            try:
                for chunk in chunks:
                    if chunk:
                        out.write(bytearray(chunk))
            except BaseException:
                self._abandon(out, target)
                raise
            out.close()

        return fill

    def _copy_from(self, local_file: Path) -> Callable[[Any, bool], None]:
        """A ``fill`` for ``_write`` in which the JVM reads the local file itself."""

        def fill(target: Any, overwrite: bool) -> None:
            self._fs.copyFromLocalFile(
                False, overwrite, self._jvm.path(local_file.absolute().as_uri()), target
            )

        return fill

    def _abandon(self, out: Any, target: Any) -> None:
        """End a stream whose write failed part way, without leaving its partial bytes visible.

        A temporary file is the caller's to remove. On an object store, closing would publish the
        partial object: it is aborted where the stream can be; otherwise it is closed and, only if the
        close succeeded (the object is then ours, not a concurrent writer's), deleted.
        """
        if not self._object_store:
            with contextlib.suppress(Exception):
                out.close()
            return
        with contextlib.suppress(Exception):
            if out.hasCapability(ABORTABLE_STREAM):
                out.abort()
                return
        try:
            out.close()
        except Exception:
            return  # nothing of ours became visible
        with contextlib.suppress(Exception):
            self._fs.delete(target, False)

    def _temp_for(self, path: str) -> Any:
        rel = clean_path(path)
        parent, _, name = rel.rpartition("/")
        temp = f".{name}.{uuid.uuid4().hex}.tmp"
        return self._path(f"{parent}/{temp}" if parent else temp)

    def _write(self, path: str, fill: Callable[[Any, bool], None], *, exclusive: bool) -> None:
        """Write the object ``path`` with ``fill(target, overwrite)``, which creates ``target`` whole
        (see the module docstring for where ``target`` is and how it becomes ``path``)."""
        if not clean_path(path):
            raise ValueError("a write needs a file path below the root")
        target = self._path(path)
        with self._errors("exclusive write" if exclusive else "write", path):
            if self._object_store:
                with self._lost_condition(path, exclusive=exclusive):
                    fill(target, not exclusive)
                return
            if exclusive and self._fs.exists(target):
                raise FileExistsError(f"exclusive write {self.uri(path)}: the object exists")
            temp = self._temp_for(path)
            try:
                fill(temp, False)
                self._rename_into_place(temp, target, path, exclusive=exclusive)
            finally:
                with contextlib.suppress(Exception):
                    self._fs.delete(temp, False)

    @contextlib.contextmanager
    def _lost_condition(self, path: str, *, exclusive: bool) -> Iterator[None]:
        """A conditional create that found the object as ``FileExistsError``: S3A reports the store's
        refusal (HTTP 412 Precondition Failed, at the upload's close) as a ``RemoteFileChangedException``
        wrapping the SDK's ``S3Exception``, not as ``FileAlreadyExistsException``."""
        from py4j.protocol import Py4JJavaError

        try:
            yield
        except Py4JJavaError as e:
            if exclusive and self._conditional_create and _precondition_failed(e.java_exception):
                raise FileExistsError(f"exclusive write {self.uri(path)}: the object exists") from None
            raise

    def _rename_into_place(self, temp: Any, target: Any, path: str, *, exclusive: bool) -> None:
        if self._renamed(temp, target):
            return
        if exclusive:
            raise FileExistsError(f"exclusive write {self.uri(path)}: the object exists")
        # A plain write replaces the object; rename does not overwrite on most FileSystems, so the
        # old object goes first (a reader in between sees none, which the interface allows). Another
        # writer may put the name back between the delete and the rename: the last write wins, so
        # delete again and retry, a bounded number of times.
        for _ in range(_REPLACE_ATTEMPTS):
            self._fs.delete(target, False)
            if self._renamed(temp, target):
                return
        raise StorageError(f"write {self.uri(path)}: could not rename the written file into place")

    def _renamed(self, temp: Any, target: Any) -> bool:
        """Rename without overwriting; False when the target exists."""
        from py4j.protocol import Py4JJavaError

        try:
            return bool(self._fs.rename(temp, target))
        except Py4JJavaError:
            # Some FileSystems (sftp) raise instead of returning False when the target exists.
            if not self._fs.exists(target):
                raise
            return False

    def write_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        if len(data) > JVM_COPY_MIN_BYTES and not exclusive:
            self.write_chunks(path, [data])
            return
        self._write(path, self._stream_to([data]), exclusive=exclusive)

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        # Spooled to a local temporary file that the JVM then copies: py4j moves bytes slowly.
        with tempfile.TemporaryDirectory(prefix="snapcoord-write-") as spool:
            local = Path(spool) / "object"
            with local.open("wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            self.upload(local, path)

    def upload(self, local_file: str | os.PathLike[str], path: str) -> None:
        self._write(path, self._copy_from(Path(local_file)), exclusive=False)

    def delete(self, path: str) -> bool:
        target = self._path(path)
        try:
            with self._errors("delete", path):
                status = self._fs.getFileStatus(target)
        except FileNotFoundError:
            return False
        with self._errors("delete", path):
            if status.isDirectory():
                raise IsADirectoryError(f"delete {self.uri(path)}: a directory (use delete_tree)")
            return bool(self._fs.delete(target, False))

    def delete_tree(self, path: str) -> None:
        with self._errors("delete tree", path):
            self._fs.delete(self._path(path), True)

    def child(self, path: str) -> Storage:
        return HadoopStorage(self._jvm, self._fs, self.uri(path))
