"""Where commit claims live in the metadata store.

- **The table node** ``/claims/tables/<table_id>`` holds the table record (``domain.claims``):
  its fence, the fence's number, the highest number ever claimed and the floor. Every change of a
  table writes this node by version, which is what orders a claim against a fence: FenceTable
  sets it (the new fence) and ClaimCommit sets it (a higher number) or checks it (a lower one) in
  the transaction that creates the claim, so a claim read under the old fence cannot land after
  the new one; it fails, re-reads, and is refused.
- **Claim nodes** ``/claims/tables/<table_id>/c-<seq>`` (``seq`` zero-padded to 20 digits, so the
  names sort in number order), one per claimed number, created once and never changed; removed
  by the janitor after the retention, in the transaction that raises the table's floor over them.

About 150 bytes per claim and 200 per table: a sink that commits a batch a minute keeps ~10,000
claims (1.5 MB) per table over the 7-day retention. Nothing goes to the blob store.
"""

from __future__ import annotations

TABLES = "/claims/tables"
_CLAIM_PREFIX = "c-"


def table_path(table_id: str) -> str:
    return f"{TABLES}/{table_id}"


def claim_name(seq: int) -> str:
    return f"{_CLAIM_PREFIX}{seq:020d}"


def claim_path(table_id: str, seq: int) -> str:
    return f"{table_path(table_id)}/{claim_name(seq)}"


def parse_claim_name(name: str) -> int | None:
    """``c-<20 digits>`` -> the number; None for any other name."""
    digits = name.removeprefix(_CLAIM_PREFIX)
    if digits == name or len(digits) != 20 or not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)
