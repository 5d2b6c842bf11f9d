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
T = TypeVar("T")


@dataclass(frozen=True)
class Stored:
    """A record as read, with the version a compare-and-set needs."""

    record: ProducerRecord
    version: int


def stored(node: Node | None) -> Stored | None:
    return Stored(decode_producer_record(node.data), node.version) if node is not None else None


@dataclass(frozen=True)
class Register:
    """A registration: ``fresh`` is this call's record (its registration id, and its object key
    when not inline, made once per call so that every round commits the same record), ``payload``
    the offsets to upload for a record that is not inline (None for an inline one)."""

    fresh: ProducerRecord
    ttl_ms: int
    payload: bytes | None


@dataclass(frozen=True)
class Registered:
    """``registered``: this call's record is stored; else ``record`` is the live one found."""

    registered: bool
    record: ProducerRecord


@dataclass(frozen=True)
class Advanced:
    """The outcome of an advance: the registration's, and whether a live previous record went."""

    registration: Registered
    previous_deleted: bool


def register(
    request: Register, reads: Reads, pending: Commit[Registered] | None, now: int
) -> Done[Registered] | Commit[Registered]:
    """Create the record unless a live one exists; replace an expired one."""
    current = stored(reads.node(record_path(request.fresh.producer_id)))
    if pending is not None and _is_fresh(current, request):
        return landed(pending)
    if current is not None and not current.record.is_expired(now):
        return Done(Registered(False, current.record))
    return _store(request, current, now)


def _is_fresh(current: Stored | None, request: Register) -> bool:
    return current is not None and current.record.registration_id == request.fresh.registration_id


def _store(request: Register, current: Stored | None, now: int) -> Commit[Registered]:
    """The commit that stores this call's record, in place of ``current`` (absent or expired)."""
    record = replace(request.fresh, created_at_ms=now, expires_at_ms=now + request.ttl_ms)
    data = encode_producer_record(record)
    uploads = {record.object_key: request.payload} if request.payload is not None else {}
    if current is None:
        ops: list[Op] = [Create(record_path(record.producer_id), data), Create(index_path(record), b"")]
        return Commit(
            ops,
            Registered(True, record),
            uploads=uploads,
            buckets=((EXPIRY, record.expires_at_ms),),
            ensure=(RECORDS,),
        )
    # SetData, not delete + create: the version check then also fences a janitor that read the
    # expired record and is about to delete it. Its payload (if any) becomes garbage.
    ops = [
        SetData(record_path(record.producer_id), data, current.version),
        Delete(index_path(current.record), None),
        Create(index_path(record), b""),
    ]
    released = _release(current, now)
    return Commit(
        [*ops, *released.ops],
        Registered(True, record),
        uploads=uploads,
        cleanup=released.cleanup,
        withdraw=released.withdraw,
        buckets=((EXPIRY, record.expires_at_ms), *released.buckets),
        ensure=(RECORDS,),
    )


def _release(current: Stored, now: int) -> Commit[None]:
    """What unreferencing ``current``'s payload object takes (nothing for an inline record): the
    object is deleted after the commit, announced by an intent the commit makes (the pool's keys do
    not name their producer: no listing sweep would find it if that delete never happens)."""
    objects = current.record.objects
    if not objects:
        return Commit((), None)
    doomed, doom = intents.doom(list(objects), now, current.record.registration_id)
    return Commit((doom,), None, cleanup=objects, withdraw=(doomed,), buckets=((intents.ROOT, now),))


def unreference(current: Stored, now: int, result: R) -> Commit[R]:
    """Remove the record and its index entry (the entry names the registration: see layout), and
    release its payload object if it has one (``_release``)."""
    released = _release(current, now)
    ops: list[Op] = [
        Delete(record_path(current.record.producer_id), current.version),
        Delete(index_path(current.record), None),
        *released.ops,
    ]
    return Commit(ops, result, cleanup=released.cleanup, withdraw=released.withdraw, buckets=released.buckets)


def _unreferenced_by(pending: Commit[R], current: Stored | None) -> bool:
    """True when ``pending`` (a commit in doubt) removed ``current``'s registration, or when there
    is no record left: the index entry named after the registration is among its deletes."""
    if current is None:
        return True
    entry = index_path(current.record)
    return any(isinstance(op, Delete) and op.path == entry for op in pending.ops)


def delete(
    producer_id: str, reads: Reads, pending: Commit[bool] | None, now: int
) -> Done[bool] | Commit[bool]:
    """Delete the record (its payload after the commit); the result says whether it was live."""
    current = stored(reads.node(record_path(producer_id)))
    if pending is not None and (current is None or not _unreferenced_by(pending, current)):
        return landed(pending)  # the record we deleted is gone
    if current is None:
        return Done(False)
    return unreference(current, now, not current.record.is_expired(now))


def advance(
    request: Register, previous_id: str, reads: Reads, pending: Commit[Advanced] | None, now: int
) -> Done[Advanced] | Commit[Advanced]:
    """Delete ``previous_id``'s record and register ``request`` in one transaction; a live record of
    the registered producer is kept (not registered), and the previous one is deleted all the same."""
    current = stored(reads.node(record_path(request.fresh.producer_id)))
    previous = stored(reads.node(record_path(previous_id)))
    if pending is not None:
        if pending.result.registration.registered:
            if _is_fresh(current, request):
                return landed(pending)
        elif previous is None or not _unreferenced_by(pending, previous):
            return landed(pending)
    if current is not None and not current.record.is_expired(now):
        stored_record: Commit[Registered] | Done[Registered] = Done(Registered(False, current.record))
    else:
        stored_record = _store(request, current, now)
    if previous is None:
        if isinstance(stored_record, Done):
            return Done(Advanced(stored_record.result, False))
        return _with_result(stored_record, Advanced(stored_record.result, False))
    dropped = unreference(previous, now, not previous.record.is_expired(now))
    if isinstance(stored_record, Done):
        return _with_result(dropped, Advanced(stored_record.result, dropped.result))
    return Commit(
        [*dropped.ops, *stored_record.ops],
        Advanced(stored_record.result, dropped.result),
        uploads=stored_record.uploads,
        cleanup=(*dropped.cleanup, *stored_record.cleanup),
        withdraw=(*dropped.withdraw, *stored_record.withdraw),
        buckets=(*dropped.buckets, *stored_record.buckets),
        ensure=stored_record.ensure,
    )


def _with_result(commit: Commit[T], result: R) -> Commit[R]:
    return Commit(
        commit.ops,
        result,
        uploads=commit.uploads,
        cleanup=commit.cleanup,
        withdraw=commit.withdraw,
        buckets=commit.buckets,
        ensure=commit.ensure,
    )


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
