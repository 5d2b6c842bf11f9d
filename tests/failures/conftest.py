"""One cluster (3-node ZooKeeper ensemble, 3 coordinator replicas, the shared S3) for the failure tests.

Starting it costs tens of seconds on a loaded machine, so the module shares it; every test first
``heal()``s it (restarts what the previous test broke and waits for SERVING) and uses its own id prefix.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cluster import Cluster
from harness.seaweed import SeaweedS3Server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_server: SeaweedS3Server) -> Iterator[Cluster]:
    workdir: Path = tmp_path_factory.mktemp("cluster")
    with Cluster(workdir, s3_server.uri(f"failures-{secrets.token_hex(4)}")) as c:
        yield c


@pytest.fixture
def healed(cluster: Cluster) -> Cluster:
    cluster.heal()
    return cluster
