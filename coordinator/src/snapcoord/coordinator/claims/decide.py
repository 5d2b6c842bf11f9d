"""The rules of every commit-claim change, as pure functions of what was read (see
``kernel.decision``). No I/O here.

Each change is one transaction that writes the table node by version (``layout`` says why), so
none needs to recognise a commit in doubt (``pending``) apart: what a landed commit stored is the
answer its retry gives anyway (the same fence, or the claim this write holds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from snapcoord.coordinator.claims.layout import TABLES, claim_path, table_path
from snapcoord.coordinator.domain.claims import (
    FENCE_ATTEMPT,
    MAX_SEQ,
    ClaimResult,
    CommitClaim,
    TableFence,
    TableRecord,
    claim_retired,
    removable,
    table_fenced,
)
from snapcoord.coordinator.domain.claims_codec import decode_claim, decode_table, encode_claim, encode_table
from snapcoord.coordinator.errors import FailedPrecondition
from snapcoord.coordinator.kernel.decision import Commit, Done, Reads
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, Node, Op, SetData

R = TypeVar("R")


@dataclass(frozen=True)
class StoredTable:
    """A table record as read, with the version a compare-and-set needs."""

    record: TableRecord
    version: int


def stored_table(node: Node | None) -> StoredTable | None:
    return StoredTable(decode_table(node.data), node.version) if node is not None else None


def stored_claim(node: Node | None) -> CommitClaim | None:
    return decode_claim(node.data) if node is not None else None


def _write_table(table_id: str, current: StoredTable | None, record: TableRecord) -> Op:
    """Create the table node, or set it by the version read."""
    if current is None:
        return Create(table_path(table_id), encode_table(record))
    return SetData(table_path(table_id), encode_table(record), current.version)


@dataclass(frozen=True)
class FenceRequest:
    table_id: str
    epoch: int
    seq: int


@dataclass(frozen=True)
class Fenced:
    """FenceTable's outcome: ``raised`` when this call raised the fence (else it answers the fence
    of the same epoch already recorded)."""

    raised: bool
    fence: TableFence


def fence(
    request: FenceRequest, reads: Reads, pending: Commit[Fenced] | None, now: int
) -> Done[Fenced] | Commit[Fenced]:
    """Raise the fence to ``epoch`` and claim ``max(seq, next free number, floor)`` for it; the
    same epoch again answers the recorded fence; a lower one is refused (nothing changes)."""
    table_id, epoch = request.table_id, request.epoch
    current = stored_table(reads.node(table_path(table_id)))
    record = current.record if current is not None else TableRecord(table_id)
    if record.fence_epoch > epoch:
        raise table_fenced(table_id, epoch, record.fence_epoch)
    if record.fence_epoch == epoch:
        return Done(Fenced(False, TableFence(epoch, record.fence_seq)))
    from_seq = max(request.seq, record.next_seq, record.floor_seq)
    if from_seq > MAX_SEQ:
        raise FailedPrecondition(
            f"table_id {table_id!r} has claimed its last log number ({MAX_SEQ}): none is left to fence at",
            metadata={"table_id": table_id},
        )
    fenced = record.fenced(epoch, from_seq, now)
    claim = CommitClaim(from_seq, epoch, FENCE_ATTEMPT, now)
    ops = [
        _write_table(table_id, current, fenced),
        Create(claim_path(table_id, from_seq), encode_claim(claim)),
    ]
    return Commit(ops, Fenced(True, TableFence(epoch, from_seq)), ensure=(TABLES,))


@dataclass(frozen=True)
class ClaimRequest:
    table_id: str
    seq: int
    epoch: int
    attempt: str


def claim_reads(request: ClaimRequest) -> tuple[str, str]:
    return table_path(request.table_id), claim_path(request.table_id, request.seq)


def claim(
    request: ClaimRequest, reads: Reads, pending: Commit[ClaimResult] | None, now: int
) -> Done[ClaimResult] | Commit[ClaimResult]:
    """Grant ``seq`` to this write unless another holds it. The fence comes first: a write of a
    fenced epoch is refused even when it holds the claim (a retry after the fence), so a fenced
    writer learns it at its next call and writes nothing more."""
    table_id, seq, epoch = request.table_id, request.seq, request.epoch
    table_node, claim_node = claim_reads(request)
    current = stored_table(reads.node(table_node))
    record = current.record if current is not None else TableRecord(table_id)
    if record.fence_epoch > epoch:
        raise table_fenced(table_id, epoch, record.fence_epoch)
    held = stored_claim(reads.node(claim_node))
    if held is not None:
        mine = (held.epoch, held.attempt) == (epoch, request.attempt)
        return Done(ClaimResult(mine, held, record.fence_epoch))
    if seq < record.floor_seq:
        raise claim_retired(table_id, seq, record.floor_seq)
    ours = CommitClaim(seq, epoch, request.attempt, now)
    create = Create(claim_node, encode_claim(ours))
    if current is not None and seq <= record.highest_seq:
        # The table stays as it is; checking its version still orders this claim against a fence
        # (which sets it) and the janitor's floor (which sets it too).
        ops: list[Op] = [Check(table_node, current.version), create]
    else:
        ops = [_write_table(table_id, current, record.claimed(seq)), create]
    return Commit(ops, ClaimResult(True, ours, record.fence_epoch), ensure=(TABLES,))


@dataclass(frozen=True)
class Cleaned:
    removed: int


def clean(
    table_id: str, candidates: Sequence[int], most: int, retention_ms: int, reads: Reads, now: int
) -> Done[Cleaned] | Commit[Cleaned]:
    """Remove the ``removable`` prefix of the claims read (``candidates``, in number order), at
    most ``most`` of them, and raise the floor over them, in one transaction that sets the table
    node by version: a claim or fence meanwhile fails it, and the janitor decides again on what is
    stored then."""
    current = stored_table(reads.node(table_path(table_id)))
    if current is None:
        return Done(Cleaned(0))
    claims = {seq: stored_claim(reads.node(claim_path(table_id, seq))) for seq in candidates}
    present = [c for c in claims.values() if c is not None]
    gone = removable(current.record, present, now, retention_ms)[:most]
    if not gone:
        return Done(Cleaned(0))
    ops: list[Op] = [
        SetData(
            table_path(table_id), encode_table(current.record.cleaned_below(gone[-1] + 1)), current.version
        )
    ]
    ops += [Delete(claim_path(table_id, seq), 0) for seq in gone]
    return Commit(ops, Cleaned(len(gone)))
