"""The stored formats of commit claims are pinned (golden bytes, format version 1), and the pure
rules of ``domain.claims``: validation and the janitor's choice of what may go."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapcoord.coordinator.domain.claims import (
    MAX_ATTEMPT_LENGTH,
    CommitClaim,
    TableRecord,
    removable,
    require_attempt,
)
from snapcoord.coordinator.domain.claims_codec import decode_claim, decode_table, encode_claim, encode_table
from snapcoord.coordinator.errors import InvalidArgument, NewerFormat

GOLDEN = Path(__file__).parent / "golden"
TABLE = TableRecord("orders-table", 3, 42, 1_700_000_000_000, 57, 12)
CLAIM = CommitClaim(42, 3, "fence", 1_700_000_000_000)


def test_the_table_record_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "commit_claim_table_v1.json").read_bytes()
    assert encode_table(TABLE) == golden
    assert decode_table(golden) == TABLE


def test_the_claim_v1_bytes_are_pinned() -> None:
    golden = (GOLDEN / "commit_claim_v1.json").read_bytes()
    assert encode_claim(CLAIM) == golden
    assert decode_claim(golden) == CLAIM


def test_a_newer_format_is_refused_as_newer_not_corrupt() -> None:
    with pytest.raises(NewerFormat) as e:
        decode_claim(encode_claim(CLAIM).replace(b'"version":1', b'"version":2'))
    assert (e.value.kind, e.value.version, e.value.supported) == ("commit_claim", 2, 1)


@pytest.mark.parametrize("attempt", ["a", "fence", "run-7:batch.12_x", "z" * MAX_ATTEMPT_LENGTH])
def test_valid_attempts(attempt: str) -> None:
    assert require_attempt(attempt) == attempt


@pytest.mark.parametrize(
    ("attempt", "message"),
    [
        ("", "attempt is required"),
        ("z" * (MAX_ATTEMPT_LENGTH + 1), "65 characters long; the limit is 64"),
        ("a/b", "contains '/'"),
        ("é", "allowed characters are"),
        ("x" * 100_000, "100000 characters long"),
    ],
)
def test_invalid_attempts_say_what_is_wrong_briefly(attempt: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as e:
        require_attempt(attempt)
    assert len(str(e.value)) < 200


def claims_at(*times: int) -> list[CommitClaim]:
    return [CommitClaim(seq, 1, f"b{seq}", at) for seq, at in enumerate(times)]


def test_removable_is_the_old_run_from_the_lowest_below_the_highest() -> None:
    record = TableRecord("t", highest_seq=4)
    old = claims_at(0, 0, 0, 0, 0)
    assert removable(record, old, now_ms=100, retention_ms=100) == [0, 1, 2, 3]  # never 4, the highest
    assert removable(record, old, now_ms=99, retention_ms=100) == []
    assert removable(record, claims_at(0, 0, 50, 0, 0), now_ms=100, retention_ms=100) == [0, 1]
    assert removable(record, claims_at(0, 0, 500, 0, 0), now_ms=100, retention_ms=100) == [0, 1]  # future
    assert removable(record, list(reversed(old)), now_ms=100, retention_ms=100) == [0, 1, 2, 3]
    # A table record whose highest is above every claim read (more claims exist): all may go.
    assert removable(TableRecord("t", highest_seq=9), old, now_ms=100, retention_ms=100) == [0, 1, 2, 3, 4]
