"""CreateSnapshot from this process's copy of the app's pointer: a create on an app the process
knows reads only the current header (one round) and commits; a stale copy never repeats a
generation, never skips one, and never answers with a snapshot that is not the current one.

Two registries on one store stand for two coordinator processes (each has its own copies), so
what one writes makes the other's copy stale. The request counts are taken on real ZooKeeper, on
the coordinator's own kazoo client (as ``bench/hot_rpcs.py`` does).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from harness.concurrency import run_threads
from harness.snapshot_processes import make_registry
from harness.stores import Stores
from harness.zk_requests import Counted, count_requests
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.snapshot_codec import decode_app
from snapcoord.coordinator.domain.snapshots import State
from snapcoord.coordinator.errors import CommitOutcomeUnknown
from snapcoord.coordinator.snapshots.layout import app_path, gens_path
from snapcoord.coordinator.snapshots.registry import SnapshotRegistry
from snapcoord.coordinator.storage.metadata import Op

OFFSETS = (Offset("orders", 0, 100),)


def finish(registry: SnapshotRegistry, app_id: str, generation: int) -> None:
    assert registry.report(app_id, generation, "q", OFFSETS, {}).record.state is State.COMPLETED


def pointer(stores: Stores, app_id: str) -> tuple[int, int]:
    """The app's current generation and its pointer's version."""
    node = stores.metadata.get(app_path(app_id))
    assert node is not None
    return decode_app(node.data), node.version


def generations(stores: Stores, app_id: str) -> list[int]:
    return sorted(int(n) for n in stores.metadata.children(gens_path(app_id)))


# --- stale copies: the races -------------------------------------------------------------------


def test_a_stale_copy_finds_the_snapshot_another_process_created(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """Here's copy says generation 1; elsewhere completed it and created 2. Here's create must
    answer 2 (a retry of the same request), neither 1 (not current) nor a new 3."""
    assert here.create("app", ["q"], 0, 0, {}).record.generation == 1
    finish(elsewhere, "app", 1)
    assert elsewhere.create("app", ["q"], 0, 0, {}).record.generation == 2
    again = here.create("app", ["q"], 0, 0, {})
    assert (again.record.generation, again.record.state) == (2, State.CREATED)
    assert pointer(stores, "app") == (2, 1) and generations(stores, "app") == [1, 2]


def test_a_stale_copy_after_generations_moved_on_creates_the_next_one(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """Here's copy says 1 (COMPLETED since); elsewhere created and completed 2. Here's commit from
    the copy would make 2 again: its version check fails, and here creates 3."""
    here.create("app", ["q"], 0, 0, {})
    finish(elsewhere, "app", 1)
    elsewhere.create("app", ["q"], 0, 0, {})
    finish(elsewhere, "app", 2)
    created = here.create("app", ["q"], 0, 0, {})
    assert created.record.generation == 3
    assert elsewhere.get("app", 2, include_checkpoints=False).snapshot.record.state is State.COMPLETED
    assert pointer(stores, "app") == (3, 2) and generations(stores, "app") == [1, 2, 3]


def test_a_stale_copy_whose_later_generations_were_deleted_never_repeats_one(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """The nastiest stale copy: here knows generation 1; elsewhere aborted it, created 2, aborted
    and deleted it (as retention does with aborted snapshots), and deleted 1. Nothing under the
    app's generations tells 1 and 2 apart from "never made": only the pointer's version does."""
    here.create("app", ["q"], 0, 0, {})
    elsewhere.abort("app", 1, "")
    elsewhere.create("app", ["q"], 0, 0, {})
    elsewhere.abort("app", 2, "")
    assert elsewhere.delete("app", 2) is True and elsewhere.delete("app", 1) is True
    assert generations(stores, "app") == []
    created = here.create("app", ["q"], 0, 0, {})
    assert created.record.generation == 3
    assert pointer(stores, "app") == (3, 2) and generations(stores, "app") == [3]


def test_an_exact_copy_after_an_abort_elsewhere_creates_the_next_generation(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """An abort (by AbortSnapshot or the deadline janitor) does not touch the pointer: here's copy
    is still exact, and the next generation is made from it; so it is after the aborted header
    was deleted."""
    here.create("app", ["q"], 0, 0, {})
    elsewhere.abort("app", 1, "")
    assert here.create("app", ["q"], 0, 0, {}).record.generation == 2
    elsewhere.abort("app", 2, "")
    assert elsewhere.delete("app", 2) is True
    assert here.create("app", ["q"], 0, 0, {}).record.generation == 3
    assert pointer(stores, "app") == (3, 2) and generations(stores, "app") == [1, 3]


def test_concurrent_creates_on_two_processes_with_copies_make_one_generation(
    stores: Stores, here: SnapshotRegistry, elsewhere: SnapshotRegistry
) -> None:
    """Both processes hold a copy of generation 1 (completed); 16 creates race, 8 on each: one
    generation 2 is made, and every call answers it."""
    here.create("app", ["q"], 0, 0, {})
    elsewhere.create("app", ["q"], 0, 0, {})
    finish(here, "app", 1)
    answers: list[int] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        made = (here if i % 2 else elsewhere).create("app", ["q"], 0, 0, {})
        with lock:
            answers.append(made.record.generation)

    run_threads(16, create)
    assert answers == [2] * 16
    assert pointer(stores, "app") == (2, 1) and generations(stores, "app") == [1, 2]


def test_a_create_whose_commit_reply_was_lost_answers_its_snapshot(
    stores: Stores, here: SnapshotRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    here.create("app", ["q"], 0, 0, {})
    finish(here, "app", 1)
    real_transaction = stores.metadata.transaction

    def applied_then_unknown(ops: Sequence[Op]) -> None:
        real_transaction(ops)
        raise CommitOutcomeUnknown("connection lost after the commit (test)")

    monkeypatch.setattr(stores.metadata, "transaction", applied_then_unknown)
    assert here.create("app", ["q"], 0, 0, {}).record.generation == 2
    monkeypatch.undo()
    assert here.create("app", ["q"], 0, 0, {}).record.generation == 2  # the retry
    finish(here, "app", 2)
    assert here.create("app", ["q"], 0, 0, {}).record.generation == 3
    assert pointer(stores, "app") == (3, 2)


# --- ZooKeeper requests per call -----------------------------------------------------------------


@pytest.fixture
def counted(zk_stores: Stores, monkeypatch: pytest.MonkeyPatch) -> Counted:
    return count_requests(zk_stores.metadata, monkeypatch)


def test_creates_on_an_app_this_process_knows_read_only_the_header(
    zk_stores: Stores, counted: Counted
) -> None:
    """The benchmark's call (a create while the current snapshot is CREATED: its retry) is one
    read; a new generation is that read and the transaction (they were the pointer, the header
    and the transaction, one after another)."""
    registry = make_registry(zk_stores)
    registry.create("app", ["a", "b"], 0, 0, {})
    for _ in range(3):
        counted.reset()
        assert registry.create("app", ["a", "b"], 0, 0, {}).record.generation == 1
        assert (counted.requests, counted.rounds) == (1, 1), counted.log
        assert counted.log == ["GetData"]
    registry.abort("app", 1, "")
    counted.reset()
    assert registry.create("app", ["a", "b"], 0, 0, {}).record.generation == 2
    assert (counted.requests, counted.rounds) == (2, 2), counted.log
    assert counted.log == ["GetData", "Transaction"]


def test_a_process_without_a_copy_reads_the_pointer_once(zk_stores: Stores, counted: Counted) -> None:
    first = make_registry(zk_stores)
    second = make_registry(zk_stores)
    first.create("app", ["a"], 0, 0, {})
    counted.reset()
    assert second.create("app", ["a"], 0, 0, {}).record.generation == 1
    assert (counted.requests, counted.rounds) == (2, 2), counted.log  # the pointer, then the header
    counted.reset()
    assert second.create("app", ["a"], 0, 0, {}).record.generation == 1
    assert (counted.requests, counted.rounds) == (1, 1), counted.log
