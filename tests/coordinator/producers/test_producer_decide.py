"""Table tests of ``producers.decide``: read results + request in, Done/Commit with ops out. No store."""

from __future__ import annotations

from typing import TypeVar

import pytest

from snapcoord.coordinator.domain.producer_codec import encode_producer_record
from snapcoord.coordinator.domain.producers import ProducerRecord
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.decision import Commit, Decision, Done, Reads
from snapcoord.coordinator.producers import decide
from snapcoord.coordinator.producers.decide import Register, Registered
from snapcoord.coordinator.producers.layout import EXPIRY, RECORDS
from snapcoord.coordinator.storage.metadata import Create, Delete, Node, SetData

R = TypeVar("R")
NOW = 1_000_000
TTL = 60_000
OURS = ProducerRecord("sink", "producers/sink/" + "a" * 32 + ".json", 0, 0)
LIVE = ProducerRecord("sink", "producers/sink/" + "b" * 32 + ".json", NOW - 10, NOW + 500)
EXPIRED = ProducerRecord("sink", "producers/sink/" + "c" * 32 + ".json", NOW - 5_000, NOW - 1)
REQUEST = Register(OURS, TTL, b"offsets")
COMMITTED = ProducerRecord("sink", OURS.object_key, NOW, NOW + TTL)
PATH = f"{RECORDS}/sink"


def reads(record: ProducerRecord | None, version: int = 0) -> Reads:
    node = Node(encode_producer_record(record), version, 0, 0) if record is not None else None
    return Reads({PATH: node})


def index(record: ProducerRecord) -> str:
    return f"{EXPIRY}/{record.expires_at_ms // 60_000}/sink@{record.registration_id}"


def doomed(record: ProducerRecord) -> str:
    """The intent a commit that unreferences ``record``'s payload makes for it (this minute's
    bucket, named after the registration: every attempt of the commit names the same one)."""
    return f"{intents.ROOT}/{NOW // 60_000}/{record.registration_id}"


def doom(record: ProducerRecord) -> Create:
    data = b'{"created_ms":%d,"keys":["%s"],"swept":false,"version":1}' % (NOW, record.object_key.encode())
    return Create(doomed(record), data)


FIRST = Commit(
    [Create(PATH, encode_producer_record(COMMITTED)), Create(index(COMMITTED), b"")],
    Registered(True, COMMITTED),
    uploads={OURS.object_key: b"offsets"},
    buckets=((EXPIRY, NOW + TTL),),
    ensure=(RECORDS,),
)

REGISTER_CASES: list[tuple[str, Reads, Commit[Registered] | None, Decision[Registered]]] = [
    ("no record: create it with its index entry, our upload first", reads(None), None, FIRST),
    ("a live record: return it, write nothing", reads(LIVE, 4), None, Done(Registered(False, LIVE))),
    (
        "an expired record: replace it by version, move the index entry, its payload is garbage",
        reads(EXPIRED, 7),
        None,
        Commit(
            [
                SetData(PATH, encode_producer_record(COMMITTED), 7),
                Delete(index(EXPIRED), None),
                Create(index(COMMITTED), b""),
                doom(EXPIRED),
            ],
            Registered(True, COMMITTED),
            uploads={OURS.object_key: b"offsets"},
            cleanup=(EXPIRED.object_key,),
            withdraw=(doomed(EXPIRED),),
            buckets=((EXPIRY, NOW + TTL), (intents.ROOT, NOW)),
            ensure=(RECORDS,),
        ),
    ),
    (
        "a commit in doubt that landed: ours, keeping the upload",
        reads(COMMITTED),
        FIRST,
        Done(Registered(True, COMMITTED), keep=frozenset({OURS.object_key}), cleanup=()),
    ),
    ("a commit in doubt that did not land: commit it again", reads(None), FIRST, FIRST),
    (
        "a commit in doubt, and another caller's live record: theirs (our upload goes)",
        reads(LIVE),
        FIRST,
        Done(Registered(False, LIVE)),
    ),
]


@pytest.mark.parametrize(
    ("case", "read", "pending", "expected"), REGISTER_CASES, ids=[c[0] for c in REGISTER_CASES]
)
def test_register(
    case: str, read: Reads, pending: Commit[Registered] | None, expected: Decision[Registered]
) -> None:
    assert decide.register(REQUEST, read, pending, NOW) == expected


def unreference(record: ProducerRecord, version: int, result: R) -> Commit[R]:
    """Delete the record and its entry by version; make the intent of its payload, deleted next."""
    return Commit(
        [Delete(PATH, version), Delete(index(record), None), doom(record)],
        result,
        cleanup=(record.object_key,),
        withdraw=(doomed(record),),
        buckets=((intents.ROOT, NOW),),
    )


DELETE_LIVE = unreference(LIVE, 3, True)

DELETE_CASES: list[tuple[str, Reads, Commit[bool] | None, Decision[bool]]] = [
    ("no record", reads(None), None, Done(False)),
    (
        "a live record: delete it and its entry by version, then its payload",
        reads(LIVE, 3),
        None,
        DELETE_LIVE,
    ),
    (
        "an expired record: deleted too, but it was not live",
        reads(EXPIRED, 2),
        None,
        unreference(EXPIRED, 2, False),
    ),
    (
        "a delete in doubt that landed",
        reads(None),
        DELETE_LIVE,
        Done(True, keep=frozenset(), cleanup=(LIVE.object_key,), withdraw=(doomed(LIVE),)),
    ),
    ("a delete in doubt that did not land: again", reads(LIVE, 3), DELETE_LIVE, DELETE_LIVE),
]


@pytest.mark.parametrize(
    ("case", "read", "pending", "expected"), DELETE_CASES, ids=[c[0] for c in DELETE_CASES]
)
def test_delete(case: str, read: Reads, pending: Commit[bool] | None, expected: Decision[bool]) -> None:
    assert decide.delete("sink", read, pending, NOW) == expected


EXPIRE_CASES: list[tuple[str, Reads, str, Decision[decide.Expiry]]] = [
    ("no record: a stale entry", reads(None), EXPIRED.registration_id, Done("stale")),
    ("re-registered since: a stale entry", reads(LIVE), EXPIRED.registration_id, Done("stale")),
    (
        "not expired yet (the current bucket is partly due)",
        reads(LIVE),
        LIVE.registration_id,
        Done("not_due"),
    ),
    (
        "expired: delete it by version with its entry, then its payload",
        reads(EXPIRED, 9),
        EXPIRED.registration_id,
        unreference(EXPIRED, 9, "expired"),
    ),
]


@pytest.mark.parametrize(
    ("case", "read", "registration", "expected"), EXPIRE_CASES, ids=[c[0] for c in EXPIRE_CASES]
)
def test_expire(case: str, read: Reads, registration: str, expected: Decision[decide.Expiry]) -> None:
    assert decide.expire("sink", registration, read, None, NOW) == expected
