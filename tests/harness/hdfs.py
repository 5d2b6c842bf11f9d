"""A real HDFS for Spark tests: a NameNode and a DataNode in one JVM (Hadoop's ``MiniDFSCluster``).

The jars are the set ``hdfs`` (``scripts/maven/hdfs.txt``: ``hadoop-client-minicluster`` of the Hadoop
version PySpark ships). Its entry point ``org.apache.hadoop.mapreduce.MiniHadoopClusterManager`` with
``-nomr`` starts only the HDFS part and writes a small JSON file once the DataNode has registered,
which is the readiness signal; every listener is on 127.0.0.1 (MiniDFSCluster's default host), the
NameNode's RPC port is chosen here so ``hdfs://127.0.0.1:PORT/`` is known before the start.

Spark needs no settings for it: ``DistributedFileSystem`` is in the ``hadoop-client-api`` jar PySpark
ships and the URI names the NameNode. The test's own view of a directory (``WebHdfsStorage``) goes
through the NameNode's WebHDFS REST API over plain HTTP, not through the Hadoop client the code under
test uses. A missing jar set or a cluster that does not come up fails the test with the log's tail.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.isolation import unique_name
from harness.jars import class_path
from harness.locations import TestDir
from harness.ports import LOOPBACK, free_port
from harness.process import (
    HarnessError,
    ManagedProcess,
    PortInUseError,
    ServerProcess,
    wait_until,
)
from snapcoord.spark_connector.storage import Entry, clean_path

MAIN_CLASS = "org.apache.hadoop.mapreduce.MiniHadoopClusterManager"
USER = "root"


class HdfsCluster(ServerProcess):
    """``MiniHadoopClusterManager -nomr`` on loopback: ``uri()`` for Spark, ``storage()`` for the test."""

    stop_timeout_s = 30.0

    def __init__(self, workdir: Path, *, datanodes: int = 1, start_timeout_s: float = 240.0) -> None:
        self.workdir = Path(workdir)
        self.log_path = self.workdir / "hdfs.log"
        self.details_path = self.workdir / "details.json"
        self.datanodes = datanodes
        self.start_timeout_s = start_timeout_s
        self.port: int | None = None
        self.http_port: int | None = None
        self._proc: ManagedProcess | None = None

    def uri(self, path: str = "") -> str:
        """``hdfs://127.0.0.1:PORT/path``."""
        if self.port is None:
            raise HarnessError("the HDFS minicluster has not started")
        return f"hdfs://{LOOPBACK}:{self.port}/{clean_path(path)}"

    def storage(self, path: str) -> WebHdfsStorage:
        """The directory ``path`` as the test sees it: through WebHDFS (see the module docstring)."""
        if self.http_port is None:
            raise HarnessError("the HDFS minicluster has not started")
        return WebHdfsStorage(f"http://{LOOPBACK}:{self.http_port}", self.uri(), clean_path(path))

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> HdfsCluster:
        if self.running:
            raise HarnessError(f"HDFS on {self.uri()} is already running")
        jars = class_path("hdfs")  # fails with the command that fetches the set
        for attempt in range(1, 4):
            self.port, self.http_port = free_port(), free_port()
            try:
                self._start_once(jars)
                return self
            except PortInUseError:
                if attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, jars: str) -> None:
        self.details_path.unlink(missing_ok=True)
        data = self.workdir / "data"
        argv = [
            "java", "-Xms64m", "-Xmx384m", "-cp", jars, MAIN_CLASS,
            "-nomr", "-format", "-datanodes", str(self.datanodes),
            "-nnport", str(self.port), "-nnhttpport", str(self.http_port),
            "-writeDetails", str(self.details_path),
            "-D", f"hdfs.minidfs.basedir={data}",
            "-D", "dfs.permissions.enabled=false",
            "-D", "dfs.replication=1",
        ]  # fmt: skip
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proc = ManagedProcess(argv, log_path=self.log_path, cwd=self.workdir, name=f"hdfs:{self.port}")
        proc = self._proc

        def ready() -> bool:
            if not proc.alive():
                output = proc.output()
                error = self._start_error(f"exited with code {proc.returncode} during start")
                if "BindException" in output or "Address already in use" in output:
                    raise PortInUseError(str(error))
                raise error
            return self.details_path.is_file() and self.details_path.stat().st_size > 0

        try:
            wait_until(ready, timeout=self.start_timeout_s, interval=0.2, what="the HDFS minicluster")
        except TimeoutError:
            self.stop()
            raise self._start_error(f"not ready after {self.start_timeout_s:.0f}s") from None
        except BaseException:
            self.stop()
            raise

    def _describe(self) -> str:
        return f"HDFS minicluster (NameNode {LOOPBACK}:{self.port})"

    def __repr__(self) -> str:
        return f"HdfsCluster({self.port and self.uri()}, {'running' if self.running else 'stopped'})"


