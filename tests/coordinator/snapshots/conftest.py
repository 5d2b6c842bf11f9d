"""Two snapshot registries on one store, standing for two coordinator processes."""

from __future__ import annotations

import pytest

from harness.snapshot_processes import make_registry
from harness.stores import Stores
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry


@pytest.fixture
def here(stores: Stores) -> SnapshotRegistry:
    """The process whose copies are under test."""
    return make_registry(stores)


@pytest.fixture
def elsewhere(stores: Stores) -> SnapshotRegistry:
    """Another process on the same store."""
    return make_registry(stores)
