"""Commit claims on both stores (embedded, and ZooKeeper): the contract of CommitClaimService as
the registry keeps it, the race of a claim against a fence, and the janitor's retention.

Every test runs twice through the ``stores`` fixture (tests/coordinator/conftest.py). Races are
forced where they can be: a fence is committed between a claim's read and its commit by wrapping
the store's ``transaction``, so the interleaving the version check guards is certain to happen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from harness.concurrency import run_threads
from harness.stores import Stores
from snapcoord.coordinator.claims.layout import TABLES, claim_path, table_path
from snapcoord.coordinator.claims.registry import CLEAN_CHUNK, CommitClaimRegistry
from snapcoord.coordinator.domain.claims import FENCE_ATTEMPT, MAX_SEQ, ClaimResult, CommitClaimPolicy
from snapcoord.coordinator.domain.clock import ManualClock
from snapcoord.coordinator.errors import (
    CommitOutcomeUnknown,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Reason,
)
from snapcoord.coordinator.kernel.commit import CommitKernel
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics, new_registry
from snapcoord.coordinator.storage.metadata import MetadataStore, Op

DAY_MS = 24 * 3_600_000
RETENTION_MS = 7 * DAY_MS


class SettableClock:
    """A clock a test sets anywhere, backwards included (a host whose clock was stepped)."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


def registry_on(metadata: MetadataStore, clock: ManualClock | SettableClock) -> CommitClaimRegistry:
    metrics = CoordinatorMetrics(new_registry())
    kernel = CommitKernel(metadata, None, metrics, now_ms=clock.now_ms)
    return CommitClaimRegistry(metadata, clock, CommitClaimPolicy(RETENTION_MS), metrics, kernel)


@pytest.fixture
def clock() -> SettableClock:
    return SettableClock(1_700_000_000_000)


@pytest.fixture
def claims(stores: Stores, clock: SettableClock) -> CommitClaimRegistry:
    return registry_on(stores.metadata, clock)


def tree(metadata: MetadataStore) -> dict[str, tuple[bytes, int]]:
    """Every node under the claims root with its data and version."""
    out: dict[str, tuple[bytes, int]] = {}
    todo = [TABLES]
    while todo:
        path = todo.pop()
        node = metadata.get(path)
        if node is not None:
            out[path] = (node.data, node.version)
        todo += [f"{path}/{name}" for name in metadata.children(path)]
    return out


def fenced_error(call: Callable[[], object]) -> FailedPrecondition:
    with pytest.raises(FailedPrecondition) as e:
        call()
    assert e.value.reason is Reason.TABLE_FENCED
    return e.value


# --- the contract --------------------------------------------------------------------------------


def test_claims_and_fences_round_trip(claims: CommitClaimRegistry, clock: SettableClock) -> None:
    first = claims.claim("orders", 0, 1, "b0")
    assert first.granted and (first.holder.seq, first.holder.epoch, first.holder.attempt) == (0, 1, "b0")
    assert first.holder.claimed_at_ms == clock.now and first.fence_epoch == 0
    assert claims.claim("orders", 1, 1, "b1").granted
    # The fence claims one above the highest claim although the store showed a lower number.
    fence = claims.fence("orders", 2, 1)
    assert (fence.fence_epoch, fence.from_seq) == (2, 2)
    listed = claims.claims("orders", 0, 0)
    assert (listed.fence_epoch, listed.next_seq) == (2, 3)
    assert [(c.seq, c.epoch, c.attempt) for c in listed.claims] == [
        (0, 1, "b0"),
        (1, 1, "b1"),
        (2, 2, FENCE_ATTEMPT),
    ]
    assert [c.seq for c in claims.claims("orders", 1, 1).claims] == [1]
    # A fence asked for a number above the highest claim starts there.
    assert claims.fence("orders", 3, 10).from_seq == 10
    assert claims.claims("orders", 0, 0).next_seq == 11
    # The fencing run claims the numbers after its fence; another write's claim is not granted.
    assert claims.claim("orders", 11, 3, "r3-11").granted
    other = claims.claim("orders", 11, 3, "other")
    assert not other.granted and other.holder.attempt == "r3-11" and other.fence_epoch == 3


def test_first_claim_wins_under_concurrency(claims: CommitClaimRegistry, stores: Stores) -> None:
    results: list[ClaimResult] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        result = claims.claim("contended", 7, 1 + i % 2, f"w{i}")
        with lock:
            results.append(result)

    run_threads(12, claim)
    winners = [r for r in results if r.granted]
    assert len(results) == 12 and len(winners) == 1
    assert {r.holder for r in results} == {winners[0].holder}  # everyone sees the one holder
    assert [c.attempt for c in claims.claims("contended", 0, 0).claims] == [winners[0].holder.attempt]


