"""Table tests of ``leases.decide``: read results + request in, Done/Commit/More with ops out. No store."""

from __future__ import annotations

import pytest

from snapcoord.coordinator.domain.leases import (
    Lease,
    LeasePolicy,
    SnapshotRef,
    decode_pins,
    encode_lease,
    encode_pins,
)
from snapcoord.coordinator.domain.snapshot_codec import encode_snapshot
from snapcoord.coordinator.domain.snapshots import SnapshotRecord, State
from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, NotFound, Reason
from snapcoord.coordinator.kernel.decision import Commit, Decision, Done, More, ReadNode, Reads
from snapcoord.coordinator.snapshots.layout import RETENTION
from snapcoord.coordinator.snapshots.leases import decide
from snapcoord.coordinator.snapshots.leases.decide import Acquired, Clocks, Released
from snapcoord.coordinator.snapshots.leases.layout import EXPIRY, RECORDS
from snapcoord.coordinator.snapshots.pins import PINS, pin_change, pin_path, snapshot_path
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, SetData

NOW = 6_000_000
SKEW = 1_000
MINUTE = 60_000
CLOCKS = Clocks(NOW, "nonce", LeasePolicy(max_clock_skew_ms=SKEW))
A = SnapshotRef("a", 1)
B = SnapshotRef("b", 2)
RECORD = f"{RECORDS}/job"


HEADER = encode_snapshot(SnapshotRecord("a", 1, State.COMPLETED, ("t",), 1, 1, 2, 2, 3, 0, (), ""))


def node(data: bytes, version: int = 0) -> Node:
    return Node(data, version, 0, 0)


def entry(lease: Lease) -> str:
    return f"{EXPIRY}/{(lease.expires_at_ms + SKEW) // MINUTE}/job"


def lease_reads(lease: Lease | None, version: int = 0, **nodes: Node | None) -> Reads:
    stored = {RECORD: node(encode_lease(lease), version) if lease is not None else None}
    return Reads({**stored, **{k.replace("__", "/"): v for k, v in nodes.items()}})


def with_nodes(reads: Reads, pairs: dict[str, Node | None]) -> Reads:
    return reads.merged(Reads(pairs))


NEW = Lease("job", 30_000, NOW + 30_000, (A,), "nonce")  # a new record: this call's nonce


def test_acquire_reads_headers_and_pins_after_the_lease() -> None:
    assert decide.acquire("job", 30_000, (A, B), lease_reads(None), None, CLOCKS) == More(
        [
            ReadNode(snapshot_path("a", 1)),
            ReadNode(snapshot_path("b", 2)),
            ReadNode(pin_path("a", 1)),
            ReadNode(pin_path("b", 2)),
        ]
    )


