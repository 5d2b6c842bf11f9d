"""Commit claims: the rules of the commit point a sink uses where its store has no atomic create.

A *table* (a sink's output, named by ``table_id``) has a fence (the epoch of the newest run that
fenced it, 0 before any) and claims, one per log number (``seq``), each held by one write (its
run's ``epoch`` and its own ``attempt`` name). A claim is created once and never changed; of two
writes racing for one number exactly one is granted it, and a write of an epoch below the fence
is granted nothing. The table record also keeps the highest number ever claimed, so that the next
free number survives the janitor removing old claims, and the *floor*: the numbers below it had
claims the janitor removed, and are never granted again (a write that late is a zombie).

Pure: validation, the records and the janitor's rule; no I/O (``claims.registry`` runs them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.errors import FailedPrecondition, InvalidArgument, Reason

#: The attempt name of the claim FenceTable makes for the number the fencing run starts from.
FENCE_ATTEMPT = "fence"
MAX_ATTEMPT_LENGTH = 64
_ATTEMPT_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_ATTEMPT_CHAR_RE = re.compile(r"[A-Za-z0-9._:-]")
INT64_MAX = 2**63 - 1
#: The highest number a claim may have: one above it (``next_seq``) must still fit an int64.
MAX_SEQ = INT64_MAX - 1
#: GetCommitClaims' page size when ``limit`` is 0, and the most ``limit`` may ask for.
MAX_CLAIMS_PAGE = 1000


@dataclass(frozen=True)
class CommitClaimPolicy:
    """Server-side settings of commit claims (``config.options.OPTIONS`` names each option)."""

    #: Claims older than this are removed by the janitor, except each table's highest (it defines
    #: the next free number); fences are never removed.
    retention_ms: int = 7 * 24 * 3_600_000


@dataclass(frozen=True)
class CommitClaim:
    """One write's hold on log number ``seq`` of a table."""

    seq: int
    epoch: int
    attempt: str
    claimed_at_ms: int


@dataclass(frozen=True)
class TableRecord:
    """What the coordinator stores per table besides its claims (the table node's data)."""

    table_id: str
    #: The epoch of the newest fence; 0 when the table was never fenced.
    fence_epoch: int = 0
    #: The number that fence claimed (FenceTable's ``from_seq``); -1 when never fenced.
    fence_seq: int = -1
    fenced_at_ms: int = 0
    #: The highest number ever claimed; -1 when none was.
    highest_seq: int = -1
    #: Numbers below this had claims the janitor removed: never granted again.
    floor_seq: int = 0

    @property
    def next_seq(self) -> int:
        """One above the highest claim, or 0 when there is none."""
        return self.highest_seq + 1

    def claimed(self, seq: int) -> TableRecord:
        """The record once ``seq`` is claimed."""
        return TableRecord(
            self.table_id, self.fence_epoch, self.fence_seq, self.fenced_at_ms,
            max(self.highest_seq, seq), self.floor_seq,
        )  # fmt: skip

    def fenced(self, epoch: int, seq: int, now_ms: int) -> TableRecord:
        """The record once fenced at ``epoch``, claiming ``seq`` for the fence."""
        return TableRecord(self.table_id, epoch, seq, now_ms, max(self.highest_seq, seq), self.floor_seq)

    def cleaned_below(self, floor_seq: int) -> TableRecord:
        return TableRecord(
            self.table_id, self.fence_epoch, self.fence_seq, self.fenced_at_ms, self.highest_seq,
            max(self.floor_seq, floor_seq),
        )  # fmt: skip


@dataclass(frozen=True)
class TableFence:
    """FenceTable's answer."""

    fence_epoch: int
    from_seq: int


@dataclass(frozen=True)
class ClaimResult:
    """ClaimCommit's answer: ``holder`` is this write's claim when ``granted``, else the other's."""

    granted: bool
    holder: CommitClaim
    fence_epoch: int


@dataclass(frozen=True)
class TableClaims:
    """GetCommitClaims' answer."""

    fence_epoch: int
    claims: tuple[CommitClaim, ...]
    next_seq: int


# --- validation ----------------------------------------------------------------------------------


def _require_seq(field: str, seq: int) -> None:
    if not 0 <= seq <= MAX_SEQ:
        raise InvalidArgument(f"{field} is {seq}; it must be 0-{MAX_SEQ}", metadata={"field": field})


