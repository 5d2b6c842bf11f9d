"""AdvanceProducerOffsets on this process's copy of the previous record, on both backends.

A sink's next batch goes through the process that registered the batch before, which kept a copy
of that record: the advance commits without reading first (one ZooKeeper request). These tests try
to make that copy lie: another process (a second registry, on a second ZooKeeper session for
the real backend) advancing, deleting, re-registering or replacing the records in between. Each
time the commit must refuse the copy, and the call must answer and leave the stores exactly as a
call that read first would: no record lost, doubled or half-written, no payload deleted that a
live record references, none left behind that none does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from harness.concurrency import run_threads
from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producer_codec import inline_offsets_bytes
from snapcoord.coordinator.domain.producers import ProducerPolicy, Registration
from snapcoord.coordinator.errors import NotFound, StoreUnavailable
from snapcoord.coordinator.kernel.expiry_index import BUCKET_MS as EXPIRY_BUCKET_MS
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers.layout import EXPIRY, RECORDS, record_path
from snapcoord.coordinator.producers.registry import ProducerRegistry
from snapcoord.coordinator.storage.backends import open_metadata_store
from snapcoord.coordinator.storage.metadata import MetadataStore, Op

HOUR_MS = 3_600_000
INLINE_MAX = 1024
A = (Offset("orders", 0, 10), Offset("orders", 1, -1))
B = (Offset("orders", 0, 99),)


def large(value: int) -> tuple[Offset, ...]:
    """Offsets too large to live in the record: they go to the blob store."""
    items: tuple[Offset, ...] = ()
    while inline_offsets_bytes(items) <= INLINE_MAX:
        items = (*items, Offset("s" * 40, len(items), value))
    return items


@dataclass
class Process:
    """One coordinator process: its registry (with its own copies) and its metrics."""

    producers: ProducerRegistry
    metrics: CollectorRegistry

    def stale_copies(self) -> float:
        sample = self.metrics.get_sample_value(
            "snapcoord_commit_stale_copies_total", {"operation": "producer_advance"}
        )
        return sample or 0.0


@dataclass
class Sent:
    """The metadata requests a process made, by method ("transaction", "get_many"...); a
    transaction that writes producer records is "commit"."""

    log: list[str] = field(default_factory=list)


READS = ("get", "get_many", "synced_get_many", "children")


def recorded(metadata: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> Sent:
    sent = Sent()
    for name in (*READS, "transaction"):
        real = getattr(metadata, name)

        def logged(*args: object, _real: object = real, _name: str = name, **kwargs: object) -> object:
            commit = _name == "transaction" and any(op.path.startswith(RECORDS) for op in args[0])  # type: ignore[attr-defined]
            sent.log.append("commit" if commit else _name)
            return _real(*args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(metadata, name, logged)
    return sent


@pytest.fixture(params=["inline", "blob store"])
def policy(request: pytest.FixtureRequest) -> ProducerPolicy:
    limit = INLINE_MAX if request.param == "inline" else 0
    return ProducerPolicy(
        default_ttl_ms=HOUR_MS, max_ttl_ms=24 * HOUR_MS, max_offsets=1000, inline_max_bytes=limit
    )


@pytest.fixture
def clock() -> ManualClock:
    # Real "now": the blob store stamps objects itself.
    return ManualClock(SystemClock().now_ms())


def process(metadata: MetadataStore, stores: Stores, clock: ManualClock, policy: ProducerPolicy) -> Process:
    metrics = new_registry()
    return Process(
        ProducerRegistry(metadata, stores.blobs, clock, policy, CoordinatorMetrics(metrics)), metrics
    )


@pytest.fixture
def ours(stores: Stores, clock: ManualClock, policy: ProducerPolicy) -> Process:
    return process(stores.metadata, stores, clock, policy)


@pytest.fixture
def other_metadata(stores: Stores, request: pytest.FixtureRequest) -> Iterator[MetadataStore]:
    """The store as another coordinator sees it: its own ZooKeeper session on the same tree (the
    embedded store admits one opener per directory: there the other registry shares it)."""
    if stores.kind == "embedded":
        yield stores.metadata
        return
    metadata = open_metadata_store(request.getfixturevalue("zk_uri"))
    yield metadata
    metadata.close()


@pytest.fixture
def other(
    other_metadata: MetadataStore, stores: Stores, clock: ManualClock, policy: ProducerPolicy
) -> Process:
    return process(other_metadata, stores, clock, policy)


def offsets_for(policy: ProducerPolicy, value: int) -> tuple[Offset, ...]:
    return (Offset("orders", 0, value),) if policy.inline_max_bytes else large(value)


def objects(stores: Stores) -> list[str]:
    return sorted(b.key for b in stores.blobs.list("producers/"))


def referenced(stores: Stores) -> list[str]:
    """The payload keys the stored records point at."""
    keys = []
    for name in stores.metadata.children(RECORDS):
        node = stores.metadata.get(record_path(name))
        assert node is not None
        key = json.loads(node.data).get("object_key")
        if key:
            keys.append(key)
    return sorted(keys)


def index_entries(stores: Stores) -> list[str]:
    return sorted(
        name
        for bucket in stores.metadata.children(EXPIRY)
        for name in stores.metadata.children(f"{EXPIRY}/{bucket}")
    )


def assert_only(stores: Stores, producer_ids: Sequence[str]) -> None:
    """Exactly these records, each with one index entry and its payload (if any), nothing else."""
    assert stores.metadata.children(RECORDS) == sorted(producer_ids)
    assert [e.split("@")[0] for e in index_entries(stores)] == sorted(producer_ids)
    assert objects(stores) == referenced(stores)


def test_a_run_of_batches_through_one_process_commits_each_advance_without_a_read(
    ours: Process, stores: Stores, policy: ProducerPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours.producers.register("q.b0", offsets_for(policy, 0), 0)
    sent = recorded(stores.metadata, monkeypatch)
    for batch in range(1, 6):
        offsets = offsets_for(policy, batch)
        sent.log.clear()
        registration, deleted = ours.producers.advance(f"q.b{batch}", offsets, 0, f"q.b{batch - 1}")
        assert registration.registered and registration.snapshot.offsets == offsets and deleted
        # Offsets in the blob store add what their payloads need around the commit (an intent pool
        # refill now and then, the withdrawal of the released payload's intent), never a read.
        assert [r for r in sent.log if r in READS] == []
        assert sent.log.count("commit") == 1
        if policy.inline_max_bytes:
            assert sent.log == ["commit"]
    monkeypatch.undo()
    assert ours.stale_copies() == 0
    assert_only(stores, ["q.b5"])
    assert ours.producers.get("q.b5").offsets == offsets_for(policy, 5)


def test_a_copy_of_a_record_deleted_and_registered_again_elsewhere_is_refused(
    ours: Process, other: Process, stores: Stores, policy: ProducerPolicy
) -> None:
    """The stored record has the version of our copy (a new node starts at 0 again) but another
    registration: the delete of the copy's index entry fails the commit, and the read that follows
    deletes the record that is stored, with its own index entry and payload."""
    ours.producers.register("q.b0", offsets_for(policy, 0), 0)  # our copy: version 0
    assert other.producers.delete("q.b0")
    again = other.producers.register("q.b0", offsets_for(policy, 1), 0)  # version 0 again
    assert again.registered

    registration, deleted = ours.producers.advance("q.b1", offsets_for(policy, 2), 0, "q.b0")
    assert registration.registered and deleted
    assert ours.stale_copies() == 1
    assert_only(stores, ["q.b1"])
    with pytest.raises(NotFound):
        other.producers.get("q.b0")
    assert other.producers.get("q.b1").offsets == offsets_for(policy, 2)


def test_a_copy_of_an_expired_record_replaced_elsewhere_is_refused(
    ours: Process, other: Process, stores: Stores, policy: ProducerPolicy, clock: ManualClock
) -> None:
    """Our copy shows the previous record expired (an advance would answer previous_deleted=False);
    another process replaced it meanwhile with a live one. The version check refuses the copy and
    the answer is the stored record's: a live one was deleted."""
    ours.producers.register("q.b0", offsets_for(policy, 0), 1_000)
    clock.advance(EXPIRY_BUCKET_MS)
    assert other.producers.register("q.b0", offsets_for(policy, 1), 0).registered  # SetData: version 1

    registration, deleted = ours.producers.advance("q.b1", offsets_for(policy, 2), 0, "q.b0")
    assert registration.registered and deleted
    assert ours.stale_copies() == 1
    assert_only(stores, ["q.b1"])
    assert ours.producers.expire_due(100) == 0  # no entry of the replaced registrations is left


