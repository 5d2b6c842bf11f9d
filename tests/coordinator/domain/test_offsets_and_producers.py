"""Validation rules of offsets and producer registrations (pure, no I/O)."""

from __future__ import annotations

import pytest

from snapcoord.coordinator.domain.offsets import Offset, validate_offsets
from snapcoord.coordinator.domain.producers import (
    ProducerPolicy,
    new_record,
    parse_index_entry,
    producer_of_object,
    resolve_ttl,
    validate_registration,
)
from snapcoord.coordinator.errors import InvalidArgument
from snapcoord.coordinator.kernel.expiry_index import BUCKET_MS as EXPIRY_BUCKET_MS

POLICY = ProducerPolicy(default_ttl_ms=1_000, max_ttl_ms=10_000, max_offsets=3)


def test_valid_offsets_pass_through_in_order() -> None:
    items = [Offset("orders", 1, 5), Offset("orders", 0, -1), Offset("clicks", 0, 0)]
    assert validate_offsets(items, field="offsets", max_count=3) == tuple(items)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "offsets is empty"),
        ([Offset("a", 0, 0)] * 4, "offsets has 4 entries; the limit is 3"),
        ([Offset("a", 0, 0), Offset("b", 0, -2)], "offsets[1].offset is -2 for b/0"),
        ([Offset("a", -1, 0)], "offsets[0].partition is -1"),
        ([Offset("a/b", 0, 0)], "offsets[0].stream 'a/b' contains '/'"),
        ([Offset("", 0, 0)], "offsets[0].stream is required"),
        (
            [Offset("a", 3, 0), Offset("b", 3, 0), Offset("a", 3, 7)],
            "offsets[2] repeats stream 'a' partition 3",
        ),
    ],
)
def test_bad_offsets_name_the_offending_item(items: list[Offset], message: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^" + message.replace("[", r"\[").replace("]", r"\]")):
        validate_offsets(items, field="offsets", max_count=3)


def test_ttl_zero_is_the_default_and_the_maximum_is_enforced() -> None:
    assert resolve_ttl(0, POLICY) == 1_000
    assert resolve_ttl(10_000, POLICY) == 10_000
    with pytest.raises(InvalidArgument, match="at most 10000 ms"):
        resolve_ttl(10_001, POLICY)
    with pytest.raises(InvalidArgument, match="ttl_ms is -5"):
        resolve_ttl(-5, POLICY)


def test_registration_checks_the_producer_id() -> None:
    with pytest.raises(InvalidArgument, match=r"producer_id must not be '\.\.'"):
        validate_registration("..", [Offset("a", 0, 0)], 0, POLICY)
    assert validate_registration("sink-1", [Offset("a", 0, 0)], 0, POLICY) == ((Offset("a", 0, 0),), 1_000)


def test_records_name_their_registration_after_the_payload_key() -> None:
    first = new_record(
        "sink:1", 5 * EXPIRY_BUCKET_MS + 10, EXPIRY_BUCKET_MS, "producers/" + "a" * 32 + ".json"
    )
    second = new_record(
        "sink:1", 5 * EXPIRY_BUCKET_MS + 10, EXPIRY_BUCKET_MS, "producers/" + "b" * 32 + ".json"
    )
    assert (first.registration_id, second.registration_id) == ("a" * 32, "b" * 32)
    assert first.index_entry != second.index_entry
    assert first.expires_at_ms == 6 * EXPIRY_BUCKET_MS + 10
    assert parse_index_entry(first.index_entry) == ("sink:1", first.registration_id)
    # The listing sweep judges only keys named after their producer (written before the intent
    # pool); the pool's keys are its intents' to sweep.
    assert producer_of_object("producers/sink:1/" + "c" * 32 + ".json") == "sink:1"
    assert producer_of_object(first.object_key) is None
    assert producer_of_object("snapshots/app/1/x") is None
    assert parse_index_entry("no-separator") is None
    assert first.is_expired(first.expires_at_ms) and not first.is_expired(first.expires_at_ms - 1)
