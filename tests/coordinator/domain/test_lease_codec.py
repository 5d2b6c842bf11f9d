"""Lease records and pin indexes: decoding is memoised (``domain.leases``), so a decode must give
what the bytes say, whatever was encoded or decoded before, and never hand out shared state."""

from __future__ import annotations

import json

import pytest

from snapcoord.coordinator.domain.leases import (
    Lease,
    SnapshotRef,
    decode_lease,
    decode_pins,
    encode_lease,
    encode_pins,
)
from snapcoord.coordinator.errors import CorruptRecord

A, B = SnapshotRef("a", 1), SnapshotRef("b", 2)


def test_a_lease_decodes_to_what_its_bytes_say_also_when_encoded_out_of_order() -> None:
    unsorted = Lease("job", 60_000, 1_000_000, (B, A), "inc")
    data = encode_lease(unsorted)
    assert data == encode_lease(Lease("job", 60_000, 1_000_000, (A, B), "inc"))
    # The stored order, not the object that was encoded (which decoding would not give back).
    assert decode_lease(data) == Lease("job", 60_000, 1_000_000, (A, B), "inc")
    assert decode_lease(bytes(data)).snapshots == (A, B)  # equal bytes, another object


def test_a_lease_round_trips_and_equal_bytes_decode_alike() -> None:
    lease = Lease("job", 60_000, 2_000_000, (A,), "")
    data = encode_lease(lease)
    assert decode_lease(data) == lease
    assert decode_lease(b"".join([data[:5], data[5:]])) == lease
    renewed = Lease("job", 60_000, 2_000_001, (A,), "")
    assert decode_lease(encode_lease(renewed)) == renewed != decode_lease(data)


def test_decoded_pins_are_a_new_dict_each_time() -> None:
    data = encode_pins({"y": 2, "x": 1})
    assert data == b'{"leases":{"x":1,"y":2},"version":1}'
    first = decode_pins(data)
    first["z"] = 3  # what pin_change does to write the next index
    del first["x"]
    assert decode_pins(data) == {"x": 1, "y": 2}
    assert decode_pins(bytes(data)) == {"x": 1, "y": 2}


def test_holders_changed_after_encoding_do_not_change_what_the_bytes_decode_to() -> None:
    holders = {"x": 1}
    data = encode_pins(holders)
    holders["x"] = 99
    assert decode_pins(data) == {"x": 1}


@pytest.mark.parametrize("data", [b'{"version":1}', b'{"version":1,"leases":[1]}', b"nope"])
def test_a_malformed_pin_index_fails_every_time(data: bytes) -> None:
    for _ in range(2):  # a failure is not memoised as anything
        with pytest.raises(CorruptRecord):
            decode_pins(data)


@pytest.mark.parametrize(
    "holders",
    [
        {},
        {"b": 2, "a": 1_763_960_000_000, "A.b:c-d_e": 0},
        {f"lease-{i}": 1_700_000_000_000 + i for i in range(300)},
        {'q"uote': 1, "back\\slash": 2, "é": 3},  # not ids: encoded by json
        {"flag": True},  # not an int: json writes true
    ],
)
def test_pins_are_encoded_as_sorted_compact_json(holders: dict[str, int]) -> None:
    data = encode_pins(holders)
    expected = {"version": 1, "leases": holders}
    assert data == json.dumps(expected, sort_keys=True, separators=(",", ":")).encode()
    assert json.loads(data) == expected
