"""The commit log of ``PartitionedFileSink``, in the format of Spark's own file sink (pure logic, no I/O).

The log is ``<table>/_spark_metadata``, exactly as Spark's streaming file sink keeps it, so that every
Spark reader of the table (``spark.read.parquet/json(table)``, ``spark.readStream`` on it) reads the
files the log lists and nothing else:

- entry ``<N>`` (``N`` = 0, 1, 2, ... with no gaps) is ``v1`` followed by one JSON line per file
  (``{"path": <URI>, "size": ..., "isDir": false, ..., "action": "add"}``);
- every ``compact_interval``-th entry (``(N + 1) % interval == 0``) is ``<N>.compact`` instead and
  holds every line of the entries before it as well (Spark readers start from the newest compact
  file and then read the entries after it, and fail on a missing number).

Each entry the sink writes starts with one *marker* line: a directory entry (``"isDir": true``) whose
path ends in ``_snapcoord-<kind>-s<N>-e<epoch>-b<batch>-a<attempt>``. Spark readers skip directory
entries (they list files only), so the marker is invisible to them; it tells the sink which run
wrote the entry, for which batch, and what the entry is:

- ``data``: a batch written by ``PartitionedFileSink.write``, followed by its files;
- ``fence``: an empty batch that a new run's fence creates at the first free number, so that a late
  create of that number by an older run (a zombie driver) fails;
- ``void``: an empty batch that replaced a rolled-back or cut batch. Entries are never deleted, only
  replaced: a deleted number could be created again by a zombie, and a gap stops every reader.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from snapcoord.spark_connector.sink.spark_sink_log import (
    ADD,
    DEFAULT_COMPACT_INTERVAL,
    SinkFileStatus,
    format_entry,
)
from snapcoord.spark_connector.sink.spark_sink_log import LOG_DIR as METADATA_DIR
from snapcoord.spark_connector.sink.spark_sink_log import parse_entry as parse_sink_entry

__all__ = ["DEFAULT_COMPACT_INTERVAL", "METADATA_DIR"]

#: Fences (``e<epoch>.intent``, ``e<epoch>.json``) below the table; Spark readers ignore ``_`` names.
FENCES_DIR = "_fences"
#: Where the marker lines point (nothing is stored there).
MARKER_DIR = "_snapcoord"
#: The directory of the previous format of this sink's commit log (refused, see ``LegacyTable``).
LEGACY_COMMITS_DIR = "_commits"
DATA, FENCE, VOID = "data", "fence", "void"
_MARKER_RE = re.compile(
    r"^_snapcoord-(?P<kind>data|fence|void)-s(?P<seq>\d+)-e(?P<epoch>\d+)-b(?P<batch>\d+|none)"
    r"-a(?P<attempt>[0-9a-z]+)$"
)
_FENCE_RE = re.compile(r"^e(?P<epoch>\d{12})\.json$")
_FENCE_INTENT_RE = re.compile(r"^e(?P<epoch>\d{12})\.intent$")
#: Block size and replication reported for listed files (Spark's sink copies them from the file
#: system; readers use neither for splitting).
_BLOCK_SIZE = 32 * 1024 * 1024


@dataclass(frozen=True)
class Commit:
    """One entry of the log as this sink wrote it: ``files`` are paths relative to the table root."""

    seq: int
    epoch: int
    batch_id: int | None
    files: tuple[str, ...]
    kind: str = DATA
    attempt: str = "0"

    @property
    def file_name(self) -> str:
        """The entry's identity (sequence, writer, kind): what a snapshot's fingerprint digests."""
        return marker_name(self)

    @property
    def is_data(self) -> bool:
        return self.kind == DATA


@dataclass(frozen=True)
class Fence:
    epoch: int
    from_seq: int


@dataclass(frozen=True)
class FileLine:
    """One file of an entry (a Spark ``SinkFileStatus``)."""

    path: str  # relative to the table root
    size: int
    modification_ms: int


def marker_name(commit: Commit) -> str:
    batch = "none" if commit.batch_id is None else str(commit.batch_id)
    return f"_snapcoord-{commit.kind}-s{commit.seq}-e{commit.epoch}-b{batch}-a{commit.attempt}"


def fence_file_name(epoch: int) -> str:
    return f"e{epoch:012d}.json"


def fence_intent_name(epoch: int) -> str:
    return f"e{epoch:012d}.intent"


def parse_fence_name(name: str) -> int | None:
    m = _FENCE_RE.match(name)
    return int(m.group("epoch")) if m else None


def parse_fence_intent_name(name: str) -> int | None:
    m = _FENCE_INTENT_RE.match(name)
    return int(m.group("epoch")) if m else None


def render_entry(
    commits: Sequence[Commit], files: Sequence[Sequence[FileLine]], uri: Callable[[str], str], now_ms: int
) -> bytes:
    """The bytes of one log entry holding ``commits`` (one for an entry, all of them for a compact
    file), each as its marker followed by its files; ``uri`` turns a table-relative path into the URI
    Spark reads."""
    statuses: list[SinkFileStatus] = []
    for commit, its_files in zip(commits, files, strict=True):
        marker = uri(f"{MARKER_DIR}/{marker_name(commit)}")
        statuses.append(SinkFileStatus(marker, 0, True, now_ms, 1, _BLOCK_SIZE, ADD))
        statuses += [
            SinkFileStatus(uri(f.path), f.size, False, f.modification_ms, 1, _BLOCK_SIZE, ADD)
            for f in its_files
        ]
    return format_entry(statuses)


def parse_entry(
    data: bytes, relative: Callable[[str], str], name: str
) -> list[tuple[Commit, list[FileLine]]]:
    """The commits of one log entry with their files, in order. ``relative`` turns a URI back into a
    table-relative path. Files before any marker (a log another writer made) belong to a commit of
    epoch 0 and no batch id."""
    out: list[tuple[Commit, list[FileLine]]] = []
    for status in parse_sink_entry(data, name):
        if status.is_dir:
            m = _MARKER_RE.match(status.path.rstrip("/").rpartition("/")[2])
            if m:
                batch = m.group("batch")
                commit = Commit(
                    int(m.group("seq")),
                    int(m.group("epoch")),
                    None if batch == "none" else int(batch),
                    (),
                    m.group("kind"),
                    m.group("attempt"),
                )
                out.append((commit, []))
            continue
        if not out:
            out.append((Commit(-1, 0, None, (), DATA, "foreign"), []))
        out[-1][1].append(FileLine(relative(status.path), status.size, status.modification_time))
    return [(replace_files(c, [f.path for f in fs]), fs) for c, fs in out]


def replace_files(commit: Commit, files: Iterable[str]) -> Commit:
    return Commit(commit.seq, commit.epoch, commit.batch_id, tuple(files), commit.kind, commit.attempt)


def commits_fingerprint(commits: Iterable[Commit], below: int) -> int:
    """A 63-bit digest of the identities (sequence, writer, kind) of ``commits`` below sequence
    ``below``: what a snapshot's cut keeps. Any change among them (a batch replaced by an empty one,
    another run's batch at a number a cut one had) changes the digest."""
    names = sorted(c.file_name for c in commits if c.seq < below)
    digest = hashlib.sha256("\n".join(names).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1
