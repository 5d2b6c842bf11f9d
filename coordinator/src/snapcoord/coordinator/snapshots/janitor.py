"""The janitor's snapshot steps: abort timed-out snapshots, apply retention, sweep orphan payloads."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.snapshot_codec import decode_retention, decode_task_report
from snapcoord.coordinator.domain.snapshots import (
    DEFAULT_RETENTION,
    TIMEOUT_REASON,
    Retained,
    Snapshot,
    SnapshotPolicy,
    State,
    retention_victims,
)
from snapcoord.coordinator.errors import (
    Aborted,
    CorruptRecord,
    FailedPrecondition,
    NodeExistsError,
    SnapcoordError,
    Unavailable,
)
from snapcoord.coordinator.kernel.commit import CommitKernel
from snapcoord.coordinator.kernel.corruption import at, locate, skipped
from snapcoord.coordinator.kernel.intents import Intent
from snapcoord.coordinator.kernel.orphans import sweep_unreferenced
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.snapshots import decide, pins
from snapcoord.coordinator.snapshots.layout import (
    DEADLINES,
    OBJECT_PREFIX,
    RETENTION,
    gen_path,
    gens_path,
    owner_of_checkpoint,
    parse_ref,
    ref,
    retention_entry,
    retention_path,
    task_path,
)
from snapcoord.coordinator.snapshots.pins import Records
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore, Node

_log = logging.getLogger(__name__)


class SnapshotJanitor:
    """The steps, on the registry's own ``abort`` and ``delete`` (the same rules as the API)."""

    def __init__(
        self,
        kernel: CommitKernel,
        metadata: MetadataStore,
        blobs: BlobStore,
        clock: Clock,
        policy: SnapshotPolicy,
        metrics: CoordinatorMetrics,
        *,
        abort: Callable[[str, int, str], Snapshot],
        delete: Callable[[str, int, int], bool],
    ) -> None:
        self._kernel = kernel
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._abort = abort
        self._delete = delete

    def abort_timed_out(self, limit: int) -> int:
        """Abort up to ``limit`` snapshots still CREATED after their timeout (reason "timeout")."""
        now = self._clock.now_ms()
        aborted = 0
        deadlines = self._kernel.expiry(DEADLINES)
        for path, name in deadlines.due(now):
            if aborted >= limit:
                break
            parsed = parse_ref(name)
            header_path = gen_path(parsed[0], int(parsed[1])) if parsed and parsed[1].isdigit() else ""
            try:
                with at(header_path):
                    header = decide.stored(self._metadata.get(header_path) if header_path else None)
                if header is None or header.record.state is not State.CREATED:
                    deadlines.remove(path)  # cannot happen (they change together); do not keep it due
                    continue
                if now < header.record.deadline_ms:
                    continue
                self._abort(header.record.app_id, header.record.generation, TIMEOUT_REASON)
            except FailedPrecondition:
                continue  # completed meanwhile: its deadline entry went with the completion
            except CorruptRecord as e:  # its deadline entry stays due: counted on every pass
                skipped(self._metrics, e, "snapshot timeouts")
                continue
            aborted += 1
        return aborted

    def apply_retention(self, limit: int) -> int:
        """Evaluate the retention of every app with a due trigger; delete up to ``limit`` snapshots.

        A trigger is removed only after its app's evaluation ran to the end: when a deletion
        fails, the failure is logged and the trigger stays due, so the next pass evaluates the app
        again. ZooKeeper or S3 unreachable (``Unavailable``) ends the pass: every other app would
        fail the same way, one retry deadline each, while the pass held the janitor's lead."""
        now = self._clock.now_ms()
        deleted = 0
        evaluated: dict[str, bool] = {}  # app -> its evaluation ran to the end
        scheduled: set[str] = set()  # triggers this pass wrote: never consumed by it
        triggers = self._kernel.expiry(RETENTION)
        for path, name in triggers.due(now):
            if deleted >= limit:
                break
            parsed = parse_ref(name)
            if parsed is not None and parsed[0] not in evaluated:
                app_id = parsed[0]
                try:
                    done, finished = self._evaluate_app(app_id, now, limit - deleted, scheduled)
                except CorruptRecord as e:  # its retention policy: the trigger stays, counted every pass
                    skipped(self._metrics, e, "snapshot retention")
                    evaluated[app_id] = False
                    continue
                except Unavailable:
                    # The store (or this replica's clock) is out for every app, not this one: end
                    # the pass at once (the loop counts it interrupted), triggers left due.
                    raise
                except SnapcoordError as e:
                    _log.warning("retention of app %s failed; the next pass retries: %s", app_id, e)
                    evaluated[app_id] = False
                    continue
                evaluated[app_id] = True
                deleted += done
                if not finished:  # more victims than this pass may delete: come back next pass
                    scheduled.add(self._schedule(now, f"{app_id}@more"))
            if (parsed is None or evaluated[parsed[0]]) and path not in scheduled:
                triggers.remove(path)
        return deleted

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` checkpoint objects older than ``grace_ms`` that no report references."""

        def referenced_by(owner: tuple[str, int, str]) -> frozenset[str]:
            node = self._metadata.get(task_path(*owner))
            with at(task_path(*owner)):
                report = decode_task_report(node.data) if node is not None else None
            return frozenset(report.object_keys) if report else frozenset()

        # Objects a live intent announces are the intent sweep's (they may be in flight); the
        # intents are read before the listing (``sweep_unreferenced`` says why).
        deleted = sweep_unreferenced(
            self._blobs,
            OBJECT_PREFIX,
            modified_before_ms=self._clock.now_ms() - grace_ms,
            limit=limit,
            owner_of=owner_of_checkpoint,
            referenced_by=referenced_by,
            announced=self._kernel.intents.announced_keys,
            corrupt=lambda e: skipped(self._metrics, e, "snapshot orphan sweep"),
        )
        if deleted:
            self._metrics.orphans_deleted.labels("snapshot").inc(deleted)
        return deleted

    def sweep_intents(self, grace_ms: int, limit: int) -> int:
        """The orphan sweep over the upload-intent index (every capability's payloads): delete the
        objects of up to ``limit`` intents older than ``grace_ms``, except uploads whose snapshot
        is still CREATED (a report may still name them). Cost: the intents, not the payloads."""
        headers: dict[tuple[str, int], bool] = {}

        def reportable(intent: Intent) -> bool:
            if intent.upload is None:
                return False  # a call's own payloads: past the grace, its commit never landed
            target = (intent.upload.app_id, intent.upload.generation)
            if target not in headers:
                try:
                    with at(gen_path(*target)):
                        header = decide.stored(self._metadata.get(gen_path(*target)))
                except CorruptRecord as e:  # it may be CREATED: keep what a report may still name
                    skipped(self._metrics, e, "orphan intent sweep")
                    headers[target] = True
                else:
                    headers[target] = header is not None and header.record.state is State.CREATED
            return headers[target]

        def corrupt(error: CorruptRecord) -> None:
            skipped(self._metrics, error, "orphan intent sweep")

        swept = self._kernel.intents.sweep(
            self._blobs, self._clock.now_ms(), grace_ms, limit, keep=reportable, corrupt=corrupt
        )
        if swept:
            self._metrics.orphans_deleted.labels("intent").inc(swept)
        return swept

    def _evaluate_app(self, app_id: str, now: int, limit: int, scheduled: set[str]) -> tuple[int, bool]:
        """Apply the app's retention now (at most ``limit`` deletions; the flag says whether that
        was all), finish the app's half-done deletions, and schedule its next evaluation for when
        the next survivor's TTL ends (adding the triggers it writes to ``scheduled``)."""
        node = self._metadata.get(retention_path(app_id))
        with at(retention_path(app_id)):  # unreadable: no evaluation (its rules are unknown)
            retention = (decode_retention(node.data) if node else DEFAULT_RETENTION).effective(self._policy)
        generations = [int(n) for n in self._metadata.children(gens_path(app_id)) if n.isdigit()]
        headers = self._metadata.get_many([gen_path(app_id, g) for g in generations])  # read together
        records = {}
        deleting = []
        for g in generations:
            # A header that cannot be decoded is left out, never deleted: the others are judged
            # without it, which keeps as many or more of them (one fewer completed snapshot to
            # count, and a newest completed one that is no newer).
            try:
                with at(gen_path(app_id, g)):
                    item = decide.stored_any(headers[gen_path(app_id, g)])
            except CorruptRecord as e:
                skipped(self._metrics, e, "snapshot retention")
                continue
            if item is None:
                continue
            if item.record.state is State.DELETING:
                deleting.append(g)  # a deletion stopped midway: finish it
            else:
                records[g] = item.record
        ended = [g for g, r in records.items() if r.is_ended]
        pin_nodes = self._metadata.get_many([pins.pin_path(app_id, g) for g in ended])
        # Holders listed as expired may have renewed since they pinned: their records tell.
        pin_of = {g: pin_nodes[pins.pin_path(app_id, g)] for g in ended}
        confirm = sorted({p for g in ended for p in self._to_confirm(app_id, g, pin_of[g], now)})
        holders = self._metadata.get_many(confirm)
        pinned = [g for g in ended if self._pinned(app_id, g, pin_of[g], holders, now)]
        retained = [Retained(g, r.state, r.ended_at_ms, r.ttl_ms) for g, r in records.items()]
        victims = sorted([*deleting, *retention_victims(retained, retention, now, pinned)])
        # Retention never deletes the newest completed snapshot: each deletion checks that it is
        # still there (a DeleteSnapshot of it may race this pass). Half-done ones need no check.
        newest = max((g for g, r in records.items() if r.state is State.COMPLETED), default=0)
        deleted = 0
        for generation in victims[:limit]:
            try:
                deleted += self._delete(app_id, generation, 0 if generation in deleting else newest)
            except (FailedPrecondition, Aborted):
                continue  # pinned or changed meanwhile: the next evaluation decides again
            except CorruptRecord as e:  # a record the deletion reads: the snapshot stays
                skipped(self._metrics, e, "snapshot retention")
        # The next time one of the survivors can expire, look at the app again.
        for generation, record in records.items():
            if generation in victims or not record.is_ended:
                continue
            due = record.ended_at_ms + (record.ttl_ms or retention.completed_ttl_ms)
            if due > now:
                scheduled.add(self._schedule(due, ref(app_id, generation)))
        return deleted, len(victims) <= limit

    def _to_confirm(self, app_id: str, generation: int, pin: Node | None, now: int) -> list[str]:
        """``pins.to_confirm``; none for an unreadable pin index (``_pinned`` keeps its snapshot)."""
        try:
            with at(pins.pin_path(app_id, generation)):
                return pins.to_confirm(pin, now, self._policy.max_clock_skew_ms)
        except CorruptRecord:
            return []  # counted once, by ``_pinned``

    def _pinned(self, app_id: str, generation: int, pin: Node | None, holders: Records, now: int) -> bool:
        """``pins.pinned``; True when the pin index or a holder's lease record cannot be decoded:
        a snapshot that may be pinned is never deleted."""
        try:
            with at(pins.pin_path(app_id, generation)):
                pins.holders(pin)
        except CorruptRecord as e:
            skipped(self._metrics, e, "snapshot retention")
            return True
        try:
            return pins.pinned(app_id, generation, pin, holders, now, self._policy.max_clock_skew_ms)
        except CorruptRecord as e:
            skipped(self._metrics, locate(e, holders), "snapshot retention")
            return True

    def _schedule(self, due_ms: int, name: str) -> str:
        path = retention_entry(due_ms, name)
        self._kernel.expiry(RETENTION).prepare(due_ms)
        with contextlib.suppress(NodeExistsError):
            self._metadata.create(path, b"")
        return path
