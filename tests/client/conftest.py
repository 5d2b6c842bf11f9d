"""A coordinator per test module (in-process, embedded stores) and a client per test on it.

Tests name their records after themselves (``ids``), so sharing one coordinator per module keeps
them apart without paying for a server per test.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from harness.coordinator import InProcessCoordinator, embedded_deps, serve_in_process
from snapcoord.client import CoordinatorClient


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCoordinator]:
    with embedded_deps(tmp_path_factory.mktemp("coordinator")) as deps, serve_in_process(deps) as coord:
        yield coord


@pytest.fixture
def client(coordinator: InProcessCoordinator) -> Iterator[CoordinatorClient]:
    with CoordinatorClient(coordinator.target, timeout_s=30) as c:
        yield c


@pytest.fixture
def uid(request: pytest.FixtureRequest) -> str:
    """A valid identifier unique to this test, to prefix app, job, producer and lease ids with."""
    name = re.sub(r"[^A-Za-z0-9._:-]", "-", request.node.name)[:120]
    return f"{name}-{uuid.uuid4().hex[:8]}"