ACQUIRE_NEW = Commit(
    [
        Check(snapshot_path("a", 1), 4),
        Create(pin_path("a", 1), encode_pins({"job": NOW + 30_000})),
        Create(RECORD, encode_lease(NEW)),
        Create(f"{RECORD}/nonce", b""),
        Create(entry(NEW), b""),
    ],
    Acquired(NEW, (B,)),
    buckets=((EXPIRY, NOW + 30_000 + SKEW),),
    ensure=(RECORDS, PINS),
)
EXPIRED = Lease("job", 30_000, NOW - 5_000, (B,), "i1")
RENEWED = Lease("job", 30_000, NOW + 30_000, (A,), "i1")  # the record's incarnation stays
ACQUIRE_CASES: list[tuple[str, Reads, Commit[Acquired] | None, Decision[Acquired]]] = [
    (
        "a new lease: pin what exists (checking its header), report the rest unavailable",
        with_nodes(
            lease_reads(None),
            {
                snapshot_path("a", 1): node(HEADER, 4),
                snapshot_path("b", 2): None,
                pin_path("a", 1): None,
                pin_path("b", 2): None,
            },
        ),
        None,
        ACQUIRE_NEW,
    ),
    (
        "an expired lease counts as absent: its old pins go, and retention looks at their apps",
        with_nodes(
            lease_reads(EXPIRED, 6),
            {
                snapshot_path("a", 1): node(HEADER, 4),
                pin_path("a", 1): None,
                pin_path("b", 2): node(encode_pins({"job": NOW - 5_000, "other": NOW + 1}), 2),
            },
        ),
        None,
        Commit(
            [
                Check(snapshot_path("a", 1), 4),
                Create(pin_path("a", 1), encode_pins({"job": NOW + 30_000})),
                SetData(pin_path("b", 2), encode_pins({"other": NOW + 1}), 2),
                Check(f"{RECORD}/i1", 0),
                SetData(RECORD, encode_lease(RENEWED), 6),
                Delete(entry(EXPIRED), None),
                Create(entry(NEW), b""),
                Create(f"{RETENTION}/{NOW // MINUTE}/b@unpinned-nonce", b""),
            ],
            Acquired(RENEWED, ()),
            buckets=((EXPIRY, NOW + 30_000 + SKEW), (RETENTION, NOW)),
            ensure=(RECORDS, PINS),
        ),
    ),
    (
        "an expired lease asking again for a snapshot of its dead term: one write to that index",
        with_nodes(
            lease_reads(Lease("job", 30_000, NOW - 5_000, (A,), "i1"), 6),
            {
                snapshot_path("a", 1): node(HEADER, 4),
                pin_path("a", 1): node(encode_pins({"job": NOW - 5_000, "other": NOW + 1}), 2),
            },
        ),
        None,
        Commit(
            [
                Check(snapshot_path("a", 1), 4),
                SetData(pin_path("a", 1), encode_pins({"job": NOW + 30_000, "other": NOW + 1}), 2),
                Check(f"{RECORD}/i1", 0),
                SetData(RECORD, encode_lease(RENEWED), 6),
                Delete(entry(EXPIRED), None),
                Create(entry(NEW), b""),
            ],
            Acquired(RENEWED, ()),
            buckets=((EXPIRY, NOW + 30_000 + SKEW),),
            ensure=(RECORDS, PINS),
        ),
    ),
    (
        "an acquire in doubt that landed: ours",
        lease_reads(NEW, 0),
        ACQUIRE_NEW,
        Done(Acquired(NEW, (B,)), keep=frozenset(), cleanup=()),
    ),
]


@pytest.mark.parametrize(
    ("case", "reads", "pending", "expected"), ACQUIRE_CASES, ids=[c[0] for c in ACQUIRE_CASES]
)
def test_acquire(
    case: str, reads: Reads, pending: Commit[Acquired] | None, expected: Decision[Acquired]
) -> None:
    wanted = (A,) if "expired" in case else (A, B)
    assert decide.acquire("job", 30_000, wanted, reads, pending, CLOCKS) == expected


HELD = Lease("job", 30_000, NOW + 10_000, (A, B), "i1")


def test_release_unpins_deleting_an_empty_index() -> None:
    reads = with_nodes(lease_reads(HELD, 3), {pin_path("a", 1): node(encode_pins({"job": NOW + 10_000}), 5)})
    after = Lease("job", 30_000, NOW + 10_000, (B,), "i1")
    assert decide.release("job", frozenset({A, SnapshotRef("c", 9)}), reads, None, CLOCKS) == Commit(
        [
            Delete(pin_path("a", 1), 5),
            Check(f"{RECORD}/i1", 0),
            SetData(RECORD, encode_lease(after), 3),
            Create(f"{RETENTION}/{NOW // MINUTE}/a@unpinned-nonce", b""),
        ],
        Released(after, frozenset({A})),
        buckets=((EXPIRY, NOW + 10_000 + SKEW), (RETENTION, NOW)),
        ensure=(RECORDS, PINS),
    )


