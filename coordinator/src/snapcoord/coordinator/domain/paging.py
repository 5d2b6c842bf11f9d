"""Page tokens of the List RPCs: encode what the next page starts after, decode any string safely.

Three shapes are in use, one per registry:

- **name tokens** (ListProducerOffsets): the last listed identifier, URL-safe base64 without
  padding, so the token is opaque to callers;
- **generation tokens** (ListSnapshots): the last listed generation, in decimal;
- **id tokens** (ListLeases): the last listed identifier itself.

A token is caller input: decoding takes any string (however long, non-ASCII or otherwise odd)
and either returns the position or raises ``InvalidArgument`` quoting only a short prefix of it.
Every check runs on the length first, so a 1 MB token costs no parsing.
"""

from __future__ import annotations

import base64
import binascii
import re

from snapcoord.coordinator.domain.ids import MAX_ID_LENGTH, is_valid_id
from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.errors import InvalidArgument

#: Generations are stored zero-padded to 20 digits; a token never has more.
MAX_GENERATION_DIGITS = 20
#: Base64 of an identifier of at most MAX_ID_LENGTH ASCII bytes, without padding.
MAX_NAME_TOKEN_LENGTH = -(-MAX_ID_LENGTH * 4 // 3)

# ASCII only: str.isdigit() accepts "²" and other digits int() then refuses or misreads.
_GENERATION_RE = re.compile(r"[1-9][0-9]*")
_BASE64URL_RE = re.compile(r"[A-Za-z0-9_-]+")


def not_issued(token: str) -> InvalidArgument:
    """The one error for a token this server did not issue."""
    return InvalidArgument(
        f"page_token {quote_prefix(token)} is not a token this server issued; pass the "
        "next_page_token of the previous page unchanged, or an empty token for the first page"
    )


def encode_name_token(last: str) -> str:
    """The token of the page after identifier ``last``."""
    return base64.urlsafe_b64encode(last.encode()).decode().rstrip("=")


def decode_name_token(token: str) -> str:
    """The identifier a name token starts after; ``""`` for the first page."""
    if not token:
        return ""
    if len(token) > MAX_NAME_TOKEN_LENGTH or not _BASE64URL_RE.fullmatch(token):
        raise not_issued(token)
    try:
        last = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        raise not_issued(token) from None
    if not is_valid_id(last):
        raise not_issued(token)
    return last


def encode_generation_token(last: int) -> str:
    """The token of the page after generation ``last`` (newest first: the next page is older)."""
    return str(last)


def decode_generation_token(token: str) -> int:
    """The generation a generation token starts below; 0 for the first page."""
    if not token:
        return 0
    if len(token) > MAX_GENERATION_DIGITS or not _GENERATION_RE.fullmatch(token):
        raise not_issued(token)
    return int(token)


def encode_id_token(last: str) -> str:
    """The token of the page after identifier ``last`` (the identifier itself)."""
    return last


def decode_id_token(token: str) -> str:
    """The identifier an id token starts after; ``""`` for the first page."""
    if not token:
        return ""
    if len(token) > MAX_ID_LENGTH or not is_valid_id(token):
        raise not_issued(token)
    return token
