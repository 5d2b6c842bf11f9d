"""Producer records that hold their offsets (inline), records that point at a payload object (the
format of earlier releases), and AdvanceProducerOffsets, on both backends (real ZooKeeper + S3)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from harness.concurrency import run_threads
from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.documents import load
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producer_codec import inline_offsets_bytes
from snapcoord.coordinator.domain.producers import ProducerPolicy, Registration
from snapcoord.coordinator.errors import (
    CommitOutcomeUnknown,
    CorruptRecord,
    InvalidArgument,
    NotFound,
    StoreUnavailable,
)
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.expiry_index import BUCKET_MS as EXPIRY_BUCKET_MS
from snapcoord.coordinator.kernel.expiry_index import entry_path
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers.layout import EXPIRY, RECORDS, record_path
from snapcoord.coordinator.producers.registry import ProducerRegistry
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import Op

HOUR_MS = 3_600_000
INLINE_MAX = 1024
POLICY = ProducerPolicy(
    default_ttl_ms=HOUR_MS, max_ttl_ms=24 * HOUR_MS, max_offsets=1000, inline_max_bytes=INLINE_MAX
)
A = (Offset("orders", 0, 10), Offset("orders", 1, -1))
B = (Offset("orders", 0, 99),)


@dataclass
class Calls:
    """What a registry sent to the stores during a test."""

    blob: list[str]
    transactions: list[Sequence[Op]] = field(default_factory=list)

    def intent_ops(self) -> list[Op]:
        return [op for ops in self.transactions for op in ops if op.path.startswith(intents.ROOT)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


@pytest.fixture
def calls(stores: Stores, blob_calls: list[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Every blob store call and every metadata transaction, recorded on the stores themselves."""
    seen = Calls(blob_calls)
    transaction = stores.metadata.transaction

    def recorded(ops: Sequence[Op]) -> None:
        seen.transactions.append(list(ops))
        transaction(ops)

    monkeypatch.setattr(stores.metadata, "transaction", recorded)
    yield seen


@pytest.fixture
def producers(stores: Stores, clock: ManualClock) -> ProducerRegistry:
    return ProducerRegistry(stores.metadata, stores.blobs, clock, POLICY, CoordinatorMetrics(new_registry()))


def objects(blobs: BlobStore) -> list[str]:
    return sorted(b.key for b in blobs.list("producers/"))


def stored_doc(stores: Stores, producer_id: str) -> dict[str, object]:
    node = stores.metadata.get(record_path(producer_id))
    assert node is not None
    doc = json.loads(node.data)
    assert isinstance(doc, dict)
    return doc


def offsets_of_size(at_least: int) -> tuple[Offset, ...]:
    """The fewest offsets whose inline form is at least ``at_least`` bytes."""
    items: tuple[Offset, ...] = ()
    while inline_offsets_bytes(items) < at_least:
        items = (*items, Offset("s" * 40, len(items), 10**12))
    return items


