"""Fresh directories for a test, on the local disk or on a test server, handed out alike.

A ``TestDir`` is what a test gives the code under test (``uri``: a plain local path, or an ``sftp://``,
``s3a://`` or ``hdfs://`` URI that Spark's Hadoop configuration reaches) together with a ``Storage`` on
the same directory (``storage``), for the test's own inspection and for planting files. That view never
goes through the Hadoop FileSystem the code under test uses: it is a ``LocalStorage`` on the server's
side for local and sftp directories, s3fs for s3a (``harness.s3a``), WebHDFS for hdfs (``harness.hdfs``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.isolation import unique_name
from harness.sshd import SshServer
from snapcoord.spark_connector.storage import LocalStorage, Storage, clean_path

#: The kinds ``test_dir`` makes, for ``pytest.mark.parametrize`` / fixture params.
KINDS = ("local", "sftp", "s3a", "hdfs")

#: The fixture (tests/spark_connector/conftest.py) that makes a ``TestDir`` of each kind.
FIXTURE_OF_KIND = {"local": "local_dir", "sftp": "remote", "s3a": "s3a_dir", "hdfs": "hdfs_dir"}


@dataclass(frozen=True)
class TestDir:
    """One fresh directory: ``uri`` for Spark and the connector, ``storage`` to look at it directly."""

    __test__ = False  # not a test class, despite its name

    kind: str
    uri: str
    storage: Storage

    def uri_of(self, path: str) -> str:
        """The URI of ``path`` (relative, ``/``-separated) below this directory."""
        rel = clean_path(path)
        return f"{self.uri.rstrip('/')}/{rel}" if rel else self.uri


@contextmanager
def local_dir(base: Path, test_name: str) -> Iterator[TestDir]:
    """A fresh directory below ``base`` (a test's tmp_path), named by its absolute path."""
    path = base / unique_name(test_name)
    path.mkdir(parents=True)
    yield TestDir("local", str(path), LocalStorage(path))


@contextmanager
def sftp_dir(server: SshServer, test_name: str) -> Iterator[TestDir]:
    """A fresh directory ``/t/<test>-<uuid8>`` on ``server``; removed with its contents afterwards."""
    remote = f"t/{unique_name(test_name)}"
    backing = server.local_path(remote)
    backing.mkdir(parents=True)
    try:
        yield TestDir("sftp", server.uri(remote), LocalStorage(backing))
    finally:
        shutil.rmtree(backing, ignore_errors=True)
