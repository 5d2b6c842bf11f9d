"""Protobuf <-> domain conversions shared by the servicers (the only place that knows both)."""

from __future__ import annotations

from collections.abc import Iterable

from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.producers import ProducerSnapshot
from snapcoord.v1 import common_pb2, producer_pb2


def offsets_from_pb(items: Iterable[common_pb2.Offset]) -> list[Offset]:
    return [Offset(stream=o.stream, partition=o.partition, offset=o.offset) for o in items]


def offsets_to_pb(items: Iterable[Offset]) -> list[common_pb2.Offset]:
    return [common_pb2.Offset(stream=o.stream, partition=o.partition, offset=o.offset) for o in items]


def producer_snapshot_to_pb(snapshot: ProducerSnapshot) -> producer_pb2.ProducerSnapshot:
    return producer_pb2.ProducerSnapshot(
        producer_id=snapshot.producer_id,
        offsets=offsets_to_pb(snapshot.offsets),
        created_at_ms=snapshot.created_at_ms,
        expires_at_ms=snapshot.expires_at_ms,
    )