def write_old_record(
    stores: Stores, producer_id: str, offsets: tuple[Offset, ...], expires_at_ms: int
) -> str:
    """A record exactly as releases before inline records stored it: a version 1 record naming a
    pooled payload object, its expiry index entry, and the payload (version 1). Returns the key."""
    registration = uuid.uuid4().hex
    key = f"producers/{registration}.json"
    payload = {
        "version": 1,
        "producer_id": producer_id,
        "offsets": [{"stream": o.stream, "partition": o.partition, "offset": o.offset} for o in offsets],
    }
    stores.blobs.put(key, json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
    record = {
        "version": 1,
        "producer_id": producer_id,
        "object_key": key,
        "created_at_ms": expires_at_ms - HOUR_MS,
        "expires_at_ms": expires_at_ms,
    }
    stores.metadata.ensure_path(RECORDS)
    stores.metadata.create(
        record_path(producer_id), json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    )
    stores.metadata.create(
        entry_path(EXPIRY, expires_at_ms, f"{producer_id}@{registration}"), b"", make_parents=True
    )
    return key


def test_small_register_get_delete_make_no_blob_call_and_no_intent(
    producers: ProducerRegistry, stores: Stores, calls: Calls
) -> None:
    registered = producers.register("sink-1", A, 0)
    assert registered.registered and registered.snapshot.offsets == A
    assert producers.register("sink-1", B, 0).snapshot == registered.snapshot  # create-if-absent
    assert producers.get("sink-1") == registered.snapshot
    assert producers.list_page(0, "") == ([registered.snapshot], "")
    assert producers.delete("sink-1") is True
    with pytest.raises(NotFound):
        producers.get("sink-1")
    assert calls.blob == []
    assert calls.intent_ops() == []
    # The register's commit, the repeat's create-if-absent (refused) and the delete's: one each.
    assert len(calls.transactions) == 3
    assert objects(stores.blobs) == []


def test_offsets_beyond_the_threshold_go_to_the_blob_store(
    producers: ProducerRegistry, stores: Stores, calls: Calls
) -> None:
    at = offsets_of_size(INLINE_MAX)
    fitting = at if inline_offsets_bytes(at) == INLINE_MAX else at[:-1]
    larger = offsets_of_size(INLINE_MAX + 1)
    assert inline_offsets_bytes(fitting) <= INLINE_MAX < inline_offsets_bytes(larger)
    producers.register("fits", fitting, 0)
    assert stored_doc(stores, "fits")["version"] == 2 and calls.blob == []
    producers.register("large", larger, 0)
    doc = stored_doc(stores, "large")
    assert doc["version"] == 1 and objects(stores.blobs) == [doc["object_key"]]
    assert producers.get("fits").offsets == fitting and producers.get("large").offsets == larger
    assert producers.delete("large") and objects(stores.blobs) == []


def test_advance_drops_the_previous_record_and_registers_in_one_transaction(
    producers: ProducerRegistry, stores: Stores, calls: Calls
) -> None:
    producers.register("q.b0", A, 0)
    calls.transactions.clear()
    advanced, deleted = producers.advance("q.b1", B, 0, "q.b0")
    assert advanced.registered and advanced.snapshot.offsets == B and deleted
    assert len(calls.transactions) == 1 and calls.blob == [] and calls.intent_ops() == []
    assert stores.metadata.children(RECORDS) == ["q.b1"]
    with pytest.raises(NotFound):
        producers.get("q.b0")

    # A retry after a lost reply: the previous record is gone, the stored one is the caller's.
    again, deleted_again = producers.advance("q.b1", B, 0, "q.b0")
    assert (again.registered, again.snapshot, deleted_again) == (False, advanced.snapshot, False)
    # Nothing to drop (a query's first batch after the record expired): only the registration.
    first, none = producers.advance("r.b5", A, 0, "r.b4")
    assert first.registered and none is False
    assert stores.metadata.children(RECORDS) == ["q.b1", "r.b5"]
    assert calls.blob == []


def test_of_ten_concurrent_advances_one_registers_and_one_deletes_the_previous(
    producers: ProducerRegistry, stores: Stores
) -> None:
    """Two drivers of one query racing on batch 1 (a zombie and its successor): one record of
    batch 1, the caller whose offsets it holds is the one told registered, batch 0's record goes."""
    producers.register("q.b0", A, 0)
    outcomes: list[tuple[Registration, bool]] = []
    lock = threading.Lock()

    def advance(i: int) -> None:
        outcome = producers.advance("q.b1", (Offset("orders", 0, i),), 0, "q.b0")
        with lock:
            outcomes.append(outcome)

    run_threads(10, advance)
    winners = [r for r, _ in outcomes if r.registered]
    assert len(outcomes) == 10 and len(winners) == 1
    assert {r.snapshot for r, _ in outcomes} == {winners[0].snapshot} == {producers.get("q.b1")}
    assert sum(deleted for _, deleted in outcomes) == 1
    assert stores.metadata.children(RECORDS) == ["q.b1"]


def test_advance_between_inline_and_large_offsets_keeps_exactly_the_live_payload(
    producers: ProducerRegistry, stores: Stores
) -> None:
    large = offsets_of_size(INLINE_MAX + 1)
    producers.register("q.b0", A, 0)
    advanced, _ = producers.advance("q.b1", large, 0, "q.b0")  # inline -> blob store
    assert advanced.registered and stored_doc(stores, "q.b1")["version"] == 1
    [payload] = objects(stores.blobs)
    assert stored_doc(stores, "q.b1")["object_key"] == payload
    assert producers.get("q.b1").offsets == large
    again, deleted = producers.advance("q.b2", large, 0, "q.b1")  # blob store -> blob store
    assert again.registered and deleted
    [second] = objects(stores.blobs)
    assert second != payload and stored_doc(stores, "q.b2")["object_key"] == second
    last, deleted = producers.advance("q.b3", B, 0, "q.b2")  # blob store -> inline
    assert last.registered and deleted and objects(stores.blobs) == []
    assert stores.metadata.children(RECORDS) == ["q.b3"]
    producers.close()  # the intent pool's unused intents (made ahead for later registrations) go
    assert IntentIndex(stores.metadata).announced_keys() == frozenset()


@pytest.mark.parametrize("applied", [True, False])
@pytest.mark.parametrize("existing", [False, True])
def test_an_advance_whose_commit_outcome_is_unknown_is_decided_from_what_landed(
    producers: ProducerRegistry,
    stores: Stores,
    monkeypatch: pytest.MonkeyPatch,
    applied: bool,
    existing: bool,
) -> None:
    """The reply of the advance's commit is lost, after it applied or before: the next round reads
    (synced) and answers as the one commit would have, never registering or deleting twice."""
    producers.register("q.b0", A, 0)
    earlier = producers.register("q.b1", A, 0).snapshot if existing else None
    real = stores.metadata.transaction
    lost: list[bool] = []

    def reply_lost(ops: Sequence[Op]) -> None:
        if not lost:
            lost.append(True)
            if applied:
                real(ops)
            raise CommitOutcomeUnknown("connection lost around the commit (test)")
        real(ops)

    monkeypatch.setattr(stores.metadata, "transaction", reply_lost)
    registration, deleted = producers.advance("q.b1", B, 0, "q.b0")
    monkeypatch.undo()
    assert lost and deleted
    assert registration.registered is not existing
    assert registration.snapshot == (earlier or producers.get("q.b1"))
    assert producers.get("q.b1").offsets == (A if existing else B)
    assert stores.metadata.children(RECORDS) == ["q.b1"]


def test_advance_keeps_a_live_record_and_still_drops_the_previous(
    producers: ProducerRegistry, stores: Stores
) -> None:
    producers.register("q.b0", A, 0)
    earlier = producers.register("q.b1", A, 0)  # an earlier attempt of batch 1
    advanced, deleted = producers.advance("q.b1", B, 0, "q.b0")
    assert (advanced.registered, advanced.snapshot, deleted) == (False, earlier.snapshot, True)
    assert stores.metadata.children(RECORDS) == ["q.b1"]
    assert producers.get("q.b1").offsets == A  # the stored positions are never overwritten


@pytest.mark.parametrize(
    ("producer_id", "offsets", "previous", "message"),
    [
        ("q.b1", B, "", "previous_producer_id is empty"),
        ("q.b0", B, "q.b0", "previous_producer_id equals producer_id"),
        ("q.b1", B, "bad/id", "previous_producer_id"),
        ("", B, "q.b0", "producer_id"),
        ("q.b1", (Offset("orders", -2, 1),), "q.b0", "partition"),
    ],
)
def test_advance_refuses_bad_input_and_changes_nothing(
    producers: ProducerRegistry,
    stores: Stores,
    calls: Calls,
    producer_id: str,
    offsets: tuple[Offset, ...],
    previous: str,
    message: str,
) -> None:
    before = producers.register("q.b0", A, 0)
    calls.transactions.clear()
    with pytest.raises(InvalidArgument, match=message):
        producers.advance(producer_id, offsets, 0, previous)
    assert calls.transactions == [] and calls.blob == []
    assert stores.metadata.children(RECORDS) == ["q.b0"]
    assert producers.get("q.b0") == before.snapshot


def test_a_failed_advance_changes_neither_record(
    producers: ProducerRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = producers.register("q.b0", A, 0)

    def unavailable(ops: object) -> None:
        raise StoreUnavailable("metadata store down (test)")

    monkeypatch.setattr(stores.metadata, "transaction", unavailable)
    with pytest.raises(StoreUnavailable):
        producers.advance("q.b1", B, 0, "q.b0")
    monkeypatch.undo()
    assert stores.metadata.children(RECORDS) == ["q.b0"]
    assert producers.get("q.b0") == kept.snapshot


def test_records_of_the_earlier_format_stay_readable_and_are_cleaned_up(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    key = write_old_record(stores, "old.b0", A, clock.now_ms() + HOUR_MS)
    snapshot = producers.get("old.b0")
    assert snapshot.offsets == A and snapshot.expires_at_ms == clock.now_ms() + HOUR_MS
    assert [s.producer_id for s in producers.list_page(0, "")[0]] == ["old.b0"]
    assert producers.register("old.b0", B, 0).snapshot == snapshot  # still create-if-absent

    # An advance from the old record: one transaction drops it (its payload after the commit).
    advanced, deleted = producers.advance("old.b1", B, 0, "old.b0")
    assert advanced.registered and deleted
    assert objects(stores.blobs) == [] and key not in IntentIndex(stores.metadata).announced_keys()
    assert stored_doc(stores, "old.b1")["version"] == 2

    # Expiry of an old record deletes its payload too.
    other = write_old_record(stores, "old.c", A, clock.now_ms() + 1_000)
    assert objects(stores.blobs) == [other]
    clock.advance(EXPIRY_BUCKET_MS)
    assert producers.expire_due(100) == 1
    assert objects(stores.blobs) == [] and stores.metadata.children(RECORDS) == ["old.b1"]


def test_an_inline_record_is_refused_clearly_by_a_reader_of_the_earlier_format(
    producers: ProducerRegistry, stores: Stores
) -> None:
    """Releases before inline records decode with ``load(data, "producer record", 1)``."""
    producers.register("sink", A, 0)
    node = stores.metadata.get(record_path("sink"))
    assert node is not None
    newer = r"format version 2, newer than this snapcoord reads \(1\): upgrade"
    with pytest.raises(CorruptRecord, match=newer):
        load(node.data, "producer record", 1)


def test_janitor_and_sweeps_on_mixed_records_keep_everything_live(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    """Data loss check: neither the expiry pass, the listing sweep nor the intent sweep deletes an
    object a live record references or drops an inline record, whichever kind expires beside them."""
    live_old = write_old_record(stores, "live-old", A, clock.now_ms() + 24 * HOUR_MS)
    large = offsets_of_size(INLINE_MAX + 1)
    producers.register("live-large", large, 24 * HOUR_MS)
    live_large = str(stored_doc(stores, "live-large")["object_key"])
    producers.register("live-inline", A, 24 * HOUR_MS)
    producers.register("dying-inline", B, 1_000)
    producers.register("dying-large", large, 1_000)
    write_old_record(stores, "dying-old", B, clock.now_ms() + 1_000)
    stores.blobs.put("producers/crashed/0123456789abcdef0123456789abcdef.json", b"{}")

    clock.advance(2 * HOUR_MS)
    assert producers.expire_due(100) == 3
    assert producers.sweep_orphans(grace_ms=HOUR_MS, limit=100) == 1  # the crashed one only
    IntentIndex(stores.metadata).sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100)

    assert stores.metadata.children(RECORDS) == ["live-inline", "live-large", "live-old"]
    assert objects(stores.blobs) == sorted([live_old, live_large])
    assert producers.get("live-old").offsets == A
    assert producers.get("live-large").offsets == large
    assert producers.get("live-inline").offsets == A


def test_an_expired_inline_record_is_replaced_by_a_large_one_and_back(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    large = offsets_of_size(INLINE_MAX + 1)
    producers.register("sink", A, 1_000)
    clock.advance(EXPIRY_BUCKET_MS)
    assert producers.register("sink", large, 1_000).registered
    [payload] = objects(stores.blobs)
    clock.advance(EXPIRY_BUCKET_MS)
    assert producers.register("sink", B, 0).registered
    assert producers.get("sink").offsets == B
    assert objects(stores.blobs) == [] and payload not in IntentIndex(stores.metadata).announced_keys()
    assert producers.expire_due(100) == 0  # the replaced registrations' index entries went with them