def test_a_record_registered_elsewhere_is_kept_with_its_payload(
    ours: Process, other: Process, stores: Stores, policy: ProducerPolicy
) -> None:
    """Data loss check: the batch's record was registered through another process (an earlier
    attempt of the batch) after ours wrote the previous one. The blind create fails; the stored
    record, its offsets and its payload stay; the previous record goes all the same."""
    ours.producers.register("q.b0", offsets_for(policy, 0), 0)
    earlier = other.producers.register("q.b1", offsets_for(policy, 1), 0)

    registration, deleted = ours.producers.advance("q.b1", offsets_for(policy, 2), 0, "q.b0")
    assert (registration.registered, registration.snapshot, deleted) == (False, earlier.snapshot, True)
    assert ours.stale_copies() == 1
    assert_only(stores, ["q.b1"])
    assert other.producers.get("q.b1").offsets == offsets_for(policy, 1)


def test_an_advance_elsewhere_makes_our_copy_stale_and_the_retry_is_answered_as_before(
    ours: Process, other: Process, stores: Stores, policy: ProducerPolicy
) -> None:
    """Another process made batch 1's advance (ours wrote batch 0): ours, asked the same (a client
    retrying through another replica), finds batch 1 stored and batch 0 gone."""
    ours.producers.register("q.b0", offsets_for(policy, 0), 0)
    first = other.producers.advance("q.b1", offsets_for(policy, 1), 0, "q.b0")
    assert first[0].registered and first[1]

    again = ours.producers.advance("q.b1", offsets_for(policy, 1), 0, "q.b0")
    assert again == (Registration(False, first[0].snapshot), False)
    assert ours.stale_copies() == 1
    assert_only(stores, ["q.b1"])
    # And the next batch through ours: the copy of batch 1 it read serves the next advance.
    assert ours.producers.advance("q.b2", offsets_for(policy, 2), 0, "q.b1")[1]
    assert ours.stale_copies() == 1
    assert_only(stores, ["q.b2"])