class WebHdfsStorage:
    """``Storage`` on one HDFS directory through WebHDFS (NameNode ``http_base``), for a test's own
    inspection and planting. Its exclusive write is WebHDFS's ``overwrite=false`` create."""

    atomic_exclusive = True

    def __init__(self, http_base: str, hdfs_root: str, root: str) -> None:
        self._http = http_base
        self._hdfs_root = hdfs_root.rstrip("/")
        self._root = root

    @property
    def location(self) -> str:
        return f"{self._hdfs_root}/{self._root}"

    def _abs(self, path: str) -> str:
        rel = clean_path(path)
        return "/" + "/".join(p for p in (self._root, rel) if p)

    def uri(self, path: str = "") -> str:
        return f"{self._hdfs_root}{self._abs(path)}"

    def _url(self, path: str, op: str, **params: str) -> str:
        query = urllib.parse.urlencode({"op": op, "user.name": USER, **params})
        return f"{self._http}/webhdfs/v1{urllib.parse.quote(self._abs(path))}?{query}"

    def _call(self, method: str, url: str, data: bytes | None = None) -> bytes:
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            if e.code == 404:
                raise FileNotFoundError(f"{method} {url}: {text}") from None
            if "FileAlreadyExistsException" in text:
                raise FileExistsError(f"{method} {url}: {text}") from None
            raise OSError(f"WebHDFS {method} {url}: HTTP {e.code}: {text}") from None

    def _json(self, method: str, path: str, op: str, **params: str) -> Any:
        return json.loads(self._call(method, self._url(path, op, **params)) or b"{}")

    # -- reads -------------------------------------------------------------------------------------------
    def list(self, path: str = "") -> list[Entry]:
        try:
            statuses = self._json("GET", path, "LISTSTATUS")["FileStatuses"]["FileStatus"]
        except FileNotFoundError:
            return []
        if len(statuses) == 1 and statuses[0]["pathSuffix"] == "" and statuses[0]["type"] == "FILE":
            return []
        return sorted(
            (Entry(s["pathSuffix"], s["type"] == "DIRECTORY", int(s["length"])) for s in statuses),
            key=lambda e: e.name,
        )

    def exists(self, path: str) -> bool:
        try:
            self._json("GET", path, "GETFILESTATUS")
        except FileNotFoundError:
            return False
        return True

    def size(self, path: str) -> int:
        return int(self._json("GET", path, "GETFILESTATUS")["FileStatus"]["length"])

    def read_bytes(self, path: str) -> bytes:
        location = self._json("GET", path, "OPEN", noredirect="true")["Location"]
        return self._call("GET", location)

    def read_chunks(self, path: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
        data = self.read_bytes(path)
        for start in range(0, len(data), chunk_bytes):
            yield data[start : start + chunk_bytes]

    def download(self, path: str, local_file: str | os.PathLike[str]) -> None:
        target = Path(local_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.read_bytes(path))

    # -- writes ------------------------------------------------------------------------------------------
    def write_bytes(self, path: str, data: bytes, *, exclusive: bool = False) -> None:
        if not clean_path(path):
            raise ValueError("a write needs a file path below the root")
        overwrite = "false" if exclusive else "true"
        location = self._json("PUT", path, "CREATE", overwrite=overwrite, noredirect="true")["Location"]
        self._call("PUT", location, data)

    def write_chunks(self, path: str, chunks: Iterable[bytes]) -> None:
        self.write_bytes(path, b"".join(chunks))

    def upload(self, local_file: str | os.PathLike[str], path: str) -> None:
        self.write_bytes(path, Path(local_file).read_bytes())

    def delete(self, path: str) -> bool:
        return bool(self._json("DELETE", path, "DELETE", recursive="false")["boolean"])

    def delete_tree(self, path: str) -> None:
        self._json("DELETE", path, "DELETE", recursive="true")

    def child(self, path: str) -> WebHdfsStorage:
        return WebHdfsStorage(self._http, self._hdfs_root, self._abs(path).lstrip("/"))


@contextmanager
def hdfs_dir(cluster: HdfsCluster, test_name: str) -> Iterator[TestDir]:
    """A fresh directory ``/t/<test>-<uuid8>`` on ``cluster``; removed with its contents afterwards."""
    path = f"t/{unique_name(test_name)}"
    view = cluster.storage(path)
    try:
        yield TestDir("hdfs", cluster.uri(path), view)
    finally:
        view.delete_tree("")
