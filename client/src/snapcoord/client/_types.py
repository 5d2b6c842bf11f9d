"""Frozen dataclasses mirroring the messages of docs/api.md; the client's public API speaks only these.

Field names and units follow the wire (``*_ms`` are milliseconds since the epoch or durations in
milliseconds), so a value read here means what docs/api.md says it means. Sequences are stored as
tuples so that results can be compared, hashed and shipped to Spark tasks (they pickle). The maps
(``Snapshot.labels``, ``TaskSnapshot.checkpoints``, ``TaskSnapshot.uploads``) are private dict
copies left out of the hash; treat them as read-only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Offset:
    """A position in one partition of one stream (a Kafka topic-partition, a Fluss bucket...)."""

    stream: str
    partition: int
    #: The next position to read or write; -1 means "no data yet" where a request allows it.
    offset: int


@dataclass(frozen=True)
class SnapshotRef:
    """Names one generation snapshot of one application."""

    app_id: str
    generation: int


@dataclass(frozen=True)
class ProducerSnapshot:
    """The positions a sink starts writing from, as the registry stores them."""

    producer_id: str
    offsets: tuple[Offset, ...]
    created_at_ms: int
    expires_at_ms: int


@dataclass(frozen=True)
class Registration:
    """Answer of RegisterProducerOffsets.

    ``registered`` is False when a record already existed; ``snapshot`` is then the stored one (the
    positions to roll back to). After a retried call it can be the caller's own registration: see
    ``CoordinatorClient.register_producer_offsets``.
    """

    registered: bool
    snapshot: ProducerSnapshot


@dataclass(frozen=True)
class AdvanceResult:
    """Answer of AdvanceProducerOffsets: the registration's (as ``Registration``), and whether a
    live record of the previous producer id was deleted in the same transaction."""

    registered: bool
    snapshot: ProducerSnapshot
    previous_deleted: bool


@dataclass(frozen=True)
class TaskSnapshot:
    """One task's report: committed offsets and state checkpoints by state store name.

    ``checkpoints`` carry payloads inline; ``uploads`` name payloads streamed before the report with
    ``CoordinatorClient.upload_checkpoint`` (store name -> ``CheckpointUpload.upload_id``). A store
    is in one of the two, not both. Read back (GetSnapshot), every store is under ``checkpoints``.
    """

    task_id: str
    committed_offsets: tuple[Offset, ...] = ()
    checkpoints: Mapping[str, bytes] = field(default_factory=dict, hash=False)
    uploads: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        # Accept any iterable or mapping from callers, keep immutable-ish copies.
        object.__setattr__(self, "committed_offsets", tuple(self.committed_offsets))
        object.__setattr__(self, "checkpoints", dict(self.checkpoints))
        object.__setattr__(self, "uploads", dict(self.uploads))


@dataclass(frozen=True)
class CheckpointUpload:
    """A checkpoint payload stored by ``upload_checkpoint``: report it in ``TaskSnapshot.uploads``.
    ``size`` and ``sha256`` (hex) are what the coordinator stored, as it computed them."""

    upload_id: str
    size: int
    sha256: str


class SnapshotState(enum.Enum):
    """Lifecycle of a generation snapshot. ``UNSPECIFIED`` stands for a state this client does not
    know (a newer coordinator), so reading never fails on it."""

    UNSPECIFIED = "UNSPECIFIED"
    #: No snapshot was ever created for the application (generation 0).
    EMPTY = "EMPTY"
    CREATED = "CREATED"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"


@dataclass(frozen=True)
class Snapshot:
    """A generation snapshot. Headers (create, current, list, abort) carry no ``tasks``;
    ReportTaskSnapshot carries the reporting task; GetSnapshot carries all of them, with checkpoint
    payloads only when asked (``include_checkpoints``), else empty values under each store name."""

    app_id: str
    generation: int
    state: SnapshotState
    task_ids: tuple[str, ...] = ()
    tasks: tuple[TaskSnapshot, ...] = ()
    created_at_ms: int = 0
    completed_at_ms: int = 0
    expires_at_ms: int = 0
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Why an ABORTED snapshot was aborted ("timeout" when the janitor did it).
    abort_reason: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_ids", tuple(self.task_ids))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        object.__setattr__(self, "labels", dict(self.labels))

    @property
    def ref(self) -> SnapshotRef:
        """This snapshot's name, e.g. to lease it."""
        return SnapshotRef(self.app_id, self.generation)


