"""The rules of every producer-record change, as pure functions of what was read.

Each takes the request, the kernel's ``Reads`` (the record node), the commit still in doubt
(``pending``) and the time, and returns ``Done`` or ``Commit`` (see ``kernel.decision``). No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from snapcoord.coordinator.domain.producer_codec import decode_producer_record, encode_producer_record
from snapcoord.coordinator.domain.producers import ProducerRecord
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.decision import Commit, Done, Reads, landed
from snapcoord.coordinator.producers.layout import EXPIRY, RECORDS, index_path, record_path
from snapcoord.coordinator.storage.metadata import Create, Delete, Node, Op, SetData

R = TypeVar("R")


@dataclass(frozen=True)
class Stored:
    """A record as read, with the version a compare-and-set needs."""

    record: ProducerRecord
    version: int


def stored(node: Node | None) -> Stored | None:
    return Stored(decode_producer_record(node.data), node.version) if node is not None else None


@dataclass(frozen=True)
class Register:
    """A registration: ``fresh`` is this call's record (its object key and registration id, made
    once per call so that every round commits the same upload), ``payload`` its offsets."""

    fresh: ProducerRecord
    ttl_ms: int
    payload: bytes


@dataclass(frozen=True)
class Registered:
    """``registered``: this call's record is stored; else ``record`` is the live one found."""

    registered: bool
    record: ProducerRecord


def register(
    request: Register, reads: Reads, pending: Commit[Registered] | None, now: int
) -> Done[Registered] | Commit[Registered]:
    """Create the record unless a live one exists; replace an expired one."""
    key = request.fresh.object_key
    current = stored(reads.node(record_path(request.fresh.producer_id)))
    if pending is not None and current is not None and current.record.object_key == key:
        return landed(pending)
    if current is not None and not current.record.is_expired(now):
        return Done(Registered(False, current.record))
    record = replace(request.fresh, created_at_ms=now, expires_at_ms=now + request.ttl_ms)
    data = encode_producer_record(record)
    if current is None:
        ops: list[Op] = [Create(record_path(record.producer_id), data), Create(index_path(record), b"")]
        return Commit(
            ops,
            Registered(True, record),
            uploads={key: request.payload},
            buckets=((EXPIRY, record.expires_at_ms),),
            ensure=(RECORDS,),
        )
    # SetData, not delete + create: the version check then also fences a janitor that read the
    # expired record and is about to delete it. Its payload becomes garbage.
    doomed, doom = intents.doom([current.record.object_key], now, current.record.registration_id)
    ops = [
        SetData(record_path(record.producer_id), data, current.version),
        Delete(index_path(current.record), None),
        Create(index_path(record), b""),
        doom,
    ]
    return Commit(
        ops,
        Registered(True, record),
        uploads={key: request.payload},
        cleanup=(current.record.object_key,),
        withdraw=(doomed,),
        buckets=((EXPIRY, record.expires_at_ms), (intents.ROOT, now)),
        ensure=(RECORDS,),
    )


def unreference(current: Stored, now: int, result: R) -> Commit[R]:
    """Remove the record and its index entry (the entry names the registration: see layout); its
    payload is deleted after the commit, announced by an intent the commit makes (the pool's keys
    do not name their producer: no listing sweep would find it if that delete never happens)."""
    doomed, doom = intents.doom([current.record.object_key], now, current.record.registration_id)
    ops: list[Op] = [
        Delete(record_path(current.record.producer_id), current.version),
        Delete(index_path(current.record), None),
        doom,
    ]
    return Commit(
        ops, result, cleanup=(current.record.object_key,), withdraw=(doomed,), buckets=((intents.ROOT, now),)
    )


def delete(
    producer_id: str, reads: Reads, pending: Commit[bool] | None, now: int
) -> Done[bool] | Commit[bool]:
    """Delete the record (its payload after the commit); the result says whether it was live."""
    current = stored(reads.node(record_path(producer_id)))
    if pending is not None and (current is None or current.record.object_key not in pending.cleanup):
        return landed(pending)  # the record we deleted is gone
    if current is None:
        return Done(False)
    return unreference(current, now, not current.record.is_expired(now))


Expiry = Literal["expired", "not_due", "stale"]


def expire(
    producer_id: str, registration: str, reads: Reads, pending: Commit[Expiry] | None, now: int
) -> Done[Expiry] | Commit[Expiry]:
    """The janitor's step for one due index entry naming ``producer_id@registration``.

    "stale": the entry names no current registration (re-registered, deleted); "not_due": the
    current minute's bucket is only partly due.
    """
    current = stored(reads.node(record_path(producer_id)))
    if current is None or current.record.registration_id != registration:
        return landed(pending) if pending is not None else Done("stale")
    if not current.record.is_expired(now):
        return Done("not_due")
    return unreference(current, now, "expired")
