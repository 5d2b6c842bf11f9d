"""The record of one batch attempt, and whether a found record may roll the sink back (pure logic).

``exactly_once`` registers one producer record per batch, ``<query_name>.b<N>``. A record only says
"an attempt of batch N started writing at these sink positions"; the same id is reused by every run
of the query, so a record found at registration time may come from:

- this run (a retried call after a lost reply, or the same writer re-running a failed batch);
- the previous driver of the *same* checkpoint that died in batch N (the case the wrapper exists for:
  roll back what it wrote);
- a run that has nothing to do with this batch: a deleted (reset) checkpoint, a restore into a fresh
  checkpoint, another checkpoint under the same query name, or a record left behind long ago. Rolling
  back to its positions would delete output that other, committed batches wrote.

So every record carries its attempt: the writer's epoch (a per-run number claimed from the coordinator,
see ``epochs``), the checkpoint's query id, and a digest of the batch's planned offsets (Spark's offsets
log entry for N, identical when a crashed batch is re-run). ``decide`` allows a rollback only for the
attempt that wrote the record: same query id, same plan, and either this very run or an earlier run
whose batch N is the *first* batch this run executes (Spark always re-runs the unfinished batch before
any new one, so a record of an earlier run met later in a run cannot be that batch's earlier attempt).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from snapcoord.client import Offset

#: Streams of this prefix in a record belong to the wrapper, not to the sink.
RESERVED_PREFIX = "_eo:"
_EPOCH = RESERVED_PREFIX + "epoch"
_BATCH = RESERVED_PREFIX + "batch"
_QUERY = RESERVED_PREFIX + "query:"
_PLAN = RESERVED_PREFIX + "plan:"


@dataclass(frozen=True)
class Attempt:
    """Who is writing batch ``batch_id``: the run's epoch, the checkpoint's query id and the batch's
    plan digest (None when unknown: no Spark query id, or no readable offsets log)."""

    batch_id: int
    epoch: int
    query_id: str | None = None
    plan: str | None = None


@dataclass(frozen=True)
class Record:
    """A stored record: its attempt (None for a record without one, written by an older wrapper) and
    the sink positions the attempt started writing from."""

    attempt: Attempt | None
    sink_positions: tuple[Offset, ...]


class Verdict(enum.Enum):
    OWN = "own"  # this run wrote it: roll back to it (a no-op after a lost reply)
    ROLLBACK = "rollback"  # an earlier driver's attempt of this very batch: roll back to it
    STALE = "stale"  # another run's: never roll back, replace it
    NEWER = "newer"  # a later run's attempt of this batch: this driver is a zombie


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str


def plan_digest(offsets_log_entry: str) -> str:
    """A short digest of Spark's offsets log entry for a batch (``<checkpoint>/offsets/<N>``)."""
    return hashlib.sha256(offsets_log_entry.encode("utf-8")).hexdigest()[:32]


def encode(attempt: Attempt, sink_positions: Sequence[Offset]) -> list[Offset]:
    """The record payload: the attempt as reserved streams, then the sink's positions."""
    if not sink_positions:
        raise ValueError("the sink returned no positions")
    for p in sink_positions:
        if p.stream.startswith(RESERVED_PREFIX):
            raise ValueError(f"sink position {p!r} uses the reserved stream prefix {RESERVED_PREFIX!r}")
    out = [Offset(_EPOCH, 0, attempt.epoch), Offset(_BATCH, 0, attempt.batch_id)]
    if attempt.query_id is not None:
        out.append(Offset(_QUERY + attempt.query_id, 0, 0))
    if attempt.plan is not None:
        out.append(Offset(_PLAN + attempt.plan, 0, 0))
    return out + list(sink_positions)


def decode(offsets: Iterable[Offset]) -> Record:
    """Split a stored payload into its attempt and the sink positions (order of the rest kept)."""
    epoch = batch = None
    query_id = plan = None
    sink: list[Offset] = []
    for o in offsets:
        if o.stream == _EPOCH:
            epoch = o.offset
        elif o.stream == _BATCH:
            batch = o.offset
        elif o.stream.startswith(_QUERY):
            query_id = o.stream[len(_QUERY) :]
        elif o.stream.startswith(_PLAN):
            plan = o.stream[len(_PLAN) :]
        elif not o.stream.startswith(RESERVED_PREFIX):
            sink.append(o)
    if epoch is None or batch is None:
        return Record(None, tuple(sink))
    return Record(Attempt(batch, epoch, query_id, plan), tuple(sink))


def decide(record: Record, mine: Attempt, *, first_batch_of_run: bool) -> Decision:
    """May ``record`` (found where ``mine`` wanted to register) roll the sink back?

    A record is only ever used to roll back the attempt that wrote it; everything else is STALE
    (never a reason to delete) or NEWER (a later run of the same checkpoint owns the batch).
    """
    theirs = record.attempt
    if theirs is None:
        return Decision(Verdict.STALE, "it carries no run identity (written by an older snapcoord)")
    if theirs.batch_id != mine.batch_id:
        return Decision(Verdict.STALE, f"it is for batch {theirs.batch_id}, not {mine.batch_id}")
    if theirs.query_id is not None and mine.query_id is not None and theirs.query_id != mine.query_id:
        return Decision(
            Verdict.STALE,
            f"it was written by query id {theirs.query_id}, this checkpoint's is {mine.query_id} "
            "(checkpoint reset, restore into a new checkpoint, or another query of the same name)",
        )
    if theirs.plan is not None and mine.plan is not None and theirs.plan != mine.plan:
        return Decision(
            Verdict.STALE, "it planned other offsets for this batch (a restored or rewound checkpoint)"
        )
    if theirs.epoch == mine.epoch:
        return Decision(Verdict.OWN, f"this run (epoch {mine.epoch}) wrote it")
    if theirs.epoch > mine.epoch:
        return Decision(Verdict.NEWER, f"a later run (epoch {theirs.epoch} > {mine.epoch}) wrote it")
    if not first_batch_of_run:
        return Decision(
            Verdict.STALE,
            f"it is from an earlier run (epoch {theirs.epoch}) but batch {mine.batch_id} is not the first "
            "batch of this run, so it is not that run's unfinished batch",
        )
    return Decision(
        Verdict.ROLLBACK,
        f"epoch {theirs.epoch} started batch {mine.batch_id} of this checkpoint and did not finish it",
    )
