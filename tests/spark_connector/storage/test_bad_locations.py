"""Locations the connector cannot reach: a precise error, and nothing written anywhere.

Every test runs in an empty working directory and checks that it is still empty afterwards: a location
must never be taken for a relative local path (a directory named ``sftp:`` or ``s3a:``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.ports import free_port
from harness.seaweed import SeaweedS3Server
from harness.sshd import SshServer
from snapcoord.spark_connector.storage import (
    FSSPEC_SCHEMES,
    LocalStorage,
    StorageError,
    UnsupportedLocation,
    open_location,
)
from snapcoord.spark_connector.storage.hadoop import HadoopStorage


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working directory that must stay empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert os.listdir(cwd) == [], f"something was written locally: {os.listdir(cwd)}"


@pytest.mark.parametrize("use_jvm", [False, True], ids=["no-jvm", "jvm"])
def test_unknown_scheme(workdir: Path, spark: SparkSession, use_jvm: bool) -> None:
    with pytest.raises(UnsupportedLocation, match="nosuchfs") as raised:
        open_location("nosuchfs://bucket/table", spark=spark, use_jvm=use_jvm)
    if use_jvm:
        assert "Hadoop" in str(raised.value)  # names where the FileSystem would come from
    else:
        assert "supported:" in str(raised.value)


@pytest.mark.parametrize("scheme", sorted(FSSPEC_SCHEMES))
def test_missing_extra(workdir: Path, monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    """Without the store's library (simulated by hiding it), the message names the extra to install."""
    known = FSSPEC_SCHEMES[scheme]
    monkeypatch.setitem(sys.modules, known.module, None)  # find_spec() reports a hidden module as absent
    with pytest.raises(UnsupportedLocation) as raised:
        open_location(f"{scheme}://somewhere/table", use_jvm=False)
    message = str(raised.value)
    assert f"pip install 'snapcoord-spark[{known.extra}]'" in message
    assert f"{scheme}://" in message and known.module in message


def test_file_uri_with_a_host_is_refused(workdir: Path) -> None:
    with pytest.raises(UnsupportedLocation, match="host"):
        open_location("file://otherhost/data/table", use_jvm=False)


def test_unreachable_sftp_through_hadoop(workdir: Path, spark: SparkSession) -> None:
    storage = open_location(f"sftp://root@127.0.0.1:{free_port()}/data/cp", spark=spark)
    assert isinstance(storage, HadoopStorage)
    with pytest.raises(StorageError, match=r"sftp://root@127\.0\.0\.1"):
        storage.exists("metadata")
    with pytest.raises(StorageError):
        storage.write_bytes("metadata", b"{}")


def test_unreachable_sftp_through_fsspec(workdir: Path, sshd: SshServer) -> None:
    with pytest.raises(StorageError, match="cannot reach"):
        open_location(
            f"sftp://root@127.0.0.1:{free_port()}/data/cp",
            use_jvm=False,
            storage_options={**sshd.storage_options(), "timeout": 10},
        )


def test_unreachable_s3_through_fsspec(workdir: Path, s3_server: SeaweedS3Server) -> None:
    storage = open_location(
        f"s3a://{s3_server.bucket}/t/unreachable",
        use_jvm=False,
        storage_options={
            "endpoint_url": f"http://127.0.0.1:{free_port()}",
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 5},
        },
    )
    with pytest.raises(StorageError, match="s3a://"):
        storage.write_bytes("metadata", b"{}")
    with pytest.raises(StorageError):
        storage.exists("metadata")
    # The real store was not touched under that name.
    assert not open_location(s3_server.uri("t/unreachable"), use_jvm=False).exists("metadata")


def test_plain_paths_with_a_jvm_stay_local(workdir: Path, spark: SparkSession, tmp_path: Path) -> None:
    """A plain path is qualified against fs.defaultFS (file: here) and served locally."""
    absolute = open_location(str(tmp_path / "abs"), spark=spark)
    assert isinstance(absolute, LocalStorage) and absolute.root == tmp_path / "abs"
    as_uri = open_location((tmp_path / "abs").as_uri(), spark=spark)
    assert isinstance(as_uri, LocalStorage) and as_uri.root == tmp_path / "abs"
