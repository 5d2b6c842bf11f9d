"""One 3-node ZooKeeper ensemble with 2 coordinator replicas (and the shared S3) for the module's
live runs; the planted-bug runs start their own replicas on it, under their own chroot."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from harness.cluster import Cluster
from harness.seaweed import SeaweedS3Server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedS3Server) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("robustness")
    with Cluster(workdir, s3_server.uri(f"robustness-{secrets.token_hex(4)}"), replicas=2) as c:
        yield c
