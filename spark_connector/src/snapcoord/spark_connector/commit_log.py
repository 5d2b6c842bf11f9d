"""The commit log of ``PartitionedFileSink``: which batches are visible (pure logic, no I/O).

A batch is visible exactly when its commit file exists and no fence hides it:

- ``_commits/<seq:012d>-e<epoch:012d>.json`` lists the batch's data files; it is written in one
  atomic step (temp file, then a hard link that fails if the name exists), after every data file is
  in place. Before it exists none of the batch is visible; after, all of it.
- ``_fences/e<epoch:012d>.json`` is written by each run (epoch) before it writes anything, holding
  ``from_seq``: the first sequence number not yet committed when the run started. A commit of a
  *lower* epoch at a sequence ``>= from_seq`` is invisible forever, whenever it was written: that is
  how a zombie driver's late commit (it passed its own fence check just before the new run fenced)
  stays out of every reader's view.
- ``_fences/e<epoch:012d>.intent`` (empty) announces a fence before its ``from_seq`` is computed:
  writers of a lower epoch check for it right after linking a commit file and fail then (readers
  ignore it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

COMMITS_DIR = "_commits"
FENCES_DIR = "_fences"
_COMMIT_RE = re.compile(r"^(?P<seq>\d{12})-e(?P<epoch>\d{12})\.json$")
_FENCE_RE = re.compile(r"^e(?P<epoch>\d{12})\.json$")
_FENCE_INTENT_RE = re.compile(r"^e(?P<epoch>\d{12})\.intent$")


@dataclass(frozen=True)
class Commit:
    seq: int
    epoch: int
    batch_id: int | None
    files: tuple[str, ...]  # paths relative to the table root

    @property
    def file_name(self) -> str:
        return commit_file_name(self.seq, self.epoch)


@dataclass(frozen=True)
class Fence:
    epoch: int
    from_seq: int


def commit_file_name(seq: int, epoch: int) -> str:
    return f"{seq:012d}-e{epoch:012d}.json"


def fence_file_name(epoch: int) -> str:
    return f"e{epoch:012d}.json"


def fence_intent_name(epoch: int) -> str:
    return f"e{epoch:012d}.intent"


def parse_fence_intent_name(name: str) -> int | None:
    m = _FENCE_INTENT_RE.match(name)
    return int(m.group("epoch")) if m else None


def parse_commit_name(name: str) -> tuple[int, int] | None:
    m = _COMMIT_RE.match(name)
    return (int(m.group("seq")), int(m.group("epoch"))) if m else None


def parse_fence_name(name: str) -> int | None:
    m = _FENCE_RE.match(name)
    return int(m.group("epoch")) if m else None


def is_visible(commit: Commit, fences: Iterable[Fence]) -> bool:
    """False when a later epoch fenced the sequence range this commit is in."""
    return not any(f.epoch > commit.epoch and commit.seq >= f.from_seq for f in fences)


def visible(commits: Iterable[Commit], fences: Iterable[Fence]) -> list[Commit]:
    """The visible commits in write order (sequence, then epoch: one sequence has at most one
    visible commit, because a later epoch always fences at or below the sequences it writes)."""
    fence_list = list(fences)
    return sorted((c for c in commits if is_visible(c, fence_list)), key=lambda c: (c.seq, c.epoch))


def commits_fingerprint(commits: Iterable[Commit], below: int) -> int:
    """A 63-bit digest of the names (sequence and epoch) of ``commits`` below sequence ``below``,
    sorted: what a snapshot's cut keeps. Pass the visible commits; any change among them (one
    removed, or another run's commit at a number a removed one had) changes the digest."""
    names = sorted(c.file_name for c in commits if c.seq < below)
    digest = hashlib.sha256("\n".join(names).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1
