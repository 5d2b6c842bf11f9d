"""Where backlogs live, and how each operation uses that layout (``registry`` runs the operations,
``decide`` holds their rules, ``domain.backlog`` the rules of progress).

Layout. A job of 10,000 partitions does not fit one znode (200-character stream names alone make
2 MB), nor one transaction of all its pieces (ZooKeeper's 1 MB bound covers a whole multi), so:

- **Boundaries go to S3**, immutable, at ``backlog/<job_id>/<mark_id>.json``: versioned JSON,
  grouped by stream, in (stream, partition) order, which numbers the partitions 0..N-1. For 10,000
  partitions of one stream that is ~160 KB; at worst (10,000 streams of 200 characters) ~2.6 MB.
  Replicas cache them in memory by mark id (they never change), so a report reads no S3.
- **The job record** ``/backlog/jobs/<job_id>`` (ZooKeeper, at most ~440 bytes) names the mark (a
  UUID, also the object's name), its partition count and shard size, and holds the SHA-256 of
  the boundaries object, checked on every read of it.
- **Progress shards** ``/backlog/jobs/<job_id>/s-<mark_id>-<k>`` hold the positions of partitions
  ``k*1024 .. k*1024+1023`` by index, plus the tag of the report that finished each one: no stream
  names, so ~11 KB with 10-digit offsets, ~37 KB once all are finished, ~46 KB at worst. 10,000
  partitions make 10 shards: 110-460 KB in ZooKeeper, which also fits one progress transaction.
  Every update is a compare-and-set on the shard's version, so reports on different shards never
  contend and each partition flips to finished in exactly one committed write, whose writer's tag
  it keeps (``domain.backlog``: that is how ``newly_finished`` is exactly once).
- **Remaining markers** ``/backlog/jobs/<job_id>/r-<mark_id>-<k>-<n>`` (no data) exist while shard
  ``k`` has ``n > 0`` unfinished partitions. The write that finishes partitions of a shard renames
  its marker in the same transaction, so one ``children`` call tells whether the job is still
  processing backlog and how many partitions remain, without reading any shard.

- **The unmarked set** ``/backlog/jobs/<job_id>/u-<mark_id>`` (absent until a report names a
  partition the mark does not) holds a 16-character hash of each such partition, at most
  ``--backlog-max-partitions`` (170 KB at 10,000), for GetBacklogStatus and the gauges. Its writes
  check the mark's first shard (``Check``), so none lands on a mark reset or cleared; one that
  lands between a grow's read and its commit is left under the job (no harm: only the current
  mark's set counts, and the next reset, grow or clear deletes every node of the job).

Every progress node carries the mark id in its name, so a reporter that read an older mark can
never write into a newer one (its shard path no longer exists), whatever the versions say.

Operations. MarkBacklog uploads the boundaries, then commits record, shards and markers in one
transaction that fails if a record exists (first mark wins; losers delete their upload and return
the stored status); ``reset`` instead replaces the record by version and deletes the old mark's
nodes in the same transaction, then the old object. A mark naming partitions the stored one lacks
*grows* it the same way, under a new mark id: new boundaries object (the union), record by version,
the old mark's shards deleted by their versions (a report that wrote one meanwhile fails the
commit, which reads again and carries that position over), new shards created holding the old
progress re-indexed, with its report tags, all in one transaction (at most ~460 KB at 10,000
partitions; a grow whose progress would not fit one transaction is refused). ReportProgress merges
into the shards it touches (the record comes from this process's copy, the boundaries from the
cache, the shards from this process's copies, else read) and commits the changed shards with their
markers in transactions of at most ``chunk_bytes`` of data (one for 10,000 partitions; the bound
matters from ~11,000 on); a lost compare-and-set re-reads only the shards of that transaction. The
record copy needs no check of its own: the shards of a mark exist exactly while the record names it
(they are created and deleted with it, in one transaction), so reading or writing them proves the
copy current, and a copy of a reset, grown or cleared mark finds them gone and reads the record
(``cache.JobCopies``). A shard copy is checked by the write's version (``cache.ShardCopies``); one
the report would not write is read first. Steady state: one multi for a report of n partitions,
plus one ``children`` call once every shard it touched is done; the first report a process makes on
a mark it has not seen reads the record, then the shards (ceil(n/1024) reads, together).
ClearBacklog deletes the nodes and the record in one version-checked transaction, then the object.
An object whose record is gone (a crash between upload and commit, or a failed delete) is swept by
the janitor once older than the grace period.
"""

from __future__ import annotations

JOBS = "/backlog/jobs"


def job_path(job_id: str) -> str:
    return f"{JOBS}/{job_id}"


def shard_path(job_id: str, mark_id: str, shard: int) -> str:
    return f"{job_path(job_id)}/{shard_name(mark_id, shard)}"


def shard_name(mark_id: str, shard: int) -> str:
    return f"s-{mark_id}-{shard}"


def marker_path(job_id: str, mark_id: str, shard: int, unfinished: int) -> str:
    return f"{job_path(job_id)}/{marker_name(mark_id, shard, unfinished)}"


def marker_name(mark_id: str, shard: int, unfinished: int) -> str:
    return f"r-{mark_id}-{shard}-{unfinished}"


def parse_marker(name: str) -> tuple[str, int, int] | None:
    """``r-<mark>-<shard>-<n>`` -> (mark_id, shard, n); None for other names."""
    parts = name.split("-")
    if len(parts) != 4 or parts[0] != "r" or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    return parts[1], int(parts[2]), int(parts[3])


def unmarked_path(job_id: str, mark_id: str) -> str:
    return f"{job_path(job_id)}/{unmarked_name(mark_id)}"


def unmarked_name(mark_id: str) -> str:
    return f"u-{mark_id}"
