"""Snapshot registries standing for coordinator processes on one store: each keeps its own copies
of records (app pointers, open snapshots' headers and report counters), so what one writes makes
the other's copies stale (``test_create_copies``, ``test_report_copies``)."""

from __future__ import annotations

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry

POLICY = SnapshotPolicy(default_timeout_ms=10 * 60_000, default_keep_last_completed=2)


def make_registry(stores: Stores) -> SnapshotRegistry:
    """A new process's registry on ``stores`` (its own clock, metrics and copies)."""
    clock = ManualClock(SystemClock().now_ms())
    return SnapshotRegistry(stores.metadata, stores.blobs, clock, POLICY, CoordinatorMetrics(new_registry()))