def test_renew_writes_the_record_and_moves_its_expiry_entry_and_nothing_else() -> None:
    """One transaction on the lease's own nodes, with no pin index read first: the indexes keep
    the expiry the lease pinned with (``pins``), so holders of one snapshot never collide renewing."""
    reads = lease_reads(HELD, 3)
    renewed = Lease("job", 600_000, NOW + 600_000, (A, B), "i1")
    assert decide.renew("job", 600_000, reads, None, CLOCKS) == Commit(
        [
            Check(f"{RECORD}/i1", 0),  # a record dropped and acquired again fails the renew
            SetData(RECORD, encode_lease(renewed), 3),
            Delete(entry(HELD), None),
            Create(entry(renewed), b""),
        ],
        renewed,
        buckets=((EXPIRY, NOW + 600_000 + SKEW),),
        ensure=(RECORDS, PINS),
    )
    assert not any(r.startswith(PINS) for r in reads.nodes)


@pytest.mark.parametrize(
    ("case", "lease", "reason"),
    [
        ("no lease", None, Reason.NOT_FOUND),
        ("expired past the skew margin", Lease("job", 1, NOW - SKEW, ()), Reason.EXPIRED),
    ],
)
def test_release_and_renew_need_a_live_lease(case: str, lease: Lease | None, reason: Reason) -> None:
    for call in (
        lambda: decide.release("job", frozenset({A}), lease_reads(lease), None, CLOCKS),
        lambda: decide.renew("job", 1_000, lease_reads(lease), None, CLOCKS),
    ):
        with pytest.raises(NotFound) as raised:
            call()
        assert raised.value.reason is reason


REMOVE_CASES: list[tuple[str, Lease | None, bool, Decision[decide.Removal]]] = [
    ("drop: no lease", None, False, Done("absent")),
    (
        "expire: still alive (within the skew margin)",
        Lease("job", 1, NOW - SKEW + 1, ()),
        True,
        Done("alive"),
    ),
    (
        "drop a live lease without pins",
        Lease("job", 1, NOW + 5, ()),
        False,
        Commit(
            [Delete(RECORD, 2), Delete(entry(Lease("job", 1, NOW + 5, ())), None)],
            "alive",
            ensure=(RECORDS, PINS),
        ),
    ),
    (
        "drop a live lease with its incarnation: the child goes first (no delete of a parent)",
        Lease("job", 1, NOW + 5, (), "i1"),
        False,
        Commit(
            [
                Delete(f"{RECORD}/i1", 0),
                Delete(RECORD, 2),
                Delete(entry(Lease("job", 1, NOW + 5, ())), None),
            ],
            "alive",
            ensure=(RECORDS, PINS),
        ),
    ),
    (
        "expire an expired lease without pins",
        Lease("job", 1, NOW - SKEW, ()),
        True,
        Commit(
            [Delete(RECORD, 2), Delete(entry(Lease("job", 1, NOW - SKEW, ())), None)],
            "removed",
            ensure=(RECORDS, PINS),
        ),
    ),
]


@pytest.mark.parametrize(
    ("case", "lease", "only_expired", "expected"), REMOVE_CASES, ids=[c[0] for c in REMOVE_CASES]
)
def test_remove(
    case: str, lease: Lease | None, only_expired: bool, expected: Decision[decide.Removal]
) -> None:
    assert decide.remove("job", lease_reads(lease, 2), None, CLOCKS, only_expired=only_expired) == expected


def test_remove_takes_the_lease_out_of_its_pins() -> None:
    lease = Lease("job", 1, NOW + 5, (A,))
    assert decide.remove("job", lease_reads(lease, 2), None, CLOCKS, only_expired=False) == More(
        [ReadNode(pin_path("a", 1))]
    )
    reads = with_nodes(
        lease_reads(lease, 2), {pin_path("a", 1): node(encode_pins({"job": NOW + 5, "x": NOW}), 7)}
    )
    decision = decide.remove("job", reads, None, CLOCKS, only_expired=False)
    assert isinstance(decision, Commit)
    assert decision.ops[0] == SetData(pin_path("a", 1), encode_pins({"x": NOW}), 7)
    assert decision.ops[-1] == Create(f"{RETENTION}/{NOW // MINUTE}/a@unpinned-nonce", b"")


