"""The clock-skew verdict: a pure rule from (offset, uncertainty, margin), and the guard that applies it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.coordinator import coordinator_config, embedded_deps
from snapcoord.coordinator import errors
from snapcoord.coordinator.domain.clock import (
    ClockGuard,
    ClockReading,
    GuardedClock,
    ManualClock,
    clock_usable,
    skew_refusal,
)
from snapcoord.coordinator.server.app import build_server
from snapcoord.coordinator.storage.zookeeper.clock import clock_probe

MARGIN_MS = 2_000  # --max-clock-skew 2s: each replica may be 1 s from ZooKeeper's clock


@pytest.mark.parametrize(
    ("offset_ms", "uncertainty_ms", "usable"),
    [
        (0, 0, True),
        (1_000, 0, True),  # exactly half the margin: two such replicas are exactly the margin apart
        (-1_000, 0, True),
        (1_001, 0, False),
        (-1_001, 0, False),
        (1_400, 500, True),  # might be 900 ms: not sure enough to refuse
        (-1_600, 500, False),  # at least 1.1 s ahead
        (30_000, 5, False),
    ],
)
def test_a_replica_refuses_once_surely_beyond_half_the_margin(
    offset_ms: float, uncertainty_ms: float, usable: bool
) -> None:
    assert clock_usable(ClockReading(offset_ms, uncertainty_ms), MARGIN_MS) is usable


def test_the_refusal_names_the_skew_its_direction_and_the_fix() -> None:
    ahead = skew_refusal(ClockReading(-3_000, 2), MARGIN_MS)
    assert "clock skew" in ahead and "3.000s" in ahead and "ahead of ZooKeeper" in ahead
    assert "--max-clock-skew (2s)" in ahead and "NTP" in ahead
    assert "behind ZooKeeper" in skew_refusal(ClockReading(3_000, 2), MARGIN_MS)


def test_the_guarded_clock_refuses_while_skewed_and_serves_again_once_back() -> None:
    guard = ClockGuard(MARGIN_MS)
    clock = GuardedClock(ManualClock(start_ms=5), guard)
    assert clock.now_ms() == 5  # trusted until a reading says otherwise
    assert guard.record(ClockReading(-3_000, 2)) == (False, True)
    with pytest.raises(errors.Unavailable) as refused:
        clock.now_ms()
    assert "clock skew" in str(refused.value) and refused.value.reason is errors.Reason.UNAVAILABLE
    assert refused.value.metadata == {"cause": "clock_skew"}
    assert guard.record(ClockReading(-2_900, 2)) == (False, False)
    assert guard.record(ClockReading(-10, 2)) == (True, False)
    assert clock.now_ms() == 5 and guard.refusal() is None


def test_the_embedded_store_has_no_clock_check(tmp_path: Path) -> None:
    """One process, one clock: nothing to compare, nothing refused."""
    with embedded_deps(tmp_path) as deps:
        assert clock_probe(deps.metadata, deps.clock) is None
        server, _ = build_server(coordinator_config(), deps)
        try:
            assert server.clock_check is None
            assert not isinstance(server.services.deps.clock, GuardedClock)
        finally:
            server.shutdown(0)