def test_a_retry_is_granted_the_claim_it_holds_and_a_fence_again_changes_nothing(
    claims: CommitClaimRegistry, stores: Stores, clock: SettableClock
) -> None:
    granted = claims.claim("t", 4, 1, "a")
    clock.now += 1000
    again = claims.claim("t", 4, 1, "a")
    assert again == granted  # the same claim, the first call's time
    fence = claims.fence("t", 2, 0)
    before = tree(stores.metadata)
    clock.now += 1000
    assert claims.fence("t", 2, 99) == fence  # the recorded fence, whatever seq says now
    assert tree(stores.metadata) == before


def test_a_lost_reply_is_answered_as_landed(
    claims: CommitClaimRegistry, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit applied whose outcome the store could not tell (a connection lost after it was
    sent): the call re-reads, finds its own claim or fence, and answers as if the reply came."""
    inner = stores.metadata.transaction

    def applied_then_lost(ops: Sequence[Op]) -> None:
        inner(ops)
        raise CommitOutcomeUnknown("connection lost after the commit was sent")

    monkeypatch.setattr(stores.metadata, "transaction", applied_then_lost)
    assert claims.claim("t", 0, 1, "a").granted
    assert claims.fence("t", 2, 0).from_seq == 1
    monkeypatch.undo()
    listed = claims.claims("t", 0, 0)
    assert [(c.seq, c.attempt) for c in listed.claims] == [(0, "a"), (1, FENCE_ATTEMPT)]


def test_a_fenced_writer_is_refused_and_leaves_state_untouched(
    claims: CommitClaimRegistry, stores: Stores
) -> None:
    claims.claim("t", 0, 3, "a")
    claims.fence("t", 5, 1)
    before = tree(stores.metadata)
    refused = fenced_error(lambda: claims.claim("t", 3, 4, "zombie"))
    assert refused.metadata == {"table_id": "t", "epoch": "4", "fence_epoch": "5"}
    fenced_error(lambda: claims.claim("t", 0, 3, "a"))  # even its own claim: the fence comes first
    fenced_error(lambda: claims.fence("t", 4, 0))
    assert tree(stores.metadata) == before
    # An epoch at or above the fence still claims.
    assert claims.claim("t", 3, 5, "b").granted and claims.fence("t", 6, 0).from_seq == 4


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda r: r.claim("", 0, 1, "a"), "table_id"),
        (lambda r: r.claim("a/b", 0, 1, "a"), "table_id"),
        (lambda r: r.claim("t", -1, 1, "a"), "seq"),
        (lambda r: r.claim("t", MAX_SEQ + 1, 1, "a"), "seq"),
        (lambda r: r.claim("t", 0, 0, "a"), "epoch"),
        (lambda r: r.claim("t", 0, -5, "a"), "epoch"),
        (lambda r: r.claim("t", 0, 1, ""), "attempt"),
        (lambda r: r.claim("t", 0, 1, "x" * 65), "attempt"),
        (lambda r: r.claim("t", 0, 1, "a b"), "attempt"),
        (lambda r: r.fence("t", 0, 0), "epoch"),
        (lambda r: r.fence("t", 1, -1), "seq"),
        (lambda r: r.claims("t", -1, 0), "from_seq"),
        (lambda r: r.claims("t", 0, 1001), "limit"),
        (lambda r: r.claims("t", 0, -1), "limit"),
    ],
)
def test_bad_input_is_invalid_argument_and_changes_nothing(
    claims: CommitClaimRegistry, stores: Stores, call: Callable[[CommitClaimRegistry], object], field: str
) -> None:
    claims.claim("t", 0, 1, "a")
    before = tree(stores.metadata)
    with pytest.raises(InvalidArgument, match=field):
        call(claims)
    assert tree(stores.metadata) == before


def test_an_unknown_table_is_not_found(claims: CommitClaimRegistry) -> None:
    with pytest.raises(NotFound, match="'nothing-here'"):
        claims.claims("nothing-here", 0, 0)


def test_the_widest_numbers_are_accepted(claims: CommitClaimRegistry) -> None:
    assert claims.claim("t", MAX_SEQ, 2**63 - 1, "a" * 64).granted
    listed = claims.claims("t", MAX_SEQ, 1)
    assert listed.next_seq == MAX_SEQ + 1 == 2**63 - 1  # still an int64
    assert [c.seq for c in listed.claims] == [MAX_SEQ]
    # No number is left for a fence: refused, nothing changes (next_seq must stay an int64).
    with pytest.raises(FailedPrecondition, match="last log number") as e:
        claims.fence("t", 2**63 - 1, 0)
    assert e.value.reason is Reason.FAILED_PRECONDITION
    assert claims.claims("t", 0, 0).fence_epoch == 0


# --- a claim racing a fence ----------------------------------------------------------------------


def before_commit_of(
    stores: Stores, path: str, action: Callable[[], object], monkeypatch: pytest.MonkeyPatch
) -> list[object]:
    """Run ``action`` (once) right before the first transaction that touches ``path`` is sent:
    another caller's commit landing between this call's read and its commit. Returns a list that
    holds ``action``'s result once it ran."""
    inner = stores.metadata.transaction
    armed = [True]
    results: list[object] = []

    def interleaved(ops: Sequence[Op]) -> None:
        if armed and any(getattr(op, "path", "") == path for op in ops):
            armed.clear()  # the action's own commit may touch the path too
            results.append(action())
        inner(ops)

    monkeypatch.setattr(stores.metadata, "transaction", interleaved)
    return results


def test_a_fence_committed_between_a_claims_read_and_commit_refuses_the_claim(
    stores: Stores, clock: SettableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving the table node's version check exists for, forced: the claim read the
    table unfenced, then a fence (through another registry, as another replica) commits, then the
    claim's transaction is sent. It must fail, re-read and be refused; nothing of epoch 1 lands
    after the fence."""
    claims = registry_on(stores.metadata, clock)
    other = registry_on(stores.metadata, clock)
    claims.claim("t", 0, 1, "a")
    fences = before_commit_of(
        stores, claim_path("t", 1), lambda: other.fence("t", 2, 0).from_seq, monkeypatch
    )
    fenced_error(lambda: claims.claim("t", 1, 1, "b"))
    assert fences == [1]
    listed = other.claims("t", 0, 0)
    assert [(c.seq, c.epoch) for c in listed.claims] == [(0, 1), (1, 2)]


def test_a_claim_committed_between_a_fences_read_and_commit_moves_the_fence_above_it(
    stores: Stores, clock: SettableClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order, forced: the fence read the highest claim, then a claim of epoch 1 lands
    above it. The fence must not start at or below that claim (its commit fails and re-reads)."""
    claims = registry_on(stores.metadata, clock)
    other = registry_on(stores.metadata, clock)
    claims.claim("t", 0, 1, "a")
    landed = before_commit_of(
        stores, claim_path("t", 1), lambda: other.claim("t", 5, 1, "late").granted, monkeypatch
    )
    assert claims.fence("t", 2, 0).from_seq == 6
    assert landed == [True]
    assert [(c.seq, c.epoch) for c in other.claims("t", 0, 0).claims] == [(0, 1), (5, 1), (6, 2)]


@dataclass
class Race:
    """One round: a run claiming 0, 1, 2... while a new run fences the table once the run has
    ``head_start`` claims."""

    claims: CommitClaimRegistry
    table: str
    head_start: int
    granted: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    fence_seq: list[int] = field(default_factory=list)
    some_claims: threading.Event = field(default_factory=threading.Event)
    fence_done: threading.Event = field(default_factory=threading.Event)

    def claimer(self) -> None:
        try:
            self._claim_until_refused()
        finally:
            self.some_claims.set()  # a claimer that stopped early must not hold the fencer up

    def _claim_until_refused(self) -> None:
        seq = 0
        while True:
            if len(self.granted) >= self.head_start:
                self.some_claims.set()
            started_after = self.fence_done.is_set()
            try:
                result = self.claims.claim(self.table, seq, 1, f"b{seq}")
            except FailedPrecondition as e:
                if e.reason is not Reason.TABLE_FENCED:
                    self.problems.append(f"seq {seq}: {e!r}")
                return
            if started_after:
                self.problems.append(f"seq {seq} was answered {result} after the fence returned")
            if not result.granted:
                self.problems.append(f"seq {seq} held by {result.holder}")
                return
            self.granted.append(seq)
            seq += 1

    def fencer(self) -> None:
        if self.some_claims.wait(60):
            self.fence_seq.append(self.claims.fence(self.table, 2, 0).from_seq)
        self.fence_done.set()

    def run(self) -> None:
        threads = [threading.Thread(target=self.claimer), threading.Thread(target=self.fencer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)


def test_claims_racing_a_fence_land_before_it_or_are_refused(claims: CommitClaimRegistry) -> None:
    """Rounds of a run claiming numbers one after another while a new run fences the table: the
    granted claims are exactly the numbers below the fence's, every one stored, and no claim call
    that starts after the fence returned is answered."""
    for r in range(12):
        race = Race(claims, f"race-{r}", head_start=1 + r % 4)
        race.run()
        assert race.fence_seq, "the fence did not complete"
        assert race.problems == []
        assert race.granted == list(range(race.fence_seq[0])), (race.granted, race.fence_seq)
        stored = claims.claims(race.table, 0, 0).claims
        assert [(c.seq, c.epoch) for c in stored] == [*((s, 1) for s in race.granted), (race.fence_seq[0], 2)]


# --- the janitor ---------------------------------------------------------------------------------


def claim_run(
    claims: CommitClaimRegistry, clock: SettableClock, table: str, seqs: range, step_ms: int
) -> None:
    for seq in seqs:
        assert claims.claim(table, seq, 1, f"b{seq}").granted
        clock.now += step_ms


def numbers(claims: CommitClaimRegistry, table: str) -> list[int]:
    return [c.seq for c in claims.claims(table, 0, 0).claims]


def test_the_janitor_removes_only_claims_older_than_the_retention(
    claims: CommitClaimRegistry, clock: SettableClock
) -> None:
    claim_run(claims, clock, "t", range(10), DAY_MS)  # one claim a day: now 10 days to 1 day old
    clock.now -= 1
    assert claims.clean(1000) == 3  # 10, 9 and 8 days old; the 7-day-old one by a millisecond not
    assert numbers(claims, "t") == list(range(3, 10))
    clock.now += 1
    assert claims.clean(1000) == 1  # exactly the retention old
    clock.now += 3 * DAY_MS - 1
    assert claims.clean(1000) == 2
    assert numbers(claims, "t") == list(range(6, 10))


def test_the_janitor_never_removes_the_highest_claim_nor_a_fence(
    claims: CommitClaimRegistry, clock: SettableClock, stores: Stores
) -> None:
    claim_run(claims, clock, "t", range(5), 1)
    fence = claims.fence("t", 2, 0)
    claim_run(claims, clock, "quiet", range(1), 1)  # a table with one claim only
    clock.now += 10 * RETENTION_MS
    assert claims.clean(1000) == 5
    listed = claims.claims("t", 0, 0)
    assert [(c.seq, c.attempt) for c in listed.claims] == [(fence.from_seq, FENCE_ATTEMPT)]
    assert (listed.fence_epoch, listed.next_seq) == (2, 6)
    assert numbers(claims, "quiet") == [0]
    # What the janitor removed is never given out again, and the fence still holds.
    assert claims.fence("t", 3, 0).from_seq == 6
    fenced_error(lambda: claims.claim("t", 7, 2, "zombie"))
    with pytest.raises(FailedPrecondition) as retired:
        claims.claim("t", 2, 3, "late")
    assert retired.value.reason is Reason.CLAIM_RETIRED and retired.value.metadata["floor_seq"] == "5"
    assert stores.metadata.get(table_path("t")) is not None


def test_a_clock_that_jumps_back_removes_nothing(claims: CommitClaimRegistry, clock: SettableClock) -> None:
    claim_run(claims, clock, "t", range(5), DAY_MS)
    clock.now -= 30 * DAY_MS  # a stepped clock: every claim now looks as if from the future
    assert claims.clean(1000) == 0
    assert numbers(claims, "t") == list(range(5))


def test_a_younger_claim_stops_the_run(claims: CommitClaimRegistry, clock: SettableClock) -> None:
    """Claims are removed only as a run from the lowest: one younger claim (made by a replica
    whose clock ran ahead) keeps itself and every claim above it, however old."""
    claim_run(claims, clock, "t", range(3), 1)
    clock.now += 2 * DAY_MS
    claim_run(claims, clock, "t", range(3, 4), 1)
    clock.now -= 2 * DAY_MS
    claim_run(claims, clock, "t", range(4, 8), 1)
    clock.now += RETENTION_MS + DAY_MS  # 0..2 and 4..7 are 8 days old, 3 is 6 days old
    assert claims.clean(1000) == 3
    assert numbers(claims, "t") == list(range(3, 8))


def test_the_janitor_works_in_bounded_transactions_and_stops_at_its_limit(
    claims: CommitClaimRegistry, clock: SettableClock, stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = CLEAN_CHUNK + 10
    claim_run(claims, clock, "t", range(count), 0)
    clock.now += RETENTION_MS
    sizes: list[int] = []
    inner = stores.metadata.transaction

    def recorded(ops: Sequence[Op]) -> None:
        sizes.append(len(ops))
        inner(ops)

    monkeypatch.setattr(stores.metadata, "transaction", recorded)
    assert claims.clean(5) == 5
    assert numbers(claims, "t")[0] == 5
    assert claims.clean(10_000) == count - 6  # all but the highest
    assert sizes == [1 + 5, 1 + CLEAN_CHUNK, 1 + count - 6 - CLEAN_CHUNK]
    assert numbers(claims, "t") == [count - 1]
