"""The commit races of ``test_commit_races`` with the coordinator's commit claims as the commit point
(issue #42, point 2): what the sink uses where the store's exclusive create is not atomic. On every
store, nothing a reader must not see is exposed and nothing reported written is lost; on the local
store (atomic) the claims' protocol is checked too.

A module of its own so that xdist runs it beside the store-only races.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from harness.coordinator import CoordinatorProcess
from snapcoord.client import CoordinatorClient

from .runs import SCENARIOS, nothing_exposed_or_lost, run_race
from .scenarios import Store

pytestmark = [pytest.mark.process, pytest.mark.zookeeper, pytest.mark.s3]


@pytest.fixture(scope="module")
def claims(zk_coordinator: CoordinatorProcess) -> Iterator[CoordinatorClient]:
    """A client of a real coordinator (``snapcoord serve`` on ZooKeeper) for the commit claims."""
    with CoordinatorClient(zk_coordinator.target, timeout_s=60) as client:
        yield client


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_commit_race_with_the_coordinator_as_commit_point(
    store: Store,
    scenario: str,
    claims: CoordinatorClient,
    record_property: Callable[[str, object], None],
) -> None:
    found, summary = run_race(store, scenario, "coordinator", claims, record_property)
    assert nothing_exposed_or_lost(found), summary