def _require_epoch(epoch: int) -> None:
    if epoch <= 0:
        raise InvalidArgument(
            f"epoch is {epoch}; it must be positive (a run's epoch, 1 or more)", metadata={"field": "epoch"}
        )


def require_attempt(attempt: str) -> str:
    """Return ``attempt`` or raise ``InvalidArgument`` saying what is wrong with it."""
    if not attempt:
        raise InvalidArgument(
            f"attempt is required (1-{MAX_ATTEMPT_LENGTH} characters of [A-Za-z0-9._:-])",
            metadata={"field": "attempt"},
        )
    if len(attempt) > MAX_ATTEMPT_LENGTH:
        raise InvalidArgument(
            f"attempt is {len(attempt)} characters long; the limit is {MAX_ATTEMPT_LENGTH}",
            metadata={"field": "attempt"},
        )
    if not _ATTEMPT_RE.fullmatch(attempt):
        bad = "".join(sorted({c for c in attempt if not _ATTEMPT_CHAR_RE.fullmatch(c)}))
        raise InvalidArgument(
            f"attempt {quote_prefix(attempt)} contains {quote_prefix(bad, 10)}; "
            "allowed characters are [A-Za-z0-9._:-]",
            metadata={"field": "attempt"},
        )
    return attempt


def validate_fence(table_id: str, epoch: int, seq: int) -> None:
    require_id("table_id", table_id)
    _require_epoch(epoch)
    _require_seq("seq", seq)


def validate_claim(table_id: str, seq: int, epoch: int, attempt: str) -> None:
    require_id("table_id", table_id)
    _require_seq("seq", seq)
    _require_epoch(epoch)
    require_attempt(attempt)


def validate_listing(table_id: str, from_seq: int, limit: int) -> int:
    """The page size GetCommitClaims uses for ``limit``, or ``InvalidArgument``."""
    require_id("table_id", table_id)
    _require_seq("from_seq", from_seq)
    if not 0 <= limit <= MAX_CLAIMS_PAGE:
        raise InvalidArgument(
            f"limit is {limit}; use 1-{MAX_CLAIMS_PAGE}, or 0 for {MAX_CLAIMS_PAGE}",
            metadata={"field": "limit"},
        )
    return limit or MAX_CLAIMS_PAGE


# --- refusals ------------------------------------------------------------------------------------


def table_fenced(table_id: str, epoch: int, fence_epoch: int) -> FailedPrecondition:
    """The refusal of a write (or a fence) of ``epoch`` on a table fenced at ``fence_epoch``."""
    return FailedPrecondition(
        f"table_id {table_id!r} is fenced at epoch {fence_epoch}, above this writer's epoch {epoch}: "
        "a newer run owns the table; stop writing to it",
        reason=Reason.TABLE_FENCED,
        metadata={"table_id": table_id, "epoch": epoch, "fence_epoch": fence_epoch},
    )


def claim_retired(table_id: str, seq: int, floor_seq: int) -> FailedPrecondition:
    """The refusal of a claim below the table's floor: its claim was removed after the retention,
    so the number was long since committed by someone; granting it again could commit it twice."""
    return FailedPrecondition(
        f"log number {seq} of table_id {table_id!r} is below {floor_seq}, whose claims were removed "
        "after --commit-claim-retention: it was committed long ago and is never claimed again",
        reason=Reason.CLAIM_RETIRED,
        metadata={"table_id": table_id, "seq": seq, "floor_seq": floor_seq},
    )


# --- the janitor's rule --------------------------------------------------------------------------


def removable(
    record: TableRecord, claims: Iterable[CommitClaim], now_ms: int, retention_ms: int
) -> list[int]:
    """The numbers of the claims the janitor may remove: the run, in number order from the lowest,
    of claims at least ``retention_ms`` old by ``now_ms``, stopping at the first that is younger
    (also one "from the future": a clock that went back removes nothing) and before the table's
    highest number, which is always kept. Removing only a prefix lets one floor say what is gone."""
    out: list[int] = []
    for claim in sorted(claims, key=lambda c: c.seq):
        if claim.seq >= record.highest_seq or now_ms - claim.claimed_at_ms < retention_ms:
            break
        out.append(claim.seq)
    return out
