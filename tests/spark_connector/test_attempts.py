"""Pure parts of exactly-once: record payloads, whose record may roll back, the sink's log entries."""

from __future__ import annotations

import json

import pytest

from snapcoord.client import Offset
from snapcoord.spark_connector.sink.attempts import (
    Attempt,
    Record,
    Verdict,
    decide,
    decode,
    encode,
    plan_digest,
)
from snapcoord.spark_connector.sink.commit_log import (
    DATA,
    FENCE,
    VOID,
    Commit,
    FileLine,
    commits_fingerprint,
    parse_entry,
    render_entry,
)

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


def test_a_log_entry_carries_its_writer_in_a_marker_spark_readers_skip() -> None:
    table = "sftp://h:22/data/t"

    def uri(path: str) -> str:
        return f"{table}/{path}"

    def relative(u: str) -> str:
        assert u.startswith(table + "/"), u
        return u[len(table) + 1 :]

    fence = Commit(3, 2, None, (), FENCE, "f")
    batch = Commit(4, 2, 7, ("b=1/_w-s4-e2-a1-p0/part-0.json",), DATA, "1")
    files = [FileLine("b=1/_w-s4-e2-a1-p0/part-0.json", 12, 5)]
    data = render_entry([fence, batch], [[], files], uri, 9)
    statuses = [json.loads(line) for line in data.decode().splitlines()[1:]]
    assert data.decode().startswith("v1\n")
    # What a Spark reader reads: the data files only (the markers are directories).
    assert [s["path"] for s in statuses if not s["isDir"]] == [f"{table}/b=1/_w-s4-e2-a1-p0/part-0.json"]
    assert parse_entry(data, relative, "4") == [(fence, []), (batch, files)]
    # Files of a log written without markers (Spark's own sink) belong to an anonymous batch.
    foreign = b'v1\n{"path":"sftp://h:22/data/t/x.json","size":1,"isDir":false,"modificationTime":0,' + (
        b'"blockReplication":1,"blockSize":1,"action":"add"}'
    )
    ((anonymous, its_files),) = parse_entry(foreign, relative, "0")
    assert (anonymous.epoch, anonymous.batch_id, anonymous.files) == (0, None, ("x.json",))
    assert its_files == [FileLine("x.json", 1, 0)]
    # The fingerprint of what lies below a cut changes when a batch there is voided.
    voided = Commit(4, 3, 7, (), VOID, "1")
    assert commits_fingerprint([fence, batch], 5) != commits_fingerprint([fence, voided], 5)
    assert commits_fingerprint([fence, batch], 4) == commits_fingerprint([fence, voided], 4)
