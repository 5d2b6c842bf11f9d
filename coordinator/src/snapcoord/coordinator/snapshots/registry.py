"""Generation snapshots: the SnapshotService logic on the commit kernel.

The rules of each change are in ``decide``, the paths in ``layout``, the janitor's steps in
``janitor``, the in-memory current-snapshot cache in ``cache``. Here: validation, uploads' names,
the reads that are not decisions (pages, payloads), metrics and logs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.lru import Lru
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.paging import decode_generation_token, encode_generation_token
from snapcoord.coordinator.domain.quoting import quote_prefix
from snapcoord.coordinator.domain.snapshot_codec import (
    CHECKPOINT_PAYLOAD,
    checked_payload,
    checked_pieces,
    decode_task_report,
    encode_snapshot,
    encode_task_report,
)
from snapcoord.coordinator.domain.snapshots import (
    MAX_REASON_CHARS,
    TIMEOUT_REASON,
    WIDEST_REASON,
    CheckpointRef,
    RetentionPolicy,
    Snapshot,
    SnapshotPolicy,
    SnapshotRecord,
    State,
    TaskReport,
    empty_snapshot,
    report_digest_of,
    validate_create,
    validate_report,
    validate_retention,
)
from snapcoord.coordinator.errors import (
    Aborted,
    BadVersionError,
    BlobNotFound,
    CorruptRecord,
    InvalidArgument,
    NoNodeError,
    NotFound,
    Reason,
)
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.commit import CommitKernel, synced_retry
from snapcoord.coordinator.kernel.corruption import at, skipped
from snapcoord.coordinator.kernel.decision import Commit, Decision, ReadNode, Reads
from snapcoord.coordinator.kernel.payload_admission import PayloadBudget, message_hold
from snapcoord.coordinator.kernel.record_copies import RecordCache
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.snapshots import decide, pins
from snapcoord.coordinator.snapshots.cache import CurrentSnapshotCache
from snapcoord.coordinator.snapshots.janitor import SnapshotJanitor
from snapcoord.coordinator.snapshots.layout import (
    APPS,
    app_path,
    checkpoint_key,
    gen_path,
    gens_path,
    retention_path,
    task_path,
    tasks_path,
)
from snapcoord.coordinator.snapshots.read_ahead import read_ahead
from snapcoord.coordinator.snapshots.report_copies import ReportCopies
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore, Node, Op

_log = logging.getLogger(__name__)


#: GetSnapshot's payload reads of all calls share these threads (a call's reads run together).
def missing_checkpoint(ref: CheckpointRef) -> CorruptRecord:
    """The error of a checkpoint object its report names that is not in the blob store."""
    return CorruptRecord(
        f"checkpoint payload of store {ref.store!r} is missing", kind=CHECKPOINT_PAYLOAD, path=ref.object_key
    )


_READS = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="payload-read")

DEFAULT_PAGE_SIZE = 50
#: The pieces ReadCheckpoint streams: large enough for throughput, small next to any budget.
CHUNK_BYTES = 1024 * 1024
#: Pieces of a ReadCheckpoint read from the blob store ahead of the one being sent (measured, paired
#: on one machine: two ahead were no faster than one).
READ_AHEAD_PIECES = 1
MAX_PAGE_SIZE = 1000
#: Most bytes in one UploadCheckpoint message: the pieces the server holds while streaming.
MAX_UPLOAD_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class CheckpointUpload:
    """A stored upload: what a report names in ``uploaded_checkpoints``, and what was stored."""

    upload_id: str
    size: int
    sha256: str


@dataclass(frozen=True)
class SnapshotPayloads:
    """A snapshot with its checkpoint payloads: ``payloads[(task_id, store)]``."""

    snapshot: Snapshot
    payloads: Mapping[tuple[str, str], bytes]


class SnapshotRegistry:
    """Create, report, read, abort, delete and retain generation snapshots."""

    def __init__(
        self,
        metadata: MetadataStore,
        blobs: BlobStore,
        clock: Clock,
        policy: SnapshotPolicy,
        metrics: CoordinatorMetrics,
        *,
        cache_size: int = 10_000,
        delete_batch_bytes: int | None = None,
        payload_budget: PayloadBudget | None = None,
        kernel: CommitKernel | None = None,
    ) -> None:
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._kernel = kernel or CommitKernel(metadata, blobs, metrics, now_ms=clock.now_ms)
        #: Path bytes of task deletes per deletion step: half a request (tests make it small).
        self._delete_batch_bytes = delete_batch_bytes or policy.max_request_bytes // 2
        #: Payload bytes in flight across calls; unbounded for tests that build their own.
        self._budget = payload_budget or PayloadBudget(2**62, 0)
        #: app -> the current generation last seen, so that a read of the pointer can read that
        #: header in the same round trip (a wrong guess costs the round it would have cost anyway).
        self._generations: Lru[str, int] = Lru(max(cache_size, 10_000))
        self._cache = CurrentSnapshotCache(metadata, self._present, self._guess, max_apps=cache_size)
        #: app pointer path -> the node as this process last wrote or read it (CreateSnapshot).
        self._apps = RecordCache(max(cache_size, 10_000))
        #: Open snapshots' headers and report counters as this process last committed them.
        self._reports = ReportCopies()
        #: (app, task set, labels) -> the largest header they can make (``_check_header_size``);
        #: at most a few MiB of keys.
        self._header_sizes: Lru[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], int] = Lru(
            4 * 1024 * 1024
        )
        self._janitor = SnapshotJanitor(
            self._kernel,
            metadata,
            blobs,
            clock,
            policy,
            metrics,
            abort=self.abort,
            delete=lambda app_id, generation, newer: self.delete(app_id, generation, newer=newer),
        )

    @property
    def kernel(self) -> CommitKernel:
        """The commit kernel this registry commits through."""
        return self._kernel

    # --- the API ----------------------------------------------------------------------------

    def create(
        self, app_id: str, task_ids: Sequence[str], ttl_ms: int, timeout_ms: int, labels: Mapping[str, str]
    ) -> Snapshot:
        """The current snapshot if it is CREATED (a retry is safe), else generation + 1."""
        tasks, ttl, timeout, label_items = validate_create(
            app_id, task_ids, ttl_ms, timeout_ms, labels, self._policy
        )
        self._check_header_size(app_id, tasks, label_items)
        request = decide.CreateRequest(app_id, tasks, ttl, timeout, label_items)
        path = app_path(app_id)
        # This process's copy of the app's pointer stands in for its read (``decide.create`` says
        # why a stale one is harmless): the call reads only the current header, then commits.
        copy = self._apps.get(path)
        last: list[tuple[Decision[decide.Outcome], Node | None]] = []

        def tracked(reads: Reads, pending: Commit[decide.Outcome] | None) -> Decision[decide.Outcome]:
            decision = decide.create(request, reads, pending, self._clock.now_ms())
            last[:] = [(decision, reads.node(path))]
            return decision

        try:
            outcome = self._kernel.run(
                "snapshot_create",
                {"app_id": app_id},
                [ReadNode(path)],
                tracked,
                assume=Reads({path: copy}) if copy is not None else None,
            )
        except Exception:
            self._apps.forget(path)
            raise
        decision, pointer = last[0]
        if isinstance(decision, Commit):
            self._apps.committed(path, decision)
            self._reports.created(app_id, outcome.snapshot.record.generation, decision.ops)
        elif pointer is not None:  # as read, or the copy the answer was found current with
            self._apps.remember(path, pointer)
        if outcome.changed:
            self._metrics.snapshots_created.inc()
        # The pointer is at this generation now (or was, when the answer was found CREATED): the
        # app's first consistent or cold cached read here guesses its header and needs one round
        # instead of two. A guess outrun by a create elsewhere costs only the round it saved.
        self._generations.put(app_id, outcome.snapshot.record.generation)
        return outcome.snapshot

    def current(self, app_id: str, *, consistent: bool) -> Snapshot:
        """The snapshot at the app's current generation (header only; GetSnapshot has the tasks)."""
        require_id("app_id", app_id)
        if consistent:
            return self._load_current(app_id)
        return self._cache.get(app_id)

    def get(self, app_id: str, generation: int, *, include_checkpoints: bool) -> SnapshotPayloads:
        """One snapshot with every task report; payloads too when ``include_checkpoints``.
        NOT_FOUND only after a sync: the generation may just have been created elsewhere."""
        require_id("app_id", app_id)
        return synced_retry(self._metadata, lambda: self._get(app_id, generation, include_checkpoints))

    def _get(self, app_id: str, generation: int, include_checkpoints: bool) -> SnapshotPayloads:
        header = self._read(app_id, generation) if generation > 0 else None
        while True:
            if header is None:
                raise NotFound(f"app {app_id!r} has no snapshot at generation {generation}")
            # A completed snapshot lists every task that reported: their nodes are read in one round
            # (no listing first); otherwise the listing says which did.
            done = header.record.state is State.COMPLETED
            reports, again = self._read_reports(app_id, generation, header.record.task_ids if done else None)
            # The header is read again after the reports (in the same round): the answer is one
            # moment's only if it did not change in between (the last report completes it in the
            # commit that adds its node; a deletion marks it before removing nodes). Else again.
            if again is not None and again.version == header.version:
                break
            header = again
        payloads: dict[tuple[str, str], bytes] = {}
        if include_checkpoints:
            size = sum(ref.size for report in reports for ref in report.checkpoints)
            if size > self._policy.max_inline_read_bytes:
                raise InvalidArgument(
                    f"include_checkpoints would return {size} payload bytes in one message; the limit "
                    f"is {self._policy.max_inline_read_bytes} (--snapshot-max-inline-read): get the "
                    "snapshot without them and stream each payload with ReadCheckpoint",
                    reason=Reason.TOO_LARGE,
                    metadata={
                        "field": "include_checkpoints",
                        "limit": self._policy.max_inline_read_bytes,
                        "size": size,
                    },
                )
            wanted: list[tuple[tuple[str, str], CheckpointRef]] = []
            for report in reports:
                for ref in report.checkpoints:
                    if ref.inline is not None:
                        payloads[(report.task_id, ref.store)] = checked_payload(ref, ref.inline)
                    else:
                        wanted.append(((report.task_id, ref.store), ref))
            with self._budget.hold(size, f"GetSnapshot of app {app_id!r} generation {generation}"):
                # Every payload is fetched at once (the raw bound gets them one by one).
                futures = [_READS.submit(self._blobs.get, ref.object_key) for _, ref in wanted]
                concurrent.futures.wait(futures)
                for (slot, ref), future in zip(wanted, futures, strict=True):
                    try:
                        payloads[slot] = checked_payload(ref, future.result())
                    except BlobNotFound:
                        if self._read(app_id, generation) is None:
                            raise NotFound(
                                f"app {app_id!r} generation {generation} was deleted meanwhile"
                            ) from None
                        raise missing_checkpoint(ref) from None
        return SnapshotPayloads(Snapshot(header.record, tuple(reports)), payloads)

    def read_checkpoint(
        self, app_id: str, generation: int, task_id: str, store: str
    ) -> tuple[CheckpointRef, Generator[bytes, None, None]]:
        """One checkpoint payload as pieces of at most ``CHUNK_BYTES``, read from the blob store
        as the caller consumes them, ``READ_AHEAD_PIECES`` ahead when there is more than one (on a
        helper thread, so the store's latency overlaps the send); the pieces that may be in
        memory are held from the payload budget from the first piece to the last. The ref comes
        first (size, hash) so the caller can frame the stream. NOT_FOUND only after a sync (the
        report may just have been made through another replica)."""
        require_id("app_id", app_id)
        require_id("task_id", task_id)
        require_id("store", store)
        return synced_retry(self._metadata, lambda: self._read_checkpoint(app_id, generation, task_id, store))

    def _read_checkpoint(
        self, app_id: str, generation: int, task_id: str, store: str
    ) -> tuple[CheckpointRef, Generator[bytes, None, None]]:
        if generation <= 0 or self._read(app_id, generation) is None:
            raise NotFound(f"app {app_id!r} has no snapshot at generation {generation}")
        node = self._metadata.get(task_path(app_id, generation, task_id))
        with at(task_path(app_id, generation, task_id)):
            report = decode_task_report(node.data) if node is not None else None
        if report is None:
            raise NotFound(f"task {task_id!r} has not reported for app {app_id!r} generation {generation}")
        ref = next((c for c in report.checkpoints if c.store == store), None)
        if ref is None:
            raise NotFound(f"task {task_id!r} has no checkpoint for store {quote_prefix(store)}")
        if ref.inline is not None:
            data = checked_payload(ref, ref.inline)
            return ref, (data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES))
        try:
            pieces = self._blobs.get_stream(ref.object_key, CHUNK_BYTES)
        except BlobNotFound:
            if self._read(app_id, generation) is None:
                raise NotFound(f"app {app_id!r} generation {generation} was deleted meanwhile") from None
            raise missing_checkpoint(ref) from None
        # A payload of one piece has nothing to read ahead: no helper thread for it.
        ahead = READ_AHEAD_PIECES if ref.size > CHUNK_BYTES else 0
        return ref, self._budgeted(pieces, ahead, f"ReadCheckpoint of {ref.object_key}", ref)

    def _budgeted(
        self, pieces: Generator[bytes, None, None], ahead: int, what: str, ref: CheckpointRef
    ) -> Generator[bytes, None, None]:
        """``pieces``, ``ahead`` of them read ahead (``read_ahead``), holding from the payload budget
        the pieces that may be in memory at once: the one the caller has and those read ahead.
        Checked against ``ref`` as they pass (``checked_pieces``)."""
        with contextlib.closing(pieces), self._budget.hold((ahead + 1) * CHUNK_BYTES, what):
            yield from checked_pieces(ref, read_ahead(pieces, ahead, "read-ahead") if ahead else pieces)

    def upload(
        self, app_id: str, generation: int, task_id: str, store: str, pieces: Iterable[bytes]
    ) -> CheckpointUpload:
        """Stream one checkpoint payload into the blob store for a later report to reference.

        Checked like a report first (CREATED, current generation, task in the task set), before a
        byte is read; the intent naming the object is created in the same round trip as the
        check's reads, and withdrawn if the check refuses. Then the payload is streamed into the
        blob store (bounded memory: the store's part buffer and one piece, held from the payload
        budget for the whole call), hashed once as it passes, and the intent marked complete with
        size and hash. Any failure removes the object and the intent; a crash leaves both to the
        janitor (the intent outlives the crash, the object is never referenced without it).
        """
        require_id("app_id", app_id)
        if generation <= 0:
            raise InvalidArgument(f"generation is {generation}; generations start at 1")
        require_id("task_id", task_id)
        require_id("store", store)
        unique = uuid.uuid4().hex
        key = checkpoint_key(app_id, generation, task_id, unique)
        target = intents.UploadInfo(app_id, generation, task_id, store)
        # One message may be as large as gRPC's receive limit (a piece over the chunk size is
        # refused only once it is received): the hold covers such a message, not a chunk.
        held = self._blobs.stream_buffer_bytes + message_hold(self._policy.max_report_bytes)
        now = self._clock.now_ms()
        index = self._kernel.intents
        first: list[Mapping[str, Node | None]] = []  # the first check's reads, if made already
        early = index.ready(now)  # (a refused call must not leave a bucket it made: see ready)
        if early:
            path, upload_id, nodes = index.announce_and_read(
                [key], now, [gen_path(app_id, generation), app_path(app_id)], target
            )
            first.append(nodes)
        with contextlib.ExitStack() as stack:
            try:
                synced_retry(
                    self._metadata,
                    lambda: self._check_uploadable(
                        app_id, generation, task_id, first.pop() if first else None
                    ),
                )
                stack.enter_context(self._budget.hold(held, f"UploadCheckpoint of task {task_id!r}"))
            except BaseException:
                if early:
                    index.withdraw(path, intents.CREATED_VERSION)  # nothing was put
                raise
            if not early:
                path, upload_id = index.announce([key], now, target)
            digest = hashlib.sha256()
            size = [0]

            def counted() -> Iterator[bytes]:
                for piece in pieces:
                    if len(piece) > MAX_UPLOAD_CHUNK_BYTES:
                        raise InvalidArgument(
                            f"an UploadCheckpoint message carries {len(piece)} bytes of data; the limit "
                            f"per message is {MAX_UPLOAD_CHUNK_BYTES}: send smaller pieces",
                            reason=Reason.TOO_LARGE,
                            metadata={"field": "data", "limit": MAX_UPLOAD_CHUNK_BYTES, "size": len(piece)},
                        )
                    size[0] += len(piece)
                    if size[0] > self._policy.max_upload_bytes:
                        raise InvalidArgument(
                            f"the upload exceeds {self._policy.max_upload_bytes} bytes "
                            "(--snapshot-max-upload-size)",
                            reason=Reason.TOO_LARGE,
                            metadata={"field": "data", "limit": self._policy.max_upload_bytes},
                        )
                    digest.update(piece)
                    yield piece

            try:
                self._blobs.put_stream(key, counted())
            except BaseException:
                # put_stream leaves no object; delete anyway (a put whose reply was lost may have
                # landed), then the intent. If either fails, the janitor finishes the job.
                self._kernel.delete_objects([key])
                self._kernel.intents.withdraw(path, intents.CREATED_VERSION)
                raise
            done = intents.Intent((key,), now, replace(target, size=size[0], sha256=digest.hexdigest()))
            try:
                self._kernel.intents.complete(path, done)
            except (BadVersionError, NoNodeError):
                # The sweep claimed the intent while we streamed; it may have deleted the key
                # before our put landed, so the object is ours to remove now.
                self._kernel.delete_objects([key])
                raise Aborted(
                    f"upload {upload_id} of task {task_id!r} was collected by the janitor before it finished "
                    "(it outlived --orphan-grace after its snapshot ended): upload again",
                    reason=Reason.CONTENDED,
                ) from None
        return CheckpointUpload(upload_id, size[0], digest.hexdigest())

    def _check_uploadable(
        self, app_id: str, generation: int, task_id: str, nodes: Mapping[str, Node | None] | None
    ) -> None:
        """Refuse an upload a report could not use: the same checks, the same reasons. ``nodes``:
        the header and the pointer when already read."""
        if nodes is None:
            nodes = self._metadata.get_many([gen_path(app_id, generation), app_path(app_id)])
        header = decide.stored(nodes[gen_path(app_id, generation)])
        decide.fence(app_id, generation, header, decide.current_generation(nodes[app_path(app_id)]))
        assert header is not None
        if task_id not in header.record.task_ids:
            raise InvalidArgument(
                f"task {task_id!r} is not in the task set of app {app_id!r} generation {generation} "
                f"({len(header.record.task_ids)} tasks)"
            )

    def list_page(self, app_id: str, page_size: int, page_token: str) -> tuple[list[Snapshot], str]:
        """Snapshot headers, newest first, and the token of the next page."""
        require_id("app_id", app_id)
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(
                f"page_size is {page_size}; use 1-{MAX_PAGE_SIZE}, or 0 for {DEFAULT_PAGE_SIZE}"
            )
        size = page_size or DEFAULT_PAGE_SIZE
        before = decode_generation_token(page_token)
        names = sorted(
            (int(n) for n in self._metadata.children(gens_path(app_id)) if n.isdigit()), reverse=True
        )
        if before:
            names = [g for g in names if g < before]
        page: list[Snapshot] = []
        i = 0
        while i < len(names) and len(page) < size:
            batch = names[i : i + size - len(page)]  # the headers of a page are read together
            nodes = self._metadata.get_many([gen_path(app_id, g) for g in batch])
            for generation in batch:
                i += 1
                try:
                    with at(gen_path(app_id, generation)):
                        header = decide.stored(nodes[gen_path(app_id, generation)])
                except CorruptRecord as e:  # its neighbours are listed; the log and metric name it
                    skipped(self._metrics, e, "ListSnapshots")
                    continue
                if header is not None:
                    page.append(Snapshot(header.record, ()))
        return page, (encode_generation_token(names[i - 1]) if i < len(names) else "")

    def report(
        self,
        app_id: str,
        generation: int,
        task_id: str,
        offsets: Iterable[Offset],
        checkpoints: Mapping[str, bytes],
        uploads: Mapping[str, str] | None = None,
    ) -> Snapshot:
        """Record one task's report; the report that completes the task set completes the snapshot.

        Returns the header and the task's own report. The same report again is idempotent (also
        after completion); anything for another generation, or a snapshot no longer CREATED, is
        fenced with FAILED_PRECONDITION naming the current generation.
        """
        uploads = uploads or {}
        items = validate_report(app_id, generation, task_id, offsets, checkpoints, self._policy, uploads)
        uploaded: list[tuple[str, str, str]] = []
        for store, upload_id in sorted(uploads.items()):
            path = intents.path_of(upload_id)
            if path is None:
                raise InvalidArgument(
                    f"task.uploaded_checkpoints[{quote_prefix(store)}] is {quote_prefix(upload_id)}, not an "
                    "upload_id that UploadCheckpoint returns"
                )
            uploaded.append((store, upload_id, path))
        hashes = {store: hashlib.sha256(p).hexdigest() for store, p in checkpoints.items()}
        # An uploaded store enters the digest by its upload id: a repeat of the report is then
        # recognised without the intent, which the first report's commit deleted.
        digest = report_digest_of(items, {**hashes, **{s: f"upload:{u}" for s, u, _ in uploaded}})
        # Sized with the uploads' refs at their widest (their size and hash come from the intents).
        widest = [
            CheckpointRef(s, checkpoint_key(app_id, generation, task_id, "0" * 32), 2**63 - 1, "0" * 64)
            for s, _, _ in uploaded
        ]
        # Small checkpoints are held by the report in ZooKeeper (no blob store call, no intent),
        # unless that makes the stored report too large: then every one goes to the blob store, as
        # it would with inline checkpoints off, so inlining never refuses a report.
        inline_max = self._policy.inline_checkpoint_max_bytes
        for limit in (inline_max, -1) if inline_max > 0 else (-1,):
            refs: list[CheckpointRef] = []
            payloads: dict[str, bytes] = {}
            for store, payload in sorted(checkpoints.items()):
                if len(payload) <= limit:
                    refs.append(CheckpointRef(store, "", len(payload), hashes[store], inline=payload))
                    continue
                key = checkpoint_key(app_id, generation, task_id, uuid.uuid4().hex)
                refs.append(CheckpointRef(store, key, len(payload), hashes[store]))
                payloads[key] = payload
            encoded = encode_task_report(TaskReport(task_id, items, (*refs, *widest), digest))
            # Each upload also retires its intent in the report's transaction: a Delete op, counted
            # against the report's half of the request (the header has the other half).
            stored_size = len(encoded) + len(uploaded) * intents.RETIRE_OP_BYTES
            if stored_size <= self._policy.report_budget_bytes:
                break
        if stored_size > self._policy.report_budget_bytes:
            raise InvalidArgument(
                f"task.committed_offsets and task.checkpoints make a {stored_size}-byte stored report; "
                f"the limit is {self._policy.report_budget_bytes} bytes (half of --zk-max-request-bytes, "
                "less a reserve): report fewer offsets or shorter stream names",
                reason=Reason.TOO_LARGE,
                metadata={"field": "task", "limit": self._policy.report_budget_bytes, "size": stored_size},
            )
        request = decide.ReportRequest(
            app_id,
            generation,
            task_id,
            items,
            digest,
            tuple(refs),
            payloads,
            tuple(uploaded),
            # Without uploads, the report sized above is the one stored: encoded once.
            encoded=None if uploaded else encoded,
        )
        # This process's copies of the header and the report counter stand in for their read
        # (``report_copies`` says why a stale one is harmless); not with uploads, whose intents
        # the report reads.
        copies = None if uploaded else self._reports.assumed(app_id, generation)
        rounds: list[tuple[Reads, Decision[decide.Outcome]]] = []

        def tracked(reads: Reads, pending: Commit[decide.Outcome] | None) -> Decision[decide.Outcome]:
            decision = decide.report(request, reads, pending, self._clock.now_ms())
            rounds.append((reads, decision))
            return decision

        # The payloads are the request's own bytes: the call holds them from the payload budget
        # from before gRPC received its message until it returns (``server.admission``).
        try:
            outcome = self._kernel.run(
                "snapshot_report",
                {"app_id": app_id, "generation": generation},
                request.reads(),
                tracked,
                assume=copies,
                # The keys of the payloads bound for the blob store are made above: their intent
                # rides with the first reads (with copies, it is the request before the puts).
                announce=tuple(payloads),
                # The task's node is absent on a first report, and the commit's Create checks it.
                defer=[request.task_read()],
                # Every task of the snapshot may win a round before this one.
                contenders=self._policy.max_tasks,
            )
        except Exception:
            self._reports.forget(app_id, generation)
            raise
        reads, decision = rounds[-1]
        self._reports.reported(app_id, generation, reads, decision, copies)
        if outcome.changed:
            self._metrics.snapshots_completed.inc()
            header = outcome.snapshot.record
            _log.info("app %s generation %d completed (%d tasks)", app_id, generation, len(header.task_ids))
        return outcome.snapshot

    def abort(self, app_id: str, generation: int, reason: str) -> Snapshot:
        """CREATED -> ABORTED; aborting an ABORTED snapshot again is a no-op."""
        require_id("app_id", app_id)
        if len(reason) > MAX_REASON_CHARS:
            raise InvalidArgument(f"reason has {len(reason)} characters; the limit is {MAX_REASON_CHARS}")
        self._reports.forget(app_id, generation)  # no report lands from here on
        outcome = self._kernel.run(
            "snapshot_abort",
            {"app_id": app_id, "generation": generation},
            [ReadNode(gen_path(app_id, generation))] if generation > 0 else [],
            lambda reads, pending: decide.abort(
                app_id, generation, reason, reads, pending, self._clock.now_ms()
            ),
        )
        if outcome.changed:
            self._metrics.snapshots_aborted.labels("timeout" if reason == TIMEOUT_REASON else "request").inc()
            _log.info(
                "app %s generation %d aborted: %s", app_id, generation, outcome.snapshot.record.abort_reason
            )
        return outcome.snapshot

    def delete(self, app_id: str, generation: int, *, newer: int = 0) -> bool:
        """Delete an ended snapshot and its payloads; False when there was none. ``newer``
        (retention): a newer completed generation that must still be there (``decide.delete_mark``).

        In steps, so that no transaction outgrows ZooKeeper's request limit whatever the task
        count: mark the header DELETING (checked against its pins; from then on it reads as gone),
        delete the task nodes in batches of at most half the limit (each batch's objects after it
        commits), then the header. A deletion that stops midway is finished by the next call or
        by the janitor (the mark leaves a retention trigger)."""
        require_id("app_id", app_id)
        self._reports.forget(app_id, generation)
        now = self._clock.now_ms()
        marked = self._kernel.run(
            "snapshot_delete",
            {"app_id": app_id, "generation": generation},
            decide.delete_reads(app_id, generation, now, newer) if generation > 0 else [],
            lambda reads, pending: decide.delete_mark(
                app_id, generation, reads, pending, now, self._policy, newer
            ),
        )
        if not marked:
            return False
        batch_bytes = self._delete_batch_bytes
        while True:
            step = self._kernel.run(
                "snapshot_delete_step",
                {"app_id": app_id, "generation": generation},
                decide.delete_step_reads(app_id, generation),
                lambda reads, pending: decide.delete_step(
                    app_id, generation, reads, pending, batch_bytes, self._clock.now_ms()
                ),
            )
            if step is not decide.Step.MORE:
                break
        if step is decide.Step.FINISHED:
            self._metrics.snapshots_deleted.inc()
            _log.info("deleted app %s generation %d", app_id, generation)
        return True

    def set_retention(self, app_id: str, keep_last_completed: int, completed_ttl_ms: int) -> RetentionPolicy:
        """Store the app's override (0 = server default) and return the policy now in force."""
        validate_retention(app_id, keep_last_completed, completed_ttl_ms, self._policy)
        policy = RetentionPolicy(keep_last_completed, completed_ttl_ms)
        now = self._clock.now_ms()  # one trigger per call, named by this time
        stored = self._kernel.run(
            "snapshot_set_retention",
            {"app_id": app_id},
            [
                ReadNode(app_path(app_id)),
                ReadNode(retention_path(app_id)),
                ReadNode(decide.retention_trigger(app_id, now)),
            ],
            lambda reads, pending: decide.set_retention(app_id, policy, reads, pending, now),
        )
        return stored.effective(self._policy)

    def pin_state(self, app_id: str, generation: int) -> tuple[bool, list[Op]]:
        """Is the snapshot pinned by a live lease? And the ops that keep the answer true until a
        delete commits (``pins.guard``)."""
        node = self._metadata.get(pins.pin_path(app_id, generation))
        now, skew = self._clock.now_ms(), self._policy.max_clock_skew_ms
        records = self._metadata.get_many(pins.to_confirm(node, now, skew))
        pinned = pins.pinned(app_id, generation, node, records, now, skew)
        return pinned, pins.guard(app_id, generation, node, records)

    # --- the janitor's steps (janitor.py) -------------------------------------------------------

    def abort_timed_out(self, limit: int) -> int:
        """Abort up to ``limit`` snapshots still CREATED after their timeout (reason "timeout")."""
        return self._janitor.abort_timed_out(limit)

    def apply_retention(self, limit: int) -> int:
        """Evaluate the retention of every app with a due trigger; delete up to ``limit`` snapshots
        (the intents their payloads' deletes leave to withdraw go together at the end)."""
        with self._kernel.withdrawing_later():
            return self._janitor.apply_retention(limit)

    def sweep_intents(self, grace_ms: int, limit: int) -> int:
        """Delete the payloads of up to ``limit`` upload intents older than ``grace_ms`` whose
        commit never landed (every capability's: the index is shared); see ``intents``."""
        return self._janitor.sweep_intents(grace_ms, limit)

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` checkpoint objects older than ``grace_ms`` that no report references."""
        return self._janitor.sweep_orphans(grace_ms, limit)

    # --- internals ------------------------------------------------------------------------------

    def _check_header_size(
        self, app_id: str, tasks: tuple[str, ...], labels: tuple[tuple[str, str], ...]
    ) -> None:
        """Refuse a task set whose header could outgrow its share of a ZooKeeper request: sized at
        its largest, as an aborted snapshot with the longest reason and the widest numbers (once
        per request shape: an app's creates repeat theirs)."""
        shape = (app_id, tasks, labels)
        size = self._header_sizes.get(shape)
        if size is None:
            size = self._largest_header_bytes(app_id, tasks, labels)
            self._header_sizes.put(shape, size, size)  # weighed by what its key holds
        if size > self._policy.header_budget_bytes:
            raise InvalidArgument(
                f"task_ids ({len(tasks)}) and labels make a snapshot header of up to {size} bytes; the "
                f"limit is {self._policy.header_budget_bytes} bytes (half of --zk-max-request-bytes, "
                "less a reserve): use fewer or shorter task ids",
                reason=Reason.TOO_LARGE,
                metadata={"field": "task_ids", "limit": self._policy.header_budget_bytes, "size": size},
            )

    @staticmethod
    def _largest_header_bytes(
        app_id: str, tasks: tuple[str, ...], labels: tuple[tuple[str, str], ...]
    ) -> int:
        widest = 2**63 - 1
        largest = SnapshotRecord(
            app_id,
            widest,
            State.ABORTED,
            tasks,
            len(tasks),
            widest,
            widest,
            widest,
            widest,
            widest,
            labels,
            WIDEST_REASON,
        )
        return len(encode_snapshot(largest))

    def _read(self, app_id: str, generation: int) -> decide.Stored | None:
        with at(gen_path(app_id, generation)):
            return decide.stored(self._metadata.get(gen_path(app_id, generation)))

    def _read_reports(
        self, app_id: str, generation: int, task_ids: Sequence[str] | None = None
    ) -> tuple[list[TaskReport], decide.Stored | None]:
        """The task reports in task id order (of ``task_ids`` when given: no listing), and the
        header read after them in the same round (reads of one session are served in order)."""
        names = (
            sorted(task_ids)
            if task_ids is not None
            else self._metadata.children(tasks_path(app_id, generation))
        )
        header = gen_path(app_id, generation)
        nodes = self._metadata.get_many([*(task_path(app_id, generation, t) for t in names), header])
        with at(header):
            again = decide.stored(nodes.pop(header))
        reports = []
        for path, node in nodes.items():
            if node is not None:
                with at(path):
                    reports.append(decode_task_report(node.data))
        return reports, again

    def _load_current(self, app_id: str) -> Snapshot:
        """The app's current header, seeing every write committed before the call: the sync, the
        pointer's read and the read of the header last seen go together; a second round reads
        the header only when the pointer has moved on."""
        path = app_path(app_id)
        guess = self._guess(app_id)
        header = gen_path(app_id, guess) if guess else ""
        nodes = self._metadata.synced_get_many(APPS, [path, header] if guess else [path])
        with at(path):
            current = decide.current_generation(nodes[path])
        if current and current != guess:
            header = gen_path(app_id, current)
            nodes = self._metadata.get_many([header])
        with at(header):
            return self._present(app_id, current, nodes[header] if current else None)

    def _present(self, app_id: str, current: int, header: Node | None) -> Snapshot:
        """GetCurrentSnapshot's answer from the pointer's generation and its header node."""
        self._generations.put(app_id, current)
        stored = decide.stored(header)
        return Snapshot(stored.record, ()) if stored is not None else empty_snapshot(app_id, current)

    def _guess(self, app_id: str) -> int:
        return self._generations.get(app_id) or 0
