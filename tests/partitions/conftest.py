"""One namespaced cluster (3-node ensemble, 2 replicas, SeaweedFS, clients) for the partition tests.

The module starts it once; every scenario first heals it (every link up, every process running,
every replica SERVING) and uses its own ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.partitioned import PartitionedCluster


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PartitionedCluster]:
    workdir: Path = tmp_path_factory.mktemp("partitioned")
    cluster = PartitionedCluster(workdir)
    with cluster:
        yield cluster


@pytest.fixture
def healed(partitioned: PartitionedCluster) -> PartitionedCluster:
    partitioned.heal()
    return partitioned
