"""Page tokens and quoted input: any string decodes to a position or to a short INVALID_ARGUMENT."""

from __future__ import annotations

import pytest

from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.paging import (
    decode_generation_token,
    decode_id_token,
    decode_name_token,
    encode_generation_token,
    encode_id_token,
    encode_name_token,
)
from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.domain.snapshots import SnapshotPolicy, validate_report
from snapcoord.coordinator.errors import InvalidArgument

#: Each decoder with a token it must refuse found by fuzzing, and their kin.
HOSTILE = [
    "é",  # non-ASCII makes base64 raise ValueError
    "²",  # isdigit() accepts it, int() refuses it
    "9" * 5000,  # int() refuses more than 4300 digits
    "x" * 1_048_576,  # a 1 MB token
    "\x00",
    "=",
    "a",  # base64 of length 1 is never valid
    "0",
    "-1",
    " 1",
    "1\n",
    "../..",
    "\ud800",  # a lone surrogate (protobuf refuses it on the wire, Python strings allow it)
]
DECODERS = [decode_name_token, decode_generation_token, decode_id_token]


@pytest.mark.parametrize("decode", DECODERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("token", HOSTILE, ids=lambda t: repr(t[:8]) + f"/{len(t)}")
def test_hostile_tokens_are_refused_with_a_short_message(decode: object, token: str) -> None:
    assert callable(decode)
    try:
        value = decode(token)
    except InvalidArgument as e:
        message = str(e)
        assert "page_token" in message and "not a token this server issued" in message
        assert len(message) < 300, message
        return
    # A few hostile strings are valid tokens for one shape (an id token "a"); then they decode.
    assert value not in ("", 0)


@pytest.mark.parametrize("decode", DECODERS, ids=lambda f: f.__name__)
def test_empty_token_is_the_first_page(decode: object) -> None:
    assert callable(decode)
    assert decode("") in ("", 0)


@pytest.mark.parametrize("last", ["p", "producer-1", "a" * 200, "x.y:z_-"])
def test_name_and_id_tokens_round_trip(last: str) -> None:
    assert decode_name_token(encode_name_token(last)) == last
    assert decode_id_token(encode_id_token(last)) == last


@pytest.mark.parametrize("generation", [1, 9, 10**19, 10**20 - 1])
def test_generation_tokens_round_trip(generation: int) -> None:
    assert decode_generation_token(encode_generation_token(generation)) == generation


def test_name_token_of_an_invalid_id_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="not a token this server issued"):
        decode_name_token(encode_name_token(".."))
    with pytest.raises(InvalidArgument, match="not a token this server issued"):
        decode_name_token(encode_name_token("a" * 201))


def test_quote_prefix_bounds_the_quote_and_keeps_the_size() -> None:
    assert quote_prefix("abc") == "'abc'"
    assert quote_prefix("a" * 40) == repr("a" * 40)
    long = quote_prefix("b" * 1_000_000)
    assert long == repr("b" * 40) + "... (1000000 characters)"
    assert quote_prefix("é" * 5, limit=2) == "'éé'... (5 characters)"
    with pytest.raises(ValueError):
        quote_prefix("x", limit=0)


@pytest.mark.parametrize(
    "value", ["é" * 150, "a" * 199 + "/", "ab\u202ecd" * 40, "".join(chr(0x100 + i) for i in range(200))]
)
def test_require_id_quotes_a_prefix_only(value: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        require_id("producer_id", value)
    assert len(str(raised.value)) < 250, str(raised.value)


def test_a_megabyte_checkpoint_key_is_quoted_short() -> None:
    """The checkpoint key is not echoed whole inside the field name."""
    key = "k" * 1_048_576
    with pytest.raises(InvalidArgument) as raised:
        validate_report("app", 1, "t", (), {key: b"x"}, SnapshotPolicy())
    assert "1048576 characters" in str(raised.value)
    assert len(str(raised.value)) < 300
