"""The blob store interface: immutable payload objects under UUID-style keys.

Payloads are written before the metadata commit that references them and deleted after the
metadata record is gone, so an object may exist without a reference (an orphan, collected later
by the janitor once older than a grace period) but a reference never points at a missing object.
Keys are ``/``-separated, relative to the store's prefix, with no empty, ``.`` or ``..`` segment.
"""

from __future__ import annotations

import abc
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class BlobInfo:
    """One stored object, as listed."""

    key: str
    size: int
    last_modified_ms: int


class BlobStore(abc.ABC):
    """Objects by key: put, get, delete, list."""

    #: The URI the store was opened with, without credentials; safe to log.
    uri: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any object there; visible to ``get`` on return."""

    @abc.abstractmethod
    def put_stream(self, key: str, pieces: Iterable[bytes]) -> None:
        """Store the concatenation of ``pieces`` under ``key``, consuming them one at a time and
        holding at most ``stream_buffer_bytes`` of them (plus the piece in hand) in memory. The
        object appears whole or not at all: an error from ``pieces`` or the store leaves nothing
        under ``key`` (what was sent so far is discarded)."""

    #: Most bytes ``put_stream`` buffers beyond the piece in hand (the payload budget counts them).
    stream_buffer_bytes: int = 0

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The object under ``key``; ``BlobNotFound`` when there is none."""

    @abc.abstractmethod
    def get_stream(self, key: str, chunk_bytes: int) -> Generator[bytes, None, None]:
        """The object under ``key`` in pieces of at most ``chunk_bytes``, read as the caller
        consumes them (never the whole object in memory); ``BlobNotFound`` before the first piece
        when there is none. Close the iterator (or exhaust it) to release the connection or file."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object under ``key``; removing a missing object is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str = "", *, modified_before_ms: int | None = None) -> Iterator[BlobInfo]:
        """Objects whose key starts with ``prefix``, in key order; with ``modified_before_ms``, only
        those last modified before that time (ms since the epoch), as the orphan sweep needs."""

    @abc.abstractmethod
    def check(self) -> None:
        """Prove the store is usable now (reachable, location exists, credentials accepted) with
        one cheap call; ``StoreUnavailable`` says what to fix. The server calls it at start, so a
        wrong bucket or key fails the start instead of the first RPC that needs a payload."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; idempotent."""


def validate_key(key: str) -> str:
    """Return ``key`` or raise ``ValueError`` for a malformed one (a programming error)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"malformed blob key: {key!r}")
    return key
