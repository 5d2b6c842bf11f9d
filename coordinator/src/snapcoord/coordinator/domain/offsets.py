"""Positions in streams, and the rules every list of them follows."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.errors import InvalidArgument

#: A position of -1 means "no data yet" (an empty partition); anything lower is a bug upstream.
NO_DATA = -1
MAX_PARTITION = 2**31 - 1


@dataclass(frozen=True, order=True)
class Offset:
    """A position in one partition of one stream (a Kafka topic-partition, a Fluss bucket...)."""

    stream: str
    partition: int
    offset: int


def validate_offsets(offsets: Iterable[Offset], *, field: str, max_count: int) -> tuple[Offset, ...]:
    """Return ``offsets`` as a tuple, or raise ``InvalidArgument`` naming the first bad item.

    Rules: at least one and at most ``max_count`` entries; each stream a valid identifier; each
    partition 0..2^31-1; each offset >= -1; no (stream, partition) twice (which would make
    "roll back to" ambiguous).
    """
    items = tuple(offsets)
    if not items:
        raise InvalidArgument(f"{field} is empty: give at least one (stream, partition, offset)")
    if len(items) > max_count:
        raise InvalidArgument(f"{field} has {len(items)} entries; the limit is {max_count}")
    seen: dict[tuple[str, int], int] = {}
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        require_id(f"{where}.stream", item.stream)
        if not 0 <= item.partition <= MAX_PARTITION:
            raise InvalidArgument(f"{where}.partition is {item.partition}; partitions are 0 or more")
        if item.offset < NO_DATA:
            raise InvalidArgument(
                f"{where}.offset is {item.offset} for {item.stream}/{item.partition}; "
                "offsets are 0 or more, or -1 for no data"
            )
        key = (item.stream, item.partition)
        if key in seen:
            raise InvalidArgument(
                f"{where} repeats stream {quote_prefix(item.stream)} partition {item.partition} "
                f"(first at {field}[{seen[key]}])"
            )
        seen[key] = i
    return items
