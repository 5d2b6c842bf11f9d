"""The producer offset registry on both backends: the embedded defaults and real ZooKeeper + S3."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from harness.concurrency import run_threads
from harness.faults import LaggingReads, SimulatedCrash, call_while_blob_deletes_fail
from harness.seaweed import SeaweedS3Server
from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.paging import encode_name_token
from snapcoord.coordinator.domain.producers import ProducerPolicy, Registration
from snapcoord.coordinator.errors import InvalidArgument, NotFound, StoreUnavailable
from snapcoord.coordinator.kernel.expiry_index import BUCKET_MS as EXPIRY_BUCKET_MS
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers.layout import EXPIRY, RECORDS, record_path
from snapcoord.coordinator.producers.registry import ProducerRegistry
from snapcoord.coordinator.storage.backends import open_blob_store, open_metadata_store
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore, Op

HOUR_MS = 3_600_000
# Payloads in the blob store (inline_max_bytes=0): the path of large offsets; test_producers_inline
# covers records that hold their offsets.
POLICY = ProducerPolicy(default_ttl_ms=HOUR_MS, max_ttl_ms=24 * HOUR_MS, max_offsets=1000, inline_max_bytes=0)
A = (Offset("orders", 0, 10), Offset("orders", 1, -1))
B = (Offset("orders", 0, 99),)


def registry(metadata: MetadataStore, blobs: BlobStore, clock: ManualClock) -> ProducerRegistry:
    return ProducerRegistry(metadata, blobs, clock, POLICY, CoordinatorMetrics(new_registry()))


@pytest.fixture
def clock() -> ManualClock:
    # Real "now": the orphan sweep compares against object times the blob store sets itself.
    return ManualClock(SystemClock().now_ms())


@pytest.fixture
def producers(stores: Stores, clock: ManualClock) -> ProducerRegistry:
    return registry(stores.metadata, stores.blobs, clock)


def objects(blobs: BlobStore) -> list[str]:
    """Every producer payload. Their keys (``producers/<uuid>.json``, from the intent pool) do not
    name their producer: the tests that count them register one producer at a time."""
    return [b.key for b in blobs.list("producers/")]


def test_lifecycle(producers: ProducerRegistry, stores: Stores, clock: ManualClock) -> None:
    first = producers.register("sink-1", A, 0)
    assert first.registered and first.snapshot.offsets == A
    assert first.snapshot.created_at_ms == clock.now_ms()
    assert first.snapshot.expires_at_ms == clock.now_ms() + HOUR_MS  # ttl 0: the server default
    assert producers.get("sink-1") == first.snapshot

    again = producers.register("sink-1", B, 0)  # a restarted attempt: gets the stored positions
    assert again == Registration(registered=False, snapshot=first.snapshot)
    assert len(objects(stores.blobs)) == 1  # the loser's upload was never made or removed

    page, token = producers.list_page(0, "")
    assert [s.producer_id for s in page] == ["sink-1"] and token == ""

    [payload] = objects(stores.blobs)
    assert producers.delete("sink-1") is True
    with pytest.raises(NotFound, match="no producer offsets are registered for producer_id 'sink-1'"):
        producers.get("sink-1")
    assert objects(stores.blobs) == []
    # The intent the delete made for the payload went once the payload did.
    assert payload not in IntentIndex(stores.metadata).announced_keys()
    assert producers.delete("sink-1") is False  # idempotent
    assert producers.register("sink-1", B, 0).registered  # after a delete, a new registration wins


def test_a_repeat_registration_is_not_counted_as_a_commit_conflict(
    stores: Stores, clock: ManualClock
) -> None:
    """The first round guesses "no record yet" (a sink's first start); for a restarted sink the
    create-if-absent commit refuses the guess. That is the expected path, not contention."""
    registry = new_registry()
    producers = ProducerRegistry(stores.metadata, stores.blobs, clock, POLICY, CoordinatorMetrics(registry))
    first = producers.register("sink-1", A, 0)
    for _ in range(3):
        assert producers.register("sink-1", B, 0) == Registration(registered=False, snapshot=first.snapshot)

    def sample(name: str) -> float:
        return registry.get_sample_value(name, {"operation": "producer_register"}) or 0.0

    assert sample("snapcoord_commit_conflicts_total") == 0
    assert sample("snapcoord_commit_stale_copies_total") == 3
    assert len(objects(stores.blobs)) == 1  # the repeats' uploads were removed


def test_ttl_expiry_with_an_injected_clock(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    producers.register("sink-1", A, 1_000)
    clock.advance(999)
    assert producers.get("sink-1").offsets == A
    clock.advance(1)
    with pytest.raises(NotFound, match="expired"):
        producers.get("sink-1")
    assert producers.list_page(0, "") == ([], "")
    assert producers.delete("sink-1") is False  # nothing live to delete (the record is cleaned up)
    assert stores.metadata.children(RECORDS) == []

    producers.register("sink-2", A, 1_000)
    clock.advance(5_000)
    replaced = producers.register("sink-2", B, 0)  # an expired record counts as absent
    assert replaced.registered and replaced.snapshot.offsets == B
    assert producers.get("sink-2").offsets == B
    assert len(objects(stores.blobs)) == 1  # the expired record's payload went with it


def test_validation_leaves_state_untouched(producers: ProducerRegistry, stores: Stores) -> None:
    bad_calls: list[tuple[Callable[[], object], str]] = [
        (lambda: producers.register("sink/1", A, 0), "producer_id 'sink/1' contains '/'"),
        (lambda: producers.register("sink-1", [], 0), "offsets is empty"),
        (
            lambda: producers.register("sink-1", [*A, A[0]], 0),
            r"offsets\[2\] repeats stream 'orders' partition 0",
        ),
        (lambda: producers.register("sink-1", [Offset("orders", 0, -7)], 0), r"offsets\[0\].offset is -7"),
        (lambda: producers.register("sink-1", A, 25 * HOUR_MS), "at most 86400000 ms"),
        (lambda: producers.register("sink-1", [Offset("s", i, 0) for i in range(1001)], 0), "limit is 1000"),
        (lambda: producers.get(""), "producer_id is required"),
        (lambda: producers.list_page(1001, ""), "page_size is 1001"),
        (lambda: producers.list_page(10, "%%%"), "not a token this server issued"),
    ]
    for call, message in bad_calls:
        with pytest.raises(InvalidArgument, match=message):
            call()
    assert stores.metadata.children(RECORDS) == []
    assert list(stores.blobs.list("producers/")) == []


def test_list_pages_through_live_records(producers: ProducerRegistry, clock: ManualClock) -> None:
    for i in range(5):
        producers.register(f"sink-{i}", A, 1_000 if i == 2 else HOUR_MS)
    clock.advance(2_000)  # sink-2 expired
    seen: list[str] = []
    token = ""
    for _ in range(5):
        page, token = producers.list_page(2, token)
        seen += [s.producer_id for s in page]
        if not token:
            break
    assert seen == ["sink-0", "sink-1", "sink-3", "sink-4"]


def test_a_list_page_ends_early_once_its_offsets_reach_the_byte_budget(
    stores: Stores, clock: ManualClock
) -> None:
    """Records may hold 100k offsets each: a page of 100 would be GBs. A page ends once its
    payloads reach the budget (after at least one record, however large); the token goes on."""
    producers = ProducerRegistry(
        stores.metadata,
        stores.blobs,
        clock,
        POLICY,
        CoordinatorMetrics(new_registry()),
        list_page_bytes=5_000,
    )
    big = [Offset("orders", p, 10**12 + p) for p in range(100)]  # 5.8 KB stored, A 140 bytes
    for i in range(5):
        producers.register(f"sink-{i}", big if i in (1, 2) else A, HOUR_MS)
    pages: list[list[str]] = []
    token = ""
    while True:
        page, token = producers.list_page(100, token)
        pages.append([s.producer_id for s in page])
        if not token:
            break
    # sink-0 and sink-1 pass 5,000 bytes; sink-2 alone is over them: a page of its own.
    assert pages == [["sink-0", "sink-1"], ["sink-2"], ["sink-3", "sink-4"]]
    second, _ = producers.list_page(100, encode_name_token("sink-1"))
    assert [s.producer_id for s in second] == ["sink-2"] and second[0].offsets == tuple(big)


def test_a_read_racing_a_delete_through_a_lagging_server_is_not_found(
    stores: Stores, clock: ManualClock
) -> None:
    """Another replica deleted the record, then its payload; this replica's server has not applied
    the delete yet, so it still shows the record, whose payload is gone. The confirming re-read is
    synced, so the answer is NOT_FOUND, not INTERNAL ("payload missing")."""
    writer = registry(stores.metadata, stores.blobs, clock)
    writer.register("p", A, HOUR_MS)
    path = record_path("p")
    lagging = LaggingReads(stores.metadata, {path: stores.metadata.get(path)})
    reader = registry(lagging, stores.blobs, clock)  # type: ignore[arg-type]
    assert writer.delete("p")
    with pytest.raises(NotFound):
        reader.get("p")


def test_exactly_one_of_twenty_concurrent_registrations_wins(
    producers: ProducerRegistry, stores: Stores
) -> None:
    outcomes: list[Registration] = []
    lock = threading.Lock()

    def register(i: int) -> None:
        outcome = producers.register("contended", [Offset("orders", 0, i)], 0)
        with lock:
            outcomes.append(outcome)

    run_threads(20, register)
    winners = [o for o in outcomes if o.registered]
    assert len(outcomes) == 20 and len(winners) == 1
    assert {o.snapshot for o in outcomes} == {winners[0].snapshot}  # everyone sees the winner's offsets
    assert objects(stores.blobs) == [producers_object(stores, "contended")]


def test_expired_record_replacement_race_has_one_winner(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    producers.register("contended", A, 1_000)
    clock.advance(1_000)
    outcomes: list[Registration] = []
    lock = threading.Lock()

    def register(i: int) -> None:
        outcome = producers.register("contended", [Offset("orders", 0, 100 + i)], 0)
        with lock:
            outcomes.append(outcome)

    run_threads(10, register)
    winners = [o for o in outcomes if o.registered]
    assert len(winners) == 1
    assert {o.snapshot for o in outcomes} == {winners[0].snapshot}
    assert producers.get("contended") == winners[0].snapshot
    assert objects(stores.blobs) == [producers_object(stores, "contended")]


def producers_object(stores: Stores, producer_id: str) -> str:
    """The payload key the stored record points at (read raw from the metadata store)."""
    import json

    node = stores.metadata.get(f"{RECORDS}/{producer_id}")
    assert node is not None
    return str(json.loads(node.data)["object_key"])


def test_janitor_expires_only_due_records(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    producers.register("short", A, EXPIRY_BUCKET_MS)
    short_payload = producers_object(stores, "short")
    producers.register("long", A, 10 * EXPIRY_BUCKET_MS)
    producers.register("renewed", A, EXPIRY_BUCKET_MS)
    assert producers.expire_due(100) == 0  # nothing due yet
    clock.advance(2 * EXPIRY_BUCKET_MS)
    producers.delete("renewed")
    producers.register("renewed", B, EXPIRY_BUCKET_MS)  # a new registration, not due

    assert producers.expire_due(100) == 1
    assert stores.metadata.children(RECORDS) == ["long", "renewed"]
    assert sorted(objects(stores.blobs)) == sorted(  # its payload went with it, the others stay
        producers_object(stores, p) for p in ("long", "renewed")
    )
    assert short_payload not in objects(stores.blobs)
    assert producers.get("long").offsets == A and producers.get("renewed").offsets == B
    # The drained past bucket is gone; only the buckets of live records remain.
    assert len(stores.metadata.children(EXPIRY)) == 2

    clock.advance(10 * EXPIRY_BUCKET_MS)
    assert producers.expire_due(1) == 1  # bounded work per pass
    assert producers.expire_due(100) == 1
    assert stores.metadata.children(RECORDS) == []
    assert stores.metadata.children(EXPIRY) == []


def test_janitor_never_removes_a_record_replaced_after_it_expired(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    producers.register("sink", A, 1_000)
    clock.advance(EXPIRY_BUCKET_MS)
    replaced = producers.register("sink", B, HOUR_MS)  # replaces the expired record in place
    assert replaced.registered
    assert producers.expire_due(100) == 0
    assert producers.get("sink") == replaced.snapshot


def test_orphan_sweep_respects_the_grace_period(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock
) -> None:
    producers.register("live", A, 24 * HOUR_MS)
    stores.blobs.put("producers/crashed/0123456789abcdef0123456789abcdef.json", b"{}")
    stores.blobs.put("snapshots/app/1/task/x", b"not the producer sweep's business")
    assert producers.sweep_orphans(grace_ms=HOUR_MS, limit=100) == 0  # too young: may be in flight
    clock.advance(2 * HOUR_MS)
    assert producers.sweep_orphans(grace_ms=HOUR_MS, limit=100) == 1
    assert [k for k in objects(stores.blobs) if "/crashed/" in k] == []
    assert producers.get("live").offsets == A  # referenced payloads are never swept
    assert [b.key for b in stores.blobs.list("snapshots/")] == ["snapshots/app/1/task/x"]


def test_crash_between_upload_and_commit_leaves_only_an_orphan(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = stores.metadata.transaction

    def crash(ops: Sequence[Op]) -> None:
        if any(op.path.startswith(RECORDS) for op in ops):  # the record's commit (not the intents')
            raise SimulatedCrash
        commit(ops)

    monkeypatch.setattr(stores.metadata, "transaction", crash)
    with pytest.raises(SimulatedCrash):
        producers.register("sink", A, 0)
    monkeypatch.undo()

    with pytest.raises(NotFound):
        producers.get("sink")  # never a visible record
    assert len(objects(stores.blobs)) == 1  # the payload was written first
    clock.advance(2 * HOUR_MS)
    # Its intent (written before the payload) leads the intent sweep to it; the listing sweep
    # leaves announced objects alone.
    assert producers.sweep_orphans(grace_ms=HOUR_MS, limit=100) == 0
    assert IntentIndex(stores.metadata).sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100) == 1
    assert objects(stores.blobs) == []
    assert producers.register("sink", B, 0).registered  # and the id is free


def test_failed_commit_removes_its_upload(
    producers: ProducerRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(ops: object) -> None:
        raise StoreUnavailable("metadata store down (test)")

    monkeypatch.setattr(stores.metadata, "transaction", unavailable)
    with pytest.raises(StoreUnavailable):
        producers.register("sink", A, 0)
    assert objects(stores.blobs) == []  # cleaned at once, not left to the sweep


def test_s3_down_during_register_is_unavailable_and_commits_nothing(
    zk_uri: str, private_s3_server: SeaweedS3Server, monkeypatch: pytest.MonkeyPatch, clock: ManualClock
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", private_s3_server.endpoint_url)
    metadata = open_metadata_store(zk_uri)
    blobs = open_blob_store(private_s3_server.uri("producers-test"))
    try:
        producers = registry(metadata, blobs, clock)
        private_s3_server.stop()
        with pytest.raises(StoreUnavailable, match="unreachable"):
            producers.register("sink", A, 0)
        assert metadata.children(RECORDS) == []  # no record without its payload
        assert metadata.children(EXPIRY) == []
        private_s3_server.start()
        assert producers.register("sink", A, 0).registered
    finally:
        blobs.close()
        metadata.close()


@pytest.mark.parametrize("how", ["delete", "expiry", "replacement"])
@pytest.mark.parametrize("failure", ["unavailable", "crash"])
def test_a_payload_left_behind_by_the_commit_that_unreferenced_it_is_swept_later(
    producers: ProducerRegistry,
    stores: Stores,
    clock: ManualClock,
    how: str,
    failure: str,
) -> None:
    """The payload is deleted after the commit that unreferences it. When that delete fails (S3
    down) or never runs (a crash), the object must still be collected: pooled keys do not name
    their producer, so the listing sweep cannot judge them, and the intent sweep must."""
    producers.register("keep", A, 24 * HOUR_MS)
    kept = producers_object(stores, "keep")
    producers.register("sink", A, 1_000)
    doomed = producers_object(stores, "sink")
    clock.advance(EXPIRY_BUCKET_MS)
    if how == "delete":
        call: Callable[[], object] = lambda: producers.delete("sink")  # noqa: E731
    elif how == "expiry":
        call = lambda: producers.expire_due(100)  # noqa: E731
    else:
        call = lambda: producers.register("sink", B, 24 * HOUR_MS)  # noqa: E731
    call_while_blob_deletes_fail(stores.blobs, failure, call)
    assert doomed in objects(stores.blobs)  # left behind, unreferenced
    live = {producers_object(stores, p) for p in stores.metadata.children(RECORDS)}
    assert doomed not in live

    # Young objects are spared (they may be in flight); past the grace, the janitor's sweeps
    # remove the one left behind and nothing that a record references.
    clock.advance(2 * HOUR_MS)
    producers.sweep_orphans(grace_ms=HOUR_MS, limit=100)
    IntentIndex(stores.metadata).sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100)
    assert sorted(objects(stores.blobs)) == sorted(live)
    assert kept in live and producers.get("keep").offsets == A
    if how == "replacement":
        assert producers.get("sink").offsets == B
    assert doomed not in IntentIndex(stores.metadata).announced_keys()  # swept with its object


def test_an_expiry_pass_withdraws_the_intents_of_the_payloads_it_deleted_in_one_transaction(
    producers: ProducerRegistry, stores: Stores, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(5):
        producers.register(f"sink-{i}", A, 1_000)
    payloads = set(objects(stores.blobs))
    clock.advance(EXPIRY_BUCKET_MS)
    sent: list[Sequence[Op]] = []
    commit = stores.metadata.transaction

    def recorded(ops: Sequence[Op]) -> None:
        sent.append(ops)
        commit(ops)

    monkeypatch.setattr(stores.metadata, "transaction", recorded)
    assert producers.expire_due(100) == 5
    assert objects(stores.blobs) == []
    assert not payloads & IntentIndex(stores.metadata).announced_keys()
    # Five commits (each deleting a record and making its payload's intent), then one withdrawal.
    intent_only = [ops for ops in sent if all(op.path.startswith("/intents/") for op in ops)]
    assert len(sent) == 6 and len(intent_only) == 1 and len(intent_only[0]) == 5
