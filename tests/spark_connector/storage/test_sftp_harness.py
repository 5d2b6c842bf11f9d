"""The test sshd as Spark sees it: a remote Hadoop filesystem whose paths exist nowhere locally."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from harness.locations import TestDir

pytestmark = pytest.mark.spark


def _remote_path(d: TestDir) -> str:
    """The absolute path part of an ``sftp://user@host:port/path`` URI."""
    return "/" + d.uri.split("://", 1)[1].split("/", 1)[1]


def _assert_nowhere_local(d: TestDir) -> None:
    assert not Path(_remote_path(d)).exists(), f"{_remote_path(d)} exists locally"
    assert not any(name.startswith("sftp") for name in os.listdir(".")), "a local 'sftp:' directory appeared"


def test_streaming_checkpoint_and_file_sink_on_sftp(spark: SparkSession, remote: TestDir) -> None:
    source = remote.uri_of("in")
    spark.range(5).write.json(source)
    schema = spark.read.json(source).schema
    query = (
        spark.readStream.schema(schema)
        .json(source)
        .writeStream.format("parquet")
        .option("path", remote.uri_of("table"))
        .option("checkpointLocation", remote.uri_of("cp"))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(r.id for r in spark.read.parquet(remote.uri_of("table")).collect()) == [0, 1, 2, 3, 4]
    # The checkpoint and the sink's log are where the server keeps the remote directory.
    assert remote.storage.exists("cp/metadata")
    assert remote.storage.exists("cp/commits/0")
    assert remote.storage.exists("table/_spark_metadata/0")
    _assert_nowhere_local(remote)


def test_test_dir_is_local_or_remote(spark: SparkSession, test_dir: TestDir) -> None:
    spark.range(3).write.parquet(test_dir.uri_of("t"))
    assert spark.read.parquet(test_dir.uri_of("t")).count() == 3
    assert any(e.name.endswith(".parquet") for e in test_dir.storage.list("t"))
    if test_dir.kind == "local":
        assert Path(test_dir.uri, "t").is_dir()
    else:  # a remote store, reached by its own scheme; nothing of it on the local disk
        assert test_dir.uri.startswith(f"{test_dir.kind}://"), test_dir.uri
        assert not any(name.startswith(test_dir.kind) for name in os.listdir(".")), os.listdir(".")
    if test_dir.kind == "sftp":
        _assert_nowhere_local(test_dir)


def test_spark_connect_server_reaches_sftp(spark_connect: Any, remote: TestDir) -> None:
    spark_connect.range(4).write.parquet(remote.uri_of("t"))
    assert spark_connect.read.parquet(remote.uri_of("t")).count() == 4
    assert remote.storage.exists("t/_SUCCESS")
    _assert_nowhere_local(remote)
