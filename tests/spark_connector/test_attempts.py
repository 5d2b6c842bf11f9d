"""Pure parts of exactly-once: record payloads, whose record may roll back, which commits are visible."""

from __future__ import annotations

import pytest

from snapcoord.client import Offset
from snapcoord.spark_connector.attempts import Attempt, Record, Verdict, decide, decode, encode, plan_digest
from snapcoord.spark_connector.commit_log import Commit, Fence, is_visible, visible

SINK = (Offset("table", 0, 7), Offset("table", 1, 3))
Q1 = "5e0c1c3a-0000-4000-8000-000000000001"
Q2 = "5e0c1c3a-0000-4000-8000-000000000002"


def test_payload_round_trips_and_keeps_the_sink_positions_apart() -> None:
    attempt = Attempt(12, 3, Q1, plan_digest('v1\n{}\n{"logOffset":12}'))
    payload = encode(attempt, SINK)
    assert payload[-2:] == list(SINK)
    assert decode(payload) == Record(attempt, SINK)
    assert decode(reversed(payload)).attempt == attempt  # the registry may reorder offsets
    unknown = Attempt(0, 1)
    assert decode(encode(unknown, SINK)) == Record(unknown, SINK)
    # A record of the first wrapper version: sink positions only, no run identity.
    assert decode([Offset("table", 0, 5)]) == Record(None, (Offset("table", 0, 5),))


def test_payload_refuses_sink_positions_in_the_reserved_namespace() -> None:
    with pytest.raises(ValueError, match="reserved"):
        encode(Attempt(0, 1), [Offset("_eo:epoch", 0, 1)])
    with pytest.raises(ValueError, match="no positions"):
        encode(Attempt(0, 1), [])


def test_plan_digest_is_stable_and_tells_plans_apart() -> None:
    assert plan_digest("a") == plan_digest("a")
    assert plan_digest("a") != plan_digest("b")


def _record(batch: int, epoch: int, query: str | None = Q1, plan: str | None = "p") -> Record:
    return Record(Attempt(batch, epoch, query, plan), SINK)


@pytest.mark.parametrize(
    ("record", "mine", "first", "verdict"),
    [
        # The previous driver of this checkpoint died in this batch: the first batch we run.
        (_record(5, 1), Attempt(5, 2, Q1, "p"), True, Verdict.ROLLBACK),
        # Unknown plan on either side (no readable offsets log) is not a reason to refuse.
        (_record(5, 1, plan=None), Attempt(5, 2, Q1, "p"), True, Verdict.ROLLBACK),
        # This run's own record (lost reply, or a re-run in the same process), at any batch.
        (_record(5, 2), Attempt(5, 2, Q1, "p"), False, Verdict.OWN),
        # Checkpoint reset / another query with the same name: another query id.
        (_record(5, 1, query=Q2), Attempt(5, 2, Q1, "p"), True, Verdict.STALE),
        # Restore into a fresh checkpoint that kept the id but planned the batch differently.
        (_record(5, 1, plan="q"), Attempt(5, 2, Q1, "p"), True, Verdict.STALE),
        # A record of an earlier run met after this run already committed batches: not our batch.
        (_record(5, 1), Attempt(5, 2, Q1, "p"), False, Verdict.STALE),
        # Even our own epoch's record is stale when it names another query id.
        (_record(5, 2, query=Q2), Attempt(5, 2, Q1, "p"), False, Verdict.STALE),
        # A later run of the same checkpoint owns the batch: we are a zombie.
        (_record(5, 3), Attempt(5, 2, Q1, "p"), True, Verdict.NEWER),
        # Records without an attempt (older wrapper) or for another batch never roll back.
        (Record(None, SINK), Attempt(5, 2, Q1, "p"), True, Verdict.STALE),
        (_record(4, 1), Attempt(5, 2, Q1, "p"), True, Verdict.STALE),
    ],
)
def test_only_the_attempt_that_wrote_a_record_is_rolled_back(
    record: Record, mine: Attempt, first: bool, verdict: Verdict
) -> None:
    decision = decide(record, mine, first_batch_of_run=first)
    assert decision.verdict is verdict, decision.reason
    assert decision.reason


def test_a_fence_hides_lower_epochs_from_its_sequence_on() -> None:
    old = [Commit(s, 1, s, (f"f{s}",)) for s in range(4)]
    fence = Fence(2, 3)
    zombie_late = Commit(3, 1, 3, ("z",))  # the zombie committed after it passed its own check
    new = Commit(3, 2, 3, ("n",))
    assert [c.seq for c in visible([*old, new, zombie_late], [fence])] == [0, 1, 2, 3]
    assert visible([*old, new, zombie_late], [fence])[-1] == new
    assert not is_visible(zombie_late, [fence])
    assert not is_visible(Commit(9, 1, 9, ()), [fence])
    assert is_visible(Commit(2, 1, 2, ()), [fence])  # committed before the fence's range
    assert is_visible(Commit(9, 2, 9, ()), [fence, Fence(1, 0)])  # an older fence never hides newer
    assert not is_visible(Commit(9, 2, 9, ()), [fence, Fence(3, 5)])
