"""Where the connector reads and writes checkpoints and tables: one ``Storage`` per location, chosen
by the location's URI scheme.

``open_location(location, spark=...)`` decides how to reach a location:

- next to Spark's JVM (a classic PySpark driver: ``spark`` is a classic ``SparkSession``, or one is
  active), through Spark's own Hadoop ``FileSystem`` and the session's Hadoop configuration: whatever
  the query itself can read and write, the connector can too, with no configuration of its own. A
  plain path means what it means to Spark (it is qualified against ``fs.defaultFS``);
- where no JVM is reachable (a Spark Connect client, the Connect server's Python worker), through
  fsspec with the same URI and the standard credential chains of each store, from the optional extra
  the message names;
- local directories (``file:`` URIs, and plain paths where no JVM qualifies them) directly.

A location that none of these can reach raises ``UnsupportedLocation`` naming the scheme and what to
install: it is never taken for a local path.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from snapcoord.spark_connector.storage.base import (
    Entry,
    ExclusiveWriteUnsupported,
    Storage,
    StorageError,
    UnsupportedLocation,
    clean_path,
    copy_concurrency,
    join,
)
from snapcoord.spark_connector.storage.local import LocalStorage

__all__ = [
    "FSSPEC_SCHEMES",
    "Entry",
    "ExclusiveWriteUnsupported",
    "FsspecScheme",
    "LocalStorage",
    "Storage",
    "StorageError",
    "UnsupportedLocation",
    "classic_session",
    "clean_path",
    "copy_concurrency",
    "join",
    "open_location",
    "scheme_of",
]


@dataclass(frozen=True)
class FsspecScheme:
    """How a scheme is reached without a JVM: the fsspec protocol, the module it needs, and the
    connector's optional extra that installs it."""

    protocol: str
    module: str
    extra: str


#: Schemes reached through fsspec where no JVM is reachable (see docs/spark-storage.md).
FSSPEC_SCHEMES: dict[str, FsspecScheme] = {
    "s3": FsspecScheme("s3", "s3fs", "s3"),
    "s3a": FsspecScheme("s3", "s3fs", "s3"),
    "s3n": FsspecScheme("s3", "s3fs", "s3"),
    "abfs": FsspecScheme("abfs", "adlfs", "azure"),
    "abfss": FsspecScheme("abfs", "adlfs", "azure"),
    "gs": FsspecScheme("gcs", "gcsfs", "gcs"),
    "hdfs": FsspecScheme("hdfs", "pyarrow", "hdfs"),
    "sftp": FsspecScheme("sftp", "paramiko", "sftp"),
}


def scheme_of(location: str) -> str:
    """The URI scheme of ``location`` in lower case; ``""`` for a plain path (a Windows drive letter is
    a path, not a scheme)."""
    scheme = urlparse(location).scheme.lower()
    return "" if len(scheme) <= 1 else scheme


def classic_session(spark: Any | None) -> Any | None:
    """``spark`` when it is a classic (JVM-backed) SparkSession; else the active classic session of this
    process, if any; else None (a Spark Connect session has no JVM here)."""
    if spark is not None:
        return spark if hasattr(spark, "_jsparkSession") else None
    if importlib.util.find_spec("pyspark") is None:
        return None
    from pyspark.sql import SparkSession

    try:
        active = SparkSession.getActiveSession()
    except Exception:  # a Spark Connect-only install may refuse classic calls
        return None
    return active if active is not None and hasattr(active, "_jsparkSession") else None


def open_location(
    location: str,
    *,
    spark: Any | None = None,
    use_jvm: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> Storage:
    """The ``Storage`` rooted at ``location``; see the module docstring.

    ``spark``: the session whose Hadoop configuration reaches the location (default: the active classic
    session, if any). ``use_jvm=False`` skips Spark's JVM even when one is reachable.
    ``storage_options``: passed to fsspec (endpoint, credentials) where fsspec is used.
    """
    if not isinstance(location, str) or not location:
        raise ValueError(f"a location must be a non-empty string, not {location!r}")
    scheme = scheme_of(location)
    session = classic_session(spark) if use_jvm else None
    if session is not None and scheme != "file":
        from snapcoord.spark_connector.storage.hadoop import open_hadoop

        return open_hadoop(session, location)
    if scheme == "":
        return LocalStorage(location)
    if scheme == "file":
        parsed = urlparse(location)
        if parsed.netloc not in ("", "localhost"):
            raise UnsupportedLocation(f"{location!r}: a file: URI with a host is not a local path")
        return LocalStorage(unquote(parsed.path))
    known = FSSPEC_SCHEMES.get(scheme)
    if known is None:
        raise UnsupportedLocation(
            f"{location!r}: the connector cannot reach scheme {scheme!r} without Spark's JVM; "
            f"supported: file, plain paths, {', '.join(sorted(FSSPEC_SCHEMES))} (and, from a classic "
            "PySpark driver, any scheme Spark's Hadoop configuration can reach)"
        )
    from snapcoord.spark_connector.storage.fsspec_storage import open_fsspec

    return open_fsspec(location, known, storage_options or {})