def test_acquire_refuses_a_deleting_snapshot_and_too_many_holders_and_snapshots() -> None:
    """A DELETING snapshot comes back unavailable (its deletion checked the pins already); a
    snapshot held by max_holders other live leases, or a lease beyond max_snapshots, is refused
    (every legal acquire fits a ZooKeeper request). A holder listed as expired counts too:
    only the janitor's expiry, with the record, takes it out (it may have renewed since)."""
    deleting = encode_snapshot(SnapshotRecord("a", 1, State.DELETING, ("t",), 1, 1, 2, 2, 3, 0, (), ""))
    reads = with_nodes(lease_reads(None), {snapshot_path("a", 1): node(deleting, 4), pin_path("a", 1): None})
    decision = decide.acquire("job", 1_000, (A,), reads, None, CLOCKS)
    assert isinstance(decision, Commit) and decision.result.unavailable == (A,)
    assert not any(op.path == pin_path("a", 1) for op in decision.ops)

    two = Clocks(NOW, "nonce", LeasePolicy(max_snapshots=1, max_holders=2, max_clock_skew_ms=SKEW))
    holders = {"x": NOW + 10_000, "old": NOW - 5_000}
    full = with_nodes(
        lease_reads(None),
        {snapshot_path("a", 1): node(HEADER, 4), pin_path("a", 1): node(encode_pins(holders), 2)},
    )
    with pytest.raises(FailedPrecondition) as refused:
        decide.acquire("job", 1_000, (A,), full, None, two)
    assert refused.value.reason is Reason.TOO_LARGE and "already held by 2 leases; the limit is 2" in str(
        refused.value
    )
    room = {"x": NOW + 10_000}
    ok = with_nodes(
        lease_reads(None),
        {snapshot_path("a", 1): node(HEADER, 4), pin_path("a", 1): node(encode_pins(room), 2)},
    )
    decision = decide.acquire("job", 1_000, (A,), ok, None, two)
    assert isinstance(decision, Commit)
    pin_write = next(op for op in decision.ops if op.path == pin_path("a", 1))
    assert pin_write == SetData(pin_path("a", 1), encode_pins({"x": NOW + 10_000, "job": NOW + 1_000}), 2)

    both = with_nodes(ok, {snapshot_path("b", 2): node(HEADER, 1), pin_path("b", 2): None})
    with pytest.raises(InvalidArgument, match="would hold 2 snapshots"):
        decide.acquire("job", 1_000, (A, B), both, None, two)


@pytest.mark.parametrize(
    ("stored", "written"),
    [
        ({"a": 200, "b": 300}, {"a": 200, "b": 300, "me": 900}),
        ({"a": 50, "b": 100, "me": 10}, {"a": 50, "b": 100, "me": 900}),  # mine is rewritten
    ],
)
def test_a_pin_change_keeps_the_other_holders_whatever_their_listed_expiry(
    stored: dict[str, int], written: dict[str, int]
) -> None:
    """A listed expiry that passed may belong to a lease renewed since: only the transaction that
    rewrites or deletes that lease's record may take it out."""
    op = pin_change("/p", Node(encode_pins(stored), 4, 0, 0), "me", holding=True, expires_at_ms=900)
    assert isinstance(op, SetData) and op.version == 4 and decode_pins(op.data) == written


def test_a_pin_change_deletes_an_index_it_empties_and_writes_nothing_for_an_absent_holder() -> None:
    mine = Node(encode_pins({"me": 900}), 7, 0, 0)
    assert pin_change("/p", mine, "me", holding=False, expires_at_ms=0) == Delete("/p", 7)
    node = Node(encode_pins({"old": 100}), 7, 0, 0)
    assert pin_change("/p", node, "me", holding=False, expires_at_ms=0) is None
    assert pin_change("/p", node, "old", holding=False, expires_at_ms=0) == Delete("/p", 7)
