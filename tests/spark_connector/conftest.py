"""A real local PySpark driver for connector tests (Java and pyspark: scripts/install-test-deps).

Remote storage, each reached by the ``spark`` session and the Spark Connect server through Spark's own
Hadoop FileSystem:

- ``sftp://`` on the session's ``sshd``, its paths in a chroot (they exist nowhere on the local
  filesystem): ``remote`` gives a test a fresh directory there;
- ``s3a://`` (hadoop-aws 3.5.0, ``harness.s3a``) on the session's SeaweedFS: ``s3a_dir``;
- ``hdfs://`` on the session's HDFS minicluster (``harness.hdfs``, started by the first test that
  needs it): ``hdfs_dir``.

``local_dir`` gives one on the local disk, and ``test_dir`` any of them (parametrized over ``KINDS``;
a module narrows it with ``pytest.mark.parametrize("test_dir", [...], indirect=True)``): see
``harness.locations.TestDir``. The s3a settings go into the session before it starts, so the ``spark``
session needs the SeaweedFS server; the hadoop-aws 3.3 store (``s3a-3.3``, a non-atomic create) needs a
JVM of its own: a driver subprocess given ``harness.s3a.spark_conf(server, "s3a-3.3")``.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from harness import s3a
from harness.coordinator import CoordinatorProcess
from harness.hdfs import HdfsCluster
from harness.hdfs import hdfs_dir as make_hdfs_dir
from harness.jars import jar_set
from harness.kafka import KafkaBroker
from harness.locations import FIXTURE_OF_KIND, KINDS, TestDir, sftp_dir
from harness.locations import local_dir as make_local_dir
from harness.seaweed import SeaweedS3Server
from harness.spark_connect import SparkConnectServer
from harness.sshd import SshServer


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """The session's sftp server (a real sshd on loopback); its chroot goes with it."""
    server = SshServer(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def remote(request: pytest.FixtureRequest, sshd: SshServer) -> Iterator[TestDir]:
    """A fresh directory on the sshd: ``remote.uri`` (``sftp://...``) for Spark and the connector,
    ``remote.storage`` to inspect it or plant files as the server keeps them."""
    with sftp_dir(sshd, request.node.name) as d:
        yield d


@pytest.fixture
def local_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestDir]:
    """A fresh local directory in the same shape as ``remote`` (``uri`` is its absolute path)."""
    with make_local_dir(tmp_path, request.node.name) as d:
        yield d


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster]:
    """The session's HDFS: a NameNode and a DataNode in one JVM on loopback."""
    cluster = HdfsCluster(tmp_path_factory.mktemp("hdfs"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def s3a_dir(request: pytest.FixtureRequest, s3_server: SeaweedS3Server) -> Iterator[TestDir]:
    """A fresh ``s3a://`` prefix on the session's SeaweedFS (``TestDir.storage`` views it through s3fs)."""
    with s3a.s3a_dir(s3_server, request.node.name) as d:
        yield d


@pytest.fixture
def hdfs_dir(request: pytest.FixtureRequest, hdfs: HdfsCluster) -> Iterator[TestDir]:
    """A fresh ``hdfs://`` directory (``TestDir.storage`` views it through WebHDFS)."""
    with make_hdfs_dir(hdfs, request.node.name) as d:
        yield d


@pytest.fixture(params=KINDS)
def test_dir(request: pytest.FixtureRequest) -> TestDir:
    """A fresh directory of each kind in turn: a test using it runs once on each (see the module
    docstring for narrowing the kinds)."""
    kind: str = request.param
    d: TestDir = request.getfixturevalue(FIXTURE_OF_KIND[kind])
    return d


def remote_spark_conf(sshd: SshServer, s3_server: SeaweedS3Server) -> dict[str, str]:
    """What a Spark JVM of the tests needs to reach the sftp and s3a test stores."""
    return {**sshd.spark_conf(), **s3a.spark_conf(s3_server)}


@pytest.fixture(scope="session")
def spark(
    tmp_path_factory: pytest.TempPathFactory, sshd: SshServer, s3_server: SeaweedS3Server
) -> Iterator[SparkSession]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the interpreter that has snapcoord installed, not the PATH default.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    builder = SparkSession.builder
    for key, value in remote_spark_conf(sshd, s3_server).items():
        builder = builder.config(key, value)
    # local[2,4]: a failed task is tried up to 4 times, as spark.task.maxFailures does on a cluster
    # (local mode otherwise fails the job at once). Hadoop's SFTPFileSystem.mkdirs is check-then-
    # create, so two tasks creating the same staging directory race and one attempt fails; on a
    # cluster its retry succeeds, and so it must here.
    session = (
        builder.master("local[2,4]")
        .appName("snapcoord-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.jars", ",".join(str(j) for j in jar_set("spark-kafka")))  # format("kafka")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The session's Kafka broker (KRaft, one node, loopback); tests make topics of their own names."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def spark_connect_server(
    tmp_path_factory: pytest.TempPathFactory, sshd: SshServer, s3_server: SeaweedS3Server
) -> Iterator[SparkConnectServer]:
    """One local Spark Connect server (its own JVM) shared by every Connect test of the session; it
    reaches the session's sftp and s3a stores as the ``spark`` session does.

    A server that cannot start fails the tests that need it, with its log; nothing skips.
    """
    conf = remote_spark_conf(sshd, s3_server)
    server = SparkConnectServer(tmp_path_factory.mktemp("spark-connect"), conf=conf)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def spark_connect(spark_connect_server: SparkConnectServer) -> Iterator[Any]:
    """A fresh Spark Connect client session on the shared server (``SparkConnectServer.session``)."""
    session = spark_connect_server.session()
    yield session
    session.stop()


@pytest.fixture(scope="module")
def zk_coordinator(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    zk_hosts: str,
    s3_server: SeaweedS3Server,
) -> Iterator[CoordinatorProcess]:
    """One ``snapcoord serve`` per test module on the shared ZooKeeper + S3, in a chroot and prefix
    of the module's own (named after it), as drivers reach it in production: another process."""
    name = request.module.__name__.rpartition(".")[2].removeprefix("test_").replace("_", "-")
    run = f"{name}-{uuid.uuid4().hex[:8]}"
    args = ["--metadata", f"zk://{zk_hosts}/t/{run}", "--blobs", s3_server.uri(f"t/{run}")]
    with CoordinatorProcess(tmp_path_factory.mktemp(f"coordinator-{name}"), args=args) as coord:
        yield coord
