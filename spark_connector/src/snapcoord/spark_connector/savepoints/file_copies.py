"""Copying a checkpoint's files several at a time while its archive stream stays in order.

An archive (``checkpoint_archive``) is one ordered stream of files. On an object store each file also
costs round trips of its own (a status, then a GET; or the checks before a PUT, then the PUT), so a cut
of many RocksDB files copied one after the other spends much of its time waiting on them. Where the
store serves several requests at once (``storage.copy_concurrency`` above 1), both directions overlap
them, through a local spool directory:

- ``read_ahead`` downloads the next files of a cut in worker threads while the stream sends the
  current one, and hands out each file's local copy in the cut's order. A file that is gone raises its
  ``FileNotFoundError`` where the stream reaches it, as a read one file at a time would; the caller
  still checks every file against its listed size;
- ``SpooledWrites`` takes each archive member whole into a spool file (the stream must be read in
  order) and uploads it in a worker thread. Leaving it normally waits for every upload and raises the
  first that failed; leaving it with an error drops the uploads not yet started and waits for the ones
  running. Either way no upload is still running when the block is left, so whatever the caller does
  next (the completion point, or removing an abandoned restore) comes after every write it started.

At most ``concurrency`` files are spooled at once (being copied or waiting for their turn; one more
while ``SpooledWrites`` takes in the next), so the local disk holds about that many files of the
checkpoint.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections import deque
from collections.abc import Generator, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from snapcoord.spark_connector.storage import Storage


def read_ahead(storage: Storage, paths: Sequence[str], concurrency: int) -> Generator[Path, None, None]:
    """The local copy of each file of ``paths``, in order, downloaded up to ``concurrency`` files
    ahead. Each copy is removed when the next one is asked for (read it before that)."""
    with tempfile.TemporaryDirectory(prefix="snapcoord-cut-") as spool:
        pool = ThreadPoolExecutor(concurrency, thread_name_prefix="snapcoord-read-ahead")
        fetching: dict[int, Future[Path]] = {}

        def fetch(i: int) -> Path:
            local = Path(spool) / str(i)
            storage.download(paths[i], local)
            return local

        try:
            for i in range(len(paths)):
                for j in range(i, min(i + concurrency, len(paths))):
                    if j not in fetching:
                        fetching[j] = pool.submit(fetch, j)
                local = fetching.pop(i).result()
                try:
                    yield local
                finally:
                    local.unlink(missing_ok=True)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


class SpooledWrites:
    """Writes of whole files into ``target``, up to ``concurrency`` at once (see the module
    docstring); ``concurrency`` 1 writes each file in the caller's thread, with nothing spooled."""

    def __init__(self, target: Storage, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self._target = target
        self._concurrency = concurrency
        self._running: deque[Future[None]] = deque()
        self._stack = contextlib.ExitStack()
        self._spool: Path | None = None
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> SpooledWrites:
        if self._concurrency > 1:
            self._spool = Path(
                self._stack.enter_context(tempfile.TemporaryDirectory(prefix="snapcoord-restore-"))
            )
            self._pool = ThreadPoolExecutor(self._concurrency, thread_name_prefix="snapcoord-write")
        return self

    def write(self, path: str, chunks: Iterable[bytes]) -> None:
        """Write the file ``path`` from ``chunks`` (consumed before this returns)."""
        if self._pool is None or self._spool is None:
            self._target.write_chunks(path, chunks)
            return
        while len(self._running) >= self._concurrency:
            self._running.popleft().result()  # the oldest: raises its error here, early
        local = self._spool / uuid.uuid4().hex
        with local.open("wb") as f:
            for chunk in chunks:
                f.write(chunk)
        self._running.append(self._pool.submit(self._upload, local, path))

    def _upload(self, local: Path, path: str) -> None:
        try:
            self._target.upload(local, path)
        finally:
            local.unlink(missing_ok=True)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._pool is not None:
                if error is not None:
                    for future in self._running:
                        future.cancel()
                self._pool.shutdown(wait=True)  # none left running, whatever happens next
                if error is None:
                    for future in self._running:
                        future.result()  # the first failure, in write order
        finally:
            self._running.clear()
            self._stack.close()
