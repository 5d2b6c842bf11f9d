"""The server-wide budget of payload bytes in flight: calls that do not fit wait for room,
then get RESOURCE_EXHAUSTED (reason OVERLOADED); a call larger than the budget is refused at once;
a hold shrinks to what its call still needs; the registry holds a GetSnapshot's payload bytes
from it, and a streamed read's pieces in memory (the one sent and those read ahead). (A report's
payloads are held with its request message: tests/coordinator/server/test_admission.py.)"""

from __future__ import annotations

import threading

import grpc
import pytest

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import SystemClock
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy
from snapcoord.coordinator.errors import Reason, ResourceExhausted
from snapcoord.coordinator.kernel.payload_admission import PayloadBudget
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.snapshots.registry import CHUNK_BYTES, READ_AHEAD_PIECES, SnapshotRegistry
from snapcoord.coordinator.transport.status import status_for


def test_a_call_waits_for_room_and_gets_it_when_another_finishes() -> None:
    budget = PayloadBudget(100, wait_s=120)
    done = threading.Event()
    got: list[int] = []

    def second() -> None:
        with budget.hold(60, "second"):
            got.append(budget.in_flight)
        done.set()

    with budget.hold(60, "first"):
        t = threading.Thread(target=second)
        t.start()
        assert not done.wait(0.2)  # 60 + 60 > 100: it waits while the first holds its bytes
    t.join(120)
    assert got == [60] and budget.in_flight == 0


def test_a_call_that_never_fits_in_time_is_refused_with_resource_exhausted() -> None:
    budget = PayloadBudget(100, wait_s=0)
    with (
        budget.hold(80, "first"),
        pytest.raises(ResourceExhausted) as refused,
        budget.hold(30, "GetSnapshot x"),
    ):
        pass
    assert refused.value.reason is Reason.OVERLOADED
    assert "GetSnapshot x needs 30 payload bytes in memory: 80 of 100 bytes are in flight" in str(
        refused.value
    )
    assert refused.value.metadata == {"limit": "100", "requested": "30"}
    assert status_for(refused.value).code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert budget.in_flight == 0
    with (
        pytest.raises(ResourceExhausted, match="more than the whole budget of 100 bytes"),
        budget.hold(101, "huge"),
    ):
        pass


def test_a_hold_shrinks_to_what_its_call_still_needs() -> None:
    budget = PayloadBudget(100, wait_s=0)
    with budget.hold(90, "receipt") as held:
        held.shrink(30)
        assert budget.in_flight == 30
        with budget.hold(70, "another"):  # the 60 given back are free at once
            assert budget.in_flight == 100
        held.shrink(40)  # a shrink never grows a hold
        assert budget.in_flight == 30
    assert budget.in_flight == 0


def registry_with(stores: Stores, budget: PayloadBudget) -> SnapshotRegistry:
    return SnapshotRegistry(
        stores.metadata,
        stores.blobs,
        SystemClock(),
        # Payloads in the blob store; a 5 MiB report inline.
        SnapshotPolicy(inline_checkpoint_max_bytes=0, max_report_bytes=8 * CHUNK_BYTES),
        CoordinatorMetrics(new_registry()),
        payload_budget=budget,
    )


def test_the_registry_holds_payload_bytes_from_the_budget(stores: Stores) -> None:
    budget = PayloadBudget(1000, wait_s=0)
    snapshots = registry_with(stores, budget)
    g = snapshots.create("app", ["a", "b"], 0, 0, {}).record.generation
    snapshots.report("app", g, "a", (), {"s": b"x" * 600})
    snapshots.report("app", g, "b", (), {"s": b"y" * 300})
    assert len(snapshots.get("app", g, include_checkpoints=True).payloads) == 2  # 900 fits
    with budget.hold(200, "another call"):  # 900 + 200 > 1000, and no waiting
        with pytest.raises(ResourceExhausted) as refused:
            snapshots.get("app", g, include_checkpoints=True)
        assert refused.value.metadata["requested"] == "900"
        assert snapshots.get("app", g, include_checkpoints=False).snapshot.record.reported == 2  # no payloads
    assert budget.in_flight == 0


def test_a_streamed_read_holds_its_pieces_from_the_budget_until_it_ends(stores: Stores) -> None:
    held = (READ_AHEAD_PIECES + 1) * CHUNK_BYTES
    budget = PayloadBudget(16 * CHUNK_BYTES, wait_s=0)  # room for the 5 MiB report
    snapshots = registry_with(stores, budget)
    payload = bytes(range(256)) * (5 * CHUNK_BYTES // 256) + b"tail"
    g = snapshots.create("app", ["a", "b"], 0, 0, {}).record.generation
    snapshots.report("app", g, "a", (), {"s": payload})
    snapshots.report("app", g, "b", (), {"s": b"one piece"})
    assert budget.in_flight == 0

    _, small = snapshots.read_checkpoint("app", g, "b", "s")
    assert next(small) == b"one piece"
    assert budget.in_flight == CHUNK_BYTES  # nothing to read ahead
    assert next(small, None) is None
    assert budget.in_flight == 0

    _, pieces = snapshots.read_checkpoint("app", g, "a", "s")
    assert next(pieces) == payload[:CHUNK_BYTES]
    assert budget.in_flight == held
    with budget.hold(budget.max_bytes - held - 100, "another call"):  # no room for a second read
        _, other = snapshots.read_checkpoint("app", g, "a", "s")
        with pytest.raises(ResourceExhausted) as refused:
            next(other)
        assert refused.value.metadata["requested"] == str(held)
    pieces.close()  # a reader that stops early gives its pieces back
    assert budget.in_flight == 0

    _, pieces = snapshots.read_checkpoint("app", g, "a", "s")
    assert b"".join(pieces) == payload
    assert budget.in_flight == 0


def _wait_until(condition: object, what: str) -> None:
    import time

    deadline = time.monotonic() + 120
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_try_take_never_waits_nor_passes_a_call_that_waits() -> None:
    budget = PayloadBudget(100, wait_s=120)
    held = budget.try_take(70)
    assert held is not None and budget.in_flight == 70
    assert budget.try_take(40) is None  # no room: at once, nothing taken
    assert budget.in_flight == 70
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(budget.take(50, "waiter").nbytes))
    waiter.start()
    _wait_until(lambda: budget._waiting == 1, "the 50-byte call to wait")
    assert budget.try_take(10) is None  # 80 would fit, but the waiting call came first
    held.release()
    waiter.join(120)
    assert got == [50] and budget.in_flight == 50
    held.release()  # once only
    assert budget.in_flight == 50
