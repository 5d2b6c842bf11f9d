"""Producer offset snapshots: the rules, without I/O.

A sink that starts without a checkpoint registers the positions it starts writing from; if a
record exists already, a previous attempt died before its first checkpoint and the sink rolls
back to the stored positions; after its first checkpoint it deletes the record. A TTL guards
records nobody deletes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.offsets import Offset, validate_offsets
from snapcoord.coordinator.errors import InvalidArgument

#: The most ``ProducerPolicy.inline_max_bytes`` and ``SnapshotPolicy.inline_checkpoint_max_bytes``
#: may be: a record this large, with the ops around it (an advance also deletes a record and makes
#: intents), stays far below the smallest ZooKeeper request limit the server accepts
#: (``--zk-max-request-bytes``, at least 1 MiB); ``server.worst_requests`` checks the exact sizes.
MAX_INLINE_BYTES = 64 * 1024


@dataclass(frozen=True)
class ProducerPolicy:
    """Server-side limits, from the configuration (``config.options.OPTIONS`` names the option of
    each field). A field's default here is its option's default: the option reads it."""

    #: TTL of a record registered with ttl_ms=0.
    default_ttl_ms: int = 24 * 3_600_000
    #: Largest ttl_ms a caller may ask for; beyond it INVALID_ARGUMENT.
    max_ttl_ms: int = 7 * 24 * 3_600_000
    #: Most offsets in one registration.
    max_offsets: int = 100_000
    #: Offsets whose stored form (``producer_codec.inline_offsets_bytes``) is at most this many
    #: bytes live inline in the record in ZooKeeper, so their calls make no S3 request; larger ones
    #: go to the blob store. 0 stores every payload in the blob store (the format older releases
    #: read: see docs/design.md on rolling it out). ZooKeeper holds every record in memory on every
    #: node, so this bounds what producer records cost there: records x this.
    inline_max_bytes: int = 1024


@dataclass(frozen=True)
class ProducerRecord:
    """What the metadata store holds for one producer: small, with either its offsets (``inline``)
    or a pointer to the payload object that holds them (``object_key``; empty for inline ones)."""

    producer_id: str
    object_key: str
    created_at_ms: int
    expires_at_ms: int
    #: The offsets of an inline record; None when they are in the object ``object_key``.
    inline: tuple[Offset, ...] | None = None
    #: The registration's UUID for an inline record (one in the blob store is named by its key).
    inline_registration: str = ""
    #: SHA-256 (hex) of the payload object, checked when it is read; empty in records written
    #: before it was recorded (their payloads are read unchecked) and in inline ones.
    payload_sha256: str = ""

    def is_expired(self, now_ms: int) -> bool:
        return now_ms >= self.expires_at_ms

    @property
    def objects(self) -> tuple[str, ...]:
        """The blob store objects this record references (none for an inline one)."""
        return (self.object_key,) if self.inline is None else ()

    @property
    def registration_id(self) -> str:
        """Unique per registration (a UUID: the payload's, or an inline record's own): tells two
        records of one producer apart."""
        if self.inline is not None:
            return self.inline_registration
        return self.object_key.rsplit("/", 1)[-1].removesuffix(".json")

    @property
    def index_entry(self) -> str:
        """The name of this registration's entry in its expiry bucket."""
        return f"{self.producer_id}@{self.registration_id}"


@dataclass(frozen=True)
class ProducerSnapshot:
    """A registered record with its offsets, as callers see it."""

    producer_id: str
    offsets: tuple[Offset, ...]
    created_at_ms: int
    expires_at_ms: int


@dataclass(frozen=True)
class Registration:
    """The outcome of a register call: ``registered`` is True for exactly one caller."""

    registered: bool
    snapshot: ProducerSnapshot


def validate_registration(
    producer_id: str, offsets: Iterable[Offset], ttl_ms: int, policy: ProducerPolicy
) -> tuple[tuple[Offset, ...], int]:
    """Check a register request; return the offsets and the effective TTL in ms."""
    require_id("producer_id", producer_id)
    items = validate_offsets(offsets, field="offsets", max_count=policy.max_offsets)
    return items, resolve_ttl(ttl_ms, policy)


def resolve_ttl(ttl_ms: int, policy: ProducerPolicy) -> int:
    """0 means the server default; otherwise 1 ms up to the configured maximum."""
    if ttl_ms == 0:
        return policy.default_ttl_ms
    if ttl_ms < 0:
        raise InvalidArgument(f"ttl_ms is {ttl_ms}; give a positive TTL, or 0 for the server default")
    if ttl_ms > policy.max_ttl_ms:
        raise InvalidArgument(f"ttl_ms is {ttl_ms}; the server allows at most {policy.max_ttl_ms} ms")
    return ttl_ms


def new_record(
    producer_id: str, now_ms: int, ttl_ms: int, object_key: str, payload_sha256: str = ""
) -> ProducerRecord:
    """A record for a new registration; ``object_key`` is fresh (UUID-named, never reused): the
    registry takes it from its intent pool (``producers/<uuid>.json``). ``payload_sha256``: the
    digest of the payload put there, which every read of it checks."""
    return ProducerRecord(
        producer_id=producer_id,
        object_key=object_key,
        created_at_ms=now_ms,
        expires_at_ms=now_ms + ttl_ms,
        payload_sha256=payload_sha256,
    )


def new_inline_record(
    producer_id: str, now_ms: int, ttl_ms: int, offsets: tuple[Offset, ...], registration: str
) -> ProducerRecord:
    """A record for a new registration whose offsets live in the record; ``registration`` is a
    fresh UUID (never reused)."""
    return ProducerRecord(
        producer_id=producer_id,
        object_key="",
        created_at_ms=now_ms,
        expires_at_ms=now_ms + ttl_ms,
        inline=offsets,
        inline_registration=registration,
    )


def parse_index_entry(name: str) -> tuple[str, str] | None:
    """``producer@registration`` -> (producer_id, registration_id); None for a foreign name."""
    producer_id, sep, registration_id = name.rpartition("@")
    return (producer_id, registration_id) if sep and producer_id and registration_id else None


def producer_of_object(key: str) -> str | None:
    """The producer id of a payload key ``producers/<id>/<uuid>.json`` (the naming of releases
    without the intent pool), for the listing sweep; None for other keys, among them the pool's
    ``producers/<uuid>.json`` (announced by an intent, which the intent sweep follows)."""
    parts = key.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "producers" and parts[2].endswith(".json") else None