def test_two_processes_advancing_one_query_concurrently_make_each_step_once(
    ours: Process, other: Process, stores: Stores, policy: ProducerPolicy
) -> None:
    """Two drivers of one query (a zombie and its successor) on two processes, batch after batch:
    each step registers one record and deletes the previous one once, and both callers are
    answered with the stored record. The step's winner holds the copy the next step starts from,
    so every step races a blind commit against a read-first one."""
    ours.producers.register("q.b0", offsets_for(policy, 0), 0)
    for step in range(1, 7):
        outcomes = race(step, (ours, other), policy)
        winners = [r for r, _ in outcomes if r.registered]
        assert len(outcomes) == 4 and len(winners) == 1, step
        stored = ours.producers.get(f"q.b{step}")
        assert {r.snapshot for r, _ in outcomes} == {winners[0].snapshot} == {stored}
        assert sum(deleted for _, deleted in outcomes) == 1, step
        assert_only(stores, [f"q.b{step}"])


def race(
    step: int, sides: tuple[Process, Process], policy: ProducerPolicy
) -> list[tuple[Registration, bool]]:
    """Four callers, two per process, advance to batch ``step`` at once, each with its own offsets."""
    outcomes: list[tuple[Registration, bool]] = []
    lock = threading.Lock()

    def advance(i: int) -> None:
        offsets = offsets_for(policy, 100 * step + i)
        outcome = sides[i % 2].producers.advance(f"q.b{step}", offsets, 0, f"q.b{step - 1}")
        with lock:
            outcomes.append(outcome)

    run_threads(4, advance)
    return outcomes


def test_a_failed_blind_advance_changes_nothing_and_the_next_one_reads(
    ours: Process, stores: Stores, policy: ProducerPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = ours.producers.register("q.b0", offsets_for(policy, 0), 0)
    real = stores.metadata.transaction

    def unavailable(ops: Sequence[Op]) -> None:
        if any(op.path.startswith(RECORDS) for op in ops):  # the commit (not an intent pool refill)
            raise StoreUnavailable("metadata store down (test)")
        real(ops)

    monkeypatch.setattr(stores.metadata, "transaction", unavailable)
    with pytest.raises(StoreUnavailable):
        ours.producers.advance("q.b1", offsets_for(policy, 1), 0, "q.b0")
    monkeypatch.setattr(stores.metadata, "transaction", real)
    assert_only(stores, ["q.b0"])
    assert ours.producers.get("q.b0") == kept.snapshot

    sent = recorded(stores.metadata, monkeypatch)
    registration, deleted = ours.producers.advance("q.b1", offsets_for(policy, 1), 0, "q.b0")
    assert registration.registered and deleted
    # The failure dropped the copy: this call read both records before its commit.
    assert sent.log.index("get_many") < sent.log.index("commit")
    assert_only(stores, ["q.b1"])
