"""A real local PySpark driver for connector tests (Java and pyspark: scripts/install-test-deps)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from harness.coordinator import CoordinatorProcess
from harness.seaweed import SeaweedS3Server
from harness.spark_connect import SparkConnectServer


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run the interpreter that has snapcoord installed, not the PATH default.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("snapcoord-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    """One local Spark Connect server (its own JVM) shared by every Connect test of the session.

    A server that cannot start fails the tests that need it, with its log; nothing skips.
    """
    server = SparkConnectServer(tmp_path_factory.mktemp("spark-connect"))
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
