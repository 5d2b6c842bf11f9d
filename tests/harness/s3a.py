"""Spark's own S3 filesystem (``s3a://``, hadoop-aws) pointed at the test SeaweedFS.

Two hadoop-aws lines, each a jar set of ``scripts/maven``, are tested; a JVM can hold only one:

- ``s3a`` (kind ``"s3a"``): hadoop-aws 3.5.0 with its AWS SDK v2 bundle, matching the Hadoop 3.5.0
  client PySpark 4.3.0 ships. It declares conditional create (``fs.s3a.create.conditional.enabled``,
  on by default): an exclusive create is a put with ``If-None-Match: *``, which SeaweedFS honours, so
  the connector's ``Storage.atomic_exclusive`` is True there;
- ``s3a-3.3`` (kind ``"s3a-3.3"``): hadoop-aws 3.3.6 with its SDK v1 bundle, whose
  ``create(overwrite=false)`` is a check and then a put: not atomic, the store on which concurrent
  writers can race. Hadoop 3.5's defaults carry units (``"60s"``) that 3.3's parser reads as plain
  numbers, so four settings are given as numbers.

``spark_conf`` gives the settings a session (or a Connect server, or a driver subprocess) needs; the
jars go on the JVM's class path (``extraClassPath``), not ``spark.jars``, so Spark does not copy the
650 MB SDK bundle into each executor's work directory. A directory's test view (``s3a_dir``) goes through
s3fs with the server's credentials, not through the Hadoop FileSystem the code under test uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from harness.isolation import delete_s3_prefix, unique_name
from harness.jars import class_path
from harness.locations import TestDir
from harness.seaweed import REGION, SeaweedS3Server
from snapcoord.spark_connector.storage import open_location

#: The kinds of ``s3a://`` store and the jar set of each.
JAR_SETS = {"s3a": "s3a", "s3a-3.3": "s3a-3.3"}

#: Hadoop 3.5's defaults with units, as plain numbers for hadoop-aws 3.3 (milliseconds, seconds).
PLAIN_NUMBERS_FOR_3_3 = {
    "fs.s3a.connection.establish.timeout": "30000",
    "fs.s3a.connection.timeout": "200000",
    "fs.s3a.threads.keepalivetime": "60",
    "fs.s3a.multipart.purge.age": "86400",
}


def hadoop_conf(server: SeaweedS3Server, kind: str = "s3a") -> dict[str, str]:
    """The Hadoop settings (without ``spark.hadoop.``) that point S3A of ``kind`` at ``server``."""
    if kind not in JAR_SETS:
        raise ValueError(f"unknown s3a kind {kind!r}; one of {sorted(JAR_SETS)}")
    conf = {
        "fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "fs.s3a.endpoint": server.endpoint_url,
        "fs.s3a.endpoint.region": REGION,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": server.access_key,
        "fs.s3a.secret.key": server.secret_key,
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        # A failing call should fail the test in seconds, not after the SDK's minutes of retries.
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.retry.limit": "3",
    }
    if kind == "s3a-3.3":
        conf.update(PLAIN_NUMBERS_FOR_3_3)
    return conf


def spark_conf(server: SeaweedS3Server, kind: str = "s3a") -> dict[str, str]:
    """Spark settings for ``s3a://`` of ``kind`` on ``server``: the jar set on the driver's and the
    executors' class path and the Hadoop settings (set before the session's JVM starts)."""
    conf = {f"spark.hadoop.{key}": value for key, value in hadoop_conf(server, kind).items()}
    jars = class_path(JAR_SETS[kind])
    conf["spark.driver.extraClassPath"] = jars
    conf["spark.executor.extraClassPath"] = jars
    return conf


def s3fs_options(server: SeaweedS3Server) -> dict[str, object]:
    """fsspec (s3fs) options that reach ``server`` without a JVM."""
    return {
        "key": server.access_key,
        "secret": server.secret_key,
        "client_kwargs": {"endpoint_url": server.endpoint_url, "region_name": REGION},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
    }


@contextmanager
def s3a_dir(server: SeaweedS3Server, test_name: str, kind: str = "s3a") -> Iterator[TestDir]:
    """A fresh prefix ``s3a://bucket/t/<test>-<uuid8>`` on ``server``; its objects are deleted afterwards."""
    prefix = f"t/{unique_name(test_name)}"
    options = s3fs_options(server)
    view = open_location(f"s3://{server.bucket}/{prefix}", use_jvm=False, storage_options=options)
    try:
        yield TestDir(kind, f"s3a://{server.bucket}/{prefix}", view)
    finally:
        delete_s3_prefix(server.client(), server.bucket, prefix + "/")