@dataclass(frozen=True)
class RetentionPolicy:
    """Per-app retention: keep the newest ``keep_last_completed`` completed snapshots, delete ended
    ones older than ``completed_ttl_ms``."""

    app_id: str
    keep_last_completed: int
    completed_ttl_ms: int


@dataclass(frozen=True)
class Lease:
    """A lease pinning snapshots against deletion until ``expires_at_ms`` (set by the coordinator)."""

    lease_id: str
    duration_ms: int
    expires_at_ms: int
    snapshots: tuple[SnapshotRef, ...] = ()


@dataclass(frozen=True)
class AcquireResult:
    """Answer of AcquireSnapshots: the lease, and the requested snapshots that do not exist (never
    created, or deleted already) and so could not be pinned."""

    lease: Lease
    unavailable: tuple[SnapshotRef, ...] = ()


@dataclass(frozen=True)
class PartitionBacklog:
    """One partition's backlog boundary and progress; finished once ``position >= boundary``."""

    stream: str
    partition: int
    boundary: int
    position: int
    finished: bool


@dataclass(frozen=True)
class BacklogStatus:
    """Whether a job is still processing its backlog. ReportProgress answers without
    ``partitions``; MarkBacklog and GetBacklogStatus list every marked partition, and MarkBacklog
    in ``added`` the partitions this call added to a stored mark (with their boundaries)."""

    job_id: str
    processing_backlog: bool
    partitions: tuple[PartitionBacklog, ...] = ()
    added: tuple[Offset, ...] = ()
    #: How many partitions progress reports named that the mark does not (MarkBacklog and
    #: GetBacklogStatus; mark them to track them).
    unmarked_partitions: int = 0


@dataclass(frozen=True)
class ProgressResult:
    """Answer of ReportProgress: the partitions this very call finished (each is reported exactly
    once, to exactly one call), and the job's status."""

    newly_finished: tuple[Offset, ...]
    status: BacklogStatus
    #: The reported positions of partitions the mark does not name (not backlog, not stored), in
    #: (stream, partition) order: mark them (``mark_backlog`` adds them to the stored mark).
    unmarked: tuple[Offset, ...] = ()


@dataclass(frozen=True)
class CommitClaim:
    """One write's hold on log number ``seq`` of a table: the writer's ``epoch`` (its run) and its
    own name for the write (``attempt``; "fence" for the number a FenceTable claimed)."""

    seq: int
    epoch: int
    attempt: str
    claimed_at_ms: int


@dataclass(frozen=True)
class TableFence:
    """Answer of FenceTable: the table's fence after the call, and the number claimed for the fence
    (attempt "fence"), where the fencing run's writes start."""

    fence_epoch: int
    from_seq: int


@dataclass(frozen=True)
class CommitClaimResult:
    """Answer of ClaimCommit: ``granted`` when this write (epoch and attempt) holds the claim, also
    after a retry; otherwise ``holder`` is the other write's claim. ``fence_epoch`` is the table's
    fence (0 when it has none)."""

    granted: bool
    holder: CommitClaim
    fence_epoch: int


@dataclass(frozen=True)
class CommitClaims:
    """Answer of GetCommitClaims: the table's fence (0 when none) and its claims from the requested
    number on, in number order; ``next_seq`` is one above the highest claim (0 when there is none)."""

    fence_epoch: int
    claims: tuple[CommitClaim, ...]
    next_seq: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "claims", tuple(self.claims))


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a List* call; pass ``next_page_token`` back for the next one ("" = last page)."""

    items: tuple[T, ...]
    next_page_token: str = ""

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)
