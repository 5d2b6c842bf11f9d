"""The intent pool: RegisterProducerOffsets takes an upload intent made ahead of the call, so most
registrations are one transaction. On both backends: a registration uses a pooled intent only while
it is young, and the next refill deletes the ones that aged; a sweep that claims a pooled intent in
use makes the registration fail without referencing anything; and the intents a stopped server left
in its pool are swept without touching a committed payload.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from harness.stores import Stores
from snapcoord.coordinator.domain.clock import ManualClock, SystemClock
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerPolicy
from snapcoord.coordinator.errors import Aborted, NotFound
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.producers.layout import RECORDS
from snapcoord.coordinator.producers.registry import ProducerRegistry
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore, Op

HOUR_MS = 3_600_000
MAX_AGE_MS = 60_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(SystemClock().now_ms())


class CountedTransactions:
    """The metadata store, counting transactions (what a registration costs in requests)."""

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self.transactions: list[Sequence[Op]] = []

    def transaction(self, ops: Sequence[Op]) -> None:
        self.transactions.append(list(ops))
        self._inner.transaction(ops)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def registry(
    metadata: MetadataStore | CountedTransactions,
    blobs: BlobStore,
    clock: ManualClock,
    max_age_ms: int = MAX_AGE_MS,
) -> ProducerRegistry:
    return ProducerRegistry(
        metadata,  # type: ignore[arg-type]
        blobs,
        clock,
        # Payloads in the blob store: the pool serves only registrations too large to be inline.
        ProducerPolicy(default_ttl_ms=24 * HOUR_MS, max_ttl_ms=24 * HOUR_MS, inline_max_bytes=0),
        CoordinatorMetrics(new_registry()),
        intent_max_age_ms=max_age_ms,
    )


def live_intents(metadata: MetadataStore) -> dict[str, tuple[str, ...]]:
    """Every intent in the store -> the keys it announces."""
    found: dict[str, tuple[str, ...]] = {}
    for bucket in metadata.children(intents.ROOT):
        for name in metadata.children(f"{intents.ROOT}/{bucket}"):
            path = f"{intents.ROOT}/{bucket}/{name}"
            node = metadata.get(path)
            if node is not None:
                found[path] = intents.decode(node.data).keys
    return found


def payload_key(metadata: MetadataStore, producer_id: str) -> str:
    node = metadata.get(f"{RECORDS}/{producer_id}")
    assert node is not None
    return str(json.loads(node.data)["object_key"])


def objects(blobs: BlobStore) -> set[str]:
    return {info.key for info in blobs.list("producers/")}


def offsets(n: int) -> list[Offset]:
    return [Offset("s", 0, n)]


def test_a_registration_takes_the_intent_made_ahead_for_it_and_commits_in_one_transaction(
    stores: Stores, clock: ManualClock
) -> None:
    metadata = CountedTransactions(stores.metadata)
    producers = registry(metadata, stores.blobs, clock)
    producers.register("a", offsets(1), 0)  # an empty pool: a batch of one, made for this call
    assert live_intents(stores.metadata) == {}
    producers.register("b", offsets(2), 0)  # the batch was used up: the next one is of two
    ((path, keys),) = live_intents(stores.metadata).items()
    assert keys[0].startswith("producers/") and keys[0] not in objects(stores.blobs)  # not put yet

    metadata.transactions.clear()
    producers.register("c", offsets(3), 0)
    assert len(metadata.transactions) == 1  # the record's commit only, which retires that intent
    assert intents.commit_op(path, intents.CREATED_VERSION) in metadata.transactions[0]
    assert payload_key(stores.metadata, "c") == keys[0]
    assert live_intents(stores.metadata) == {}
    assert {p: producers.get(p).offsets for p in "abc"} == {
        p: tuple(offsets(i + 1)) for i, p in enumerate("abc")
    }
    assert objects(stores.blobs) == {payload_key(stores.metadata, p) for p in "abc"}


def test_pooled_intents_past_their_age_are_never_used_and_the_next_refill_deletes_them(
    stores: Stores, clock: ManualClock
) -> None:
    metadata = CountedTransactions(stores.metadata)
    producers = registry(metadata, stores.blobs, clock)
    producers.register("a", offsets(1), 0)
    producers.register("b", offsets(2), 0)
    ((aged_path, aged_keys),) = live_intents(stores.metadata).items()

    clock.advance(MAX_AGE_MS)  # the sweep claims intents older than the grace: this one may not wait
    metadata.transactions.clear()
    producers.register("c", offsets(3), 0)

    assert payload_key(stores.metadata, "c") != aged_keys[0]
    refill, _ = metadata.transactions  # the aged intent is deleted by the refill, not by a request
    assert intents.commit_op(aged_path, intents.CREATED_VERSION) in refill
    assert stores.metadata.get(aged_path) is None
    assert producers.get("c").offsets == tuple(offsets(3))
    assert aged_path not in live_intents(stores.metadata)
    # What the pool holds now (a smaller batch) announces nothing that was put.
    assert not {k for keys in live_intents(stores.metadata).values() for k in keys} & objects(stores.blobs)
    assert objects(stores.blobs) == {payload_key(stores.metadata, p) for p in "abc"}


class SweepAfterPut:
    """The blob store; after the put of ``victim`` the orphan sweep runs (the registration stalled
    past the grace between its put and its commit)."""

    def __init__(self, inner: BlobStore, metadata: MetadataStore, clock: ManualClock) -> None:
        self._inner, self._metadata, self._clock = inner, metadata, clock
        self.swept: list[int] = []

    def put(self, key: str, data: bytes) -> None:
        self._inner.put(key, data)
        if not self.swept:
            self._clock.advance(2 * HOUR_MS)
            self.swept.append(
                IntentIndex(self._metadata).sweep(self._inner, self._clock.now_ms(), HOUR_MS, 100)
            )

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_a_pooled_intent_the_sweep_claims_in_flight_fails_the_registration_and_is_never_referenced(
    stores: Stores, clock: ManualClock
) -> None:
    producers = registry(stores.metadata, stores.blobs, clock)
    producers.register("a", offsets(1), 0)
    producers.register("b", offsets(2), 0)
    ((_, (pooled_key,)),) = live_intents(stores.metadata).items()
    committed = {p: payload_key(stores.metadata, p) for p in "ab"}

    stalled = registry(stores.metadata, SweepAfterPut(stores.blobs, stores.metadata, clock), clock)  # type: ignore[arg-type]
    stalled._intents = producers._intents  # the same pool: the next registration takes pooled_key
    with pytest.raises(Aborted, match="collected by the orphan sweep"):
        stalled.register("c", offsets(3), 0)

    with pytest.raises(NotFound):
        producers.get("c")  # the commit lost to the sweep's claim: no record
    assert pooled_key not in objects(stores.blobs)  # the sweep deleted what the call had put
    assert live_intents(stores.metadata) == {}
    # The committed registrations' payloads are untouched, and c registers again with a new intent.
    assert objects(stores.blobs) == set(committed.values())
    assert {p: producers.get(p).offsets for p in "ab"} == {"a": tuple(offsets(1)), "b": tuple(offsets(2))}
    assert producers.register("c", offsets(4), 0).registered
    assert producers.get("c").offsets == tuple(offsets(4))


def test_intents_a_stopped_server_left_in_its_pool_are_swept_without_touching_committed_payloads(
    stores: Stores, clock: ManualClock
) -> None:
    producers = registry(stores.metadata, stores.blobs, clock)
    names = [f"sink-{i}" for i in range(6)]
    for i, name in enumerate(names):
        producers.register(name, offsets(i), 0)
    left = live_intents(stores.metadata)
    assert left  # the pool outgrew the demand; the server stops without close()
    assert not {k for keys in left.values() for k in keys} & objects(stores.blobs)

    clock.advance(2 * HOUR_MS)
    assert IntentIndex(stores.metadata).sweep(stores.blobs, clock.now_ms(), HOUR_MS, 100) == len(left)
    assert live_intents(stores.metadata) == {}
    assert objects(stores.blobs) == {payload_key(stores.metadata, n) for n in names}
    for i, name in enumerate(names):
        assert producers.get(name).offsets == tuple(offsets(i))
