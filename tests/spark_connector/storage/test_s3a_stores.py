"""Which create S3A makes against the test SeaweedFS, for each hadoop-aws line the tests use.

hadoop-aws 3.5.0 (the session's) declares conditional create: an exclusive create is a put with
``If-None-Match: *`` and the store refuses a second one atomically; with the feature switched off it is
a check and then a put. hadoop-aws 3.3.6 has no conditional create at all; it runs in a driver of its
own (``jobs/s3a_store_job.py``), since one JVM holds one hadoop-aws. Either way a second exclusive
create of a name is a ``FileExistsError`` and the first object stays; only ``atomic_exclusive`` (what
a concurrent writer can count on) differs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness import s3a
from harness.locations import TestDir
from harness.seaweed import SeaweedS3Server
from snapcoord.spark_connector.storage import open_location
from snapcoord.spark_connector.storage.hadoop import HadoopStorage

pytestmark = [pytest.mark.spark, pytest.mark.process]

JOB = Path(__file__).parent.parent / "jobs" / "s3a_store_job.py"


def test_hadoop_aws_3_5_creates_conditionally_unless_switched_off(
    spark: SparkSession, s3a_dir: TestDir
) -> None:
    storage = open_location(s3a_dir.uri_of("log"), spark=spark)
    assert isinstance(storage, HadoopStorage) and storage.atomic_exclusive
    storage.write_bytes("0", b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        storage.write_bytes("0", b"second", exclusive=True)
    assert s3a_dir.storage.read_bytes("log/0") == b"first"

    # The switch is read when the FileSystem is made: a fresh (uncached) one sees it.
    switches = {"fs.s3a.create.conditional.enabled": "false", "fs.s3a.impl.disable.cache": "true"}
    for key, value in switches.items():
        spark.conf.set(key, value)
    try:
        plain = open_location(s3a_dir.uri_of("log"), spark=spark)
        assert isinstance(plain, HadoopStorage) and not plain.atomic_exclusive
        with pytest.raises(FileExistsError):
            plain.write_bytes("0", b"third", exclusive=True)
    finally:
        for key in switches:
            spark.conf.unset(key)
    assert s3a_dir.storage.read_bytes("log/0") == b"first"


def test_hadoop_aws_3_3_creates_by_check_then_put(s3_server: SeaweedS3Server, s3a_dir: TestDir) -> None:
    conf = s3a.spark_conf(s3_server, "s3a-3.3")
    argv = [sys.executable, str(JOB), "--conf", json.dumps(conf), "--location", s3a_dir.uri]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads(lines[-1])
    assert result["jar"] == "hadoop-aws-3.3.6.jar"
    assert result["fs_class"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert result["rows"] == list(range(7))
    assert result["atomic_exclusive"] is False
    assert result["second"] == "FileExistsError" and result["stored"] == "first"
    assert s3a_dir.storage.read_bytes("log/0") == b"first"  # as SeaweedFS keeps it


def test_a_directory_marker_is_neither_a_file_nor_an_entry(
    spark: SparkSession, s3_server: SeaweedS3Server, s3a_dir: TestDir
) -> None:
    """S3A keeps an empty ``dir/`` object for each directory it makes (Spark's ``_spark_metadata``,
    a checkpoint's ``offsets``); read without a JVM (s3fs, as under Spark Connect) the directory
    still lists its files."""
    prefix = s3a_dir.uri.split("/", 3)[3]
    client = s3_server.client()
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/dir/", Body=b"")
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/dir/f", Body=b"x")
    jvm_free = open_location(s3a_dir.uri, use_jvm=False, storage_options=s3a.s3fs_options(s3_server))
    through_s3a = open_location(s3a_dir.uri, spark=spark)
    for storage in (jvm_free, through_s3a):
        assert [(e.name, e.is_dir) for e in storage.list()] == [("dir", True)], storage
        assert [(e.name, e.size) for e in storage.list("dir")] == [("f", 1)], storage
