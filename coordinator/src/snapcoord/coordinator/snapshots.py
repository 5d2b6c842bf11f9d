"""Generation snapshots on the metadata and blob stores: the SnapshotService logic and the
janitor's snapshot steps (timeouts, retention, orphan payloads).

Layout (metadata, the commit point)::

    /snapshots/apps/<app>                                  {"current_generation": N}
    /snapshots/apps/<app>/retention                        the app's retention override
    /snapshots/apps/<app>/gens/<generation, 20 digits>     the snapshot header (state, task set...)
    /snapshots/apps/<app>/gens/<generation>/tasks/<task>   one task's report: offsets, checkpoint refs
    /snapshots/deadlines/<minute>/<app>@<generation>       CREATED snapshots by timeout (ExpiryIndex)
    /snapshots/retention/<minute>/<app>@<generation|policy> "evaluate this app's retention then"
    /snapshots/pins/<app>@<generation>                     leases pinning a snapshot (leases issue)

Checkpoint payloads go to the blob store under ``snapshots/<app>/<generation>/<task>/<uuid>``,
written before the report that points at them commits and deleted after the snapshot is gone.

Every change is one version-checked transaction: a report creates its task node and bumps the
header (flipping it to COMPLETED when it is the last one) in the same commit, so concurrent reports
never lose one and exactly one of them completes the snapshot; a new generation moves the app's
current pointer and creates the header together, so generations never repeat or go back.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.leases import decode_pins, pinned_by_live_lease
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.paging import decode_generation_token, encode_generation_token
from snapcoord.coordinator.domain.snapshot_codec import (
    decode_app,
    decode_retention,
    decode_snapshot,
    decode_task_report,
    encode_app,
    encode_retention,
    encode_snapshot,
    encode_task_report,
)
from snapcoord.coordinator.domain.snapshots import (
    DEFAULT_RETENTION,
    MAX_REASON_CHARS,
    TIMEOUT_REASON,
    CheckpointRef,
    Retained,
    RetentionPolicy,
    Snapshot,
    SnapshotPolicy,
    SnapshotRecord,
    State,
    TaskReport,
    empty_snapshot,
    report_digest,
    retention_victims,
    validate_create,
    validate_report,
    validate_retention,
)
from snapcoord.coordinator.errors import (
    Aborted,
    BlobNotFound,
    CommitOutcomeUnknown,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NodeExistsError,
    NoNodeError,
    NotFound,
    Reason,
    StoreUnavailable,
    TransactionFailed,
)
from snapcoord.coordinator.expiry_index import ExpiryIndex
from snapcoord.coordinator.metrics import CoordinatorMetrics
from snapcoord.coordinator.orphans import sweep_unreferenced
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import Check, Create, Delete, MetadataStore, Op, SetData

_log = logging.getLogger(__name__)

APPS = "/snapshots/apps"
DEADLINES = "/snapshots/deadlines"
RETENTION = "/snapshots/retention"
PINS = "/snapshots/pins"
OBJECT_PREFIX = "snapshots/"
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
MAX_ATTEMPTS = 32
#: The reason recorded when AbortSnapshot gives none.
DEFAULT_ABORT_REASON = "aborted by request"


def snapshot_path(app_id: str, generation: int) -> str:
    """The header znode of a snapshot (leases check its version when they pin it)."""
    return _gen_path(app_id, generation)


def pin_path(app_id: str, generation: int) -> str:
    """The pin index of a snapshot: which leases hold it, with their expiry."""
    return f"{PINS}/{_ref(app_id, generation)}"


def _app_path(app_id: str) -> str:
    return f"{APPS}/{app_id}"


def _gens_path(app_id: str) -> str:
    return f"{APPS}/{app_id}/gens"


def _gen_path(app_id: str, generation: int) -> str:
    return f"{APPS}/{app_id}/gens/{generation:020d}"


def _tasks_path(app_id: str, generation: int) -> str:
    return f"{_gen_path(app_id, generation)}/tasks"


def _task_path(app_id: str, generation: int, task_id: str) -> str:
    return f"{_tasks_path(app_id, generation)}/{task_id}"


def _ref(app_id: str, generation: int) -> str:
    return f"{app_id}@{generation}"


def _parse_ref(name: str) -> tuple[str, str] | None:
    app_id, sep, rest = name.rpartition("@")
    return (app_id, rest) if sep and app_id and rest else None


@dataclass(frozen=True)
class _Stored:
    record: SnapshotRecord
    version: int


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
    ) -> None:
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._deadlines = ExpiryIndex(metadata, DEADLINES)
        self._retention = ExpiryIndex(metadata, RETENTION)
        self._cache = CurrentSnapshotCache(metadata, self._load_current, max_apps=cache_size)
        self._apps_ready = False  # /snapshots/apps created on the first write: building does no I/O
        self._pins_ready = False

    # --- the API ----------------------------------------------------------------------------

    def create(
        self, app_id: str, task_ids: Sequence[str], ttl_ms: int, timeout_ms: int, labels: Mapping[str, str]
    ) -> Snapshot:
        """The current snapshot if it is CREATED (a retry is safe), else generation + 1."""
        tasks, ttl, timeout, label_items = validate_create(
            app_id, task_ids, ttl_ms, timeout_ms, labels, self._policy
        )
        self._ensure_apps()
        for _ in range(MAX_ATTEMPTS):
            app_node = self._metadata.get(_app_path(app_id))
            current = decode_app(app_node.data) if app_node is not None else 0
            stored = self._read(app_id, current) if current else None
            if stored is not None and stored.record.state is State.CREATED:
                return Snapshot(stored.record, ())
            now = self._clock.now_ms()
            record = SnapshotRecord(
                app_id=app_id,
                generation=current + 1,
                state=State.CREATED,
                task_ids=tasks,
                reported=0,
                created_at_ms=now,
                completed_at_ms=0,
                ended_at_ms=0,
                deadline_ms=now + timeout,
                ttl_ms=ttl,
                labels=label_items,
                abort_reason="",
            )
            ops: list[Op] = []
            if app_node is None:
                ops += [
                    Create(_app_path(app_id), encode_app(record.generation)),
                    Create(_gens_path(app_id), b""),
                ]
            else:
                # The version check makes concurrent creators agree: one moves the pointer, the
                # others fail here and, next round, find its snapshot CREATED and return it.
                ops.append(SetData(_app_path(app_id), encode_app(record.generation), app_node.version))
            self._deadlines.prepare(record.deadline_ms)
            ops += [
                Create(_gen_path(app_id, record.generation), encode_snapshot(record)),
                Create(_tasks_path(app_id, record.generation), b""),
                Create(self._deadline_entry(record), b""),
            ]
            try:
                self._metadata.transaction(ops)
            except TransactionFailed as e:
                if isinstance(e.cause, NoNodeError):
                    self._deadlines.forget(record.deadline_ms)
                continue
            except CommitOutcomeUnknown:
                continue  # next round finds a CREATED snapshot: ours or a concurrent creator's
            self._metrics.snapshots_created.inc()
            return Snapshot(record, ())
        raise Aborted(f"app {app_id!r} is heavily contended; retry CreateSnapshot")

    def current(self, app_id: str, *, consistent: bool) -> Snapshot:
        """The snapshot at the app's current generation (header only; GetSnapshot has the tasks)."""
        require_id("app_id", app_id)
        if consistent:
            self._metadata.sync(APPS)
            return self._load_current(app_id)
        return self._cache.get(app_id)

    def get(self, app_id: str, generation: int, *, include_checkpoints: bool) -> SnapshotPayloads:
        """One snapshot with every task report; payloads too when ``include_checkpoints``."""
        require_id("app_id", app_id)
        stored = self._read(app_id, generation) if generation > 0 else None
        if stored is None:
            raise NotFound(f"app {app_id!r} has no snapshot at generation {generation}")
        reports = self._read_reports(app_id, generation)
        payloads: dict[tuple[str, str], bytes] = {}
        if include_checkpoints:
            for report in reports:
                for ref in report.checkpoints:
                    try:
                        payloads[(report.task_id, ref.store)] = self._blobs.get(ref.object_key)
                    except BlobNotFound:
                        if self._read(app_id, generation) is None:
                            raise NotFound(
                                f"app {app_id!r} generation {generation} was deleted meanwhile"
                            ) from None
                        raise Internal(f"checkpoint payload {ref.object_key} is missing") from None
        return SnapshotPayloads(Snapshot(stored.record, tuple(reports)), payloads)

    def list_page(self, app_id: str, page_size: int, page_token: str) -> tuple[list[Snapshot], str]:
        """Snapshot headers, newest first, and the token of the next page."""
        require_id("app_id", app_id)
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(
                f"page_size is {page_size}; use 1-{MAX_PAGE_SIZE}, or 0 for {DEFAULT_PAGE_SIZE}"
            )
        before = decode_generation_token(page_token)  # harden D2: was _decode_generation_token
        names = sorted(
            (int(n) for n in self._metadata.children(_gens_path(app_id)) if n.isdigit()), reverse=True
        )
        if before:
            names = [g for g in names if g < before]
        page: list[Snapshot] = []
        i = 0
        while i < len(names) and len(page) < (page_size or DEFAULT_PAGE_SIZE):
            stored = self._read(app_id, names[i])
            i += 1
            if stored is not None:
                page.append(Snapshot(stored.record, ()))
        return page, (encode_generation_token(names[i - 1]) if i < len(names) else "")

    def report(
        self,
        app_id: str,
        generation: int,
        task_id: str,
        offsets: Iterable[Offset],
        checkpoints: Mapping[str, bytes],
    ) -> Snapshot:
        """Record one task's report; the report that completes the task set completes the snapshot.

        Returns the header and the task's own report. The same report again is idempotent (also
        after completion); anything for another generation, or a snapshot no longer CREATED, is
        fenced with FAILED_PRECONDITION naming the current generation.
        """
        items = validate_report(app_id, generation, task_id, offsets, checkpoints, self._policy)
        digest = report_digest(items, checkpoints)
        uploaded: tuple[CheckpointRef, ...] | None = None
        committed = False
        try:
            task_reported = False  # whether a task node may exist; learnt from a failed commit
            for attempt in range(MAX_ATTEMPTS + 4 * self._policy.max_tasks):
                stored = self._read(app_id, generation)
                # A CREATED snapshot whose commit has not told us otherwise: assume the task has not
                # reported (the common case) and let the create in the commit say if it has.
                maybe_reported = task_reported or (
                    stored is not None and stored.record.state is not State.CREATED
                )
                existing = (
                    self._read_report(app_id, generation, task_id) if stored and maybe_reported else None
                )
                if stored is not None and existing is not None and existing.digest == digest:
                    # The same report again: idempotent, also after completion or fencing.
                    committed = uploaded is not None and existing.checkpoints == uploaded
                    return Snapshot(stored.record, (existing,))
                self._fence(app_id, generation, stored)
                assert stored is not None
                if existing is not None:
                    raise FailedPrecondition(
                        f"task {task_id!r} already reported a different snapshot for generation "
                        f"{generation} of app {app_id!r}; a report cannot be changed",
                        reason=Reason.REPORT_CONFLICT,
                        metadata={"app_id": app_id, "generation": generation, "task_id": task_id},
                    )
                if task_id not in stored.record.task_ids:
                    raise InvalidArgument(
                        f"task {task_id!r} is not in the task set of app {app_id!r} generation {generation} "
                        f"({len(stored.record.task_ids)} tasks)"
                    )
                if uploaded is None:
                    uploaded = self._upload(app_id, generation, task_id, checkpoints)
                report = TaskReport(task_id, items, uploaded, digest)
                header = self._after_report(stored.record)
                ops: list[Op] = [
                    Create(_task_path(app_id, generation, task_id), encode_task_report(report)),
                    SetData(_gen_path(app_id, generation), encode_snapshot(header), stored.version),
                ]
                if header.state is State.COMPLETED:
                    ops += self._ended_ops(header)
                try:
                    self._metadata.transaction(ops)
                except TransactionFailed as e:
                    if e.index == 0 and isinstance(e.cause, NodeExistsError):
                        task_reported = True  # a retry of ours, or a conflicting report: look at it
                        continue
                    if isinstance(e.cause, NoNodeError):
                        self._retention.forget(header.ended_at_ms)
                    _backoff(attempt)  # another report won this version: read and try again
                    continue
                except CommitOutcomeUnknown:
                    task_reported = True
                    continue  # next round finds our report (idempotent) or retries
                committed = True
                if header.state is State.COMPLETED:
                    self._metrics.snapshots_completed.inc()
                    _log.info(
                        "app %s generation %d completed (%d tasks)", app_id, generation, len(header.task_ids)
                    )
                return Snapshot(header, (report,))
            raise Aborted(f"app {app_id!r} generation {generation} is heavily contended; retry the report")
        finally:
            if uploaded is not None and not committed:
                self._delete_objects(ref.object_key for ref in uploaded)

    def abort(self, app_id: str, generation: int, reason: str) -> Snapshot:
        """CREATED -> ABORTED; aborting an ABORTED snapshot again is a no-op."""
        require_id("app_id", app_id)
        if len(reason) > MAX_REASON_CHARS:
            raise InvalidArgument(f"reason has {len(reason)} characters; the limit is {MAX_REASON_CHARS}")
        for _ in range(MAX_ATTEMPTS):
            stored = self._read(app_id, generation) if generation > 0 else None
            if stored is None:
                raise NotFound(f"app {app_id!r} has no snapshot at generation {generation}")
            if stored.record.state is State.ABORTED:
                return Snapshot(stored.record, ())
            if stored.record.state is State.COMPLETED:
                raise FailedPrecondition(
                    f"app {app_id!r} generation {generation} is COMPLETED; "
                    "only a CREATED snapshot can be aborted",
                    reason=Reason.SNAPSHOT_NOT_CREATED,
                    metadata={"app_id": app_id, "generation": generation, "state": "COMPLETED"},
                )
            now = self._clock.now_ms()
            header = replace(
                stored.record,
                state=State.ABORTED,
                ended_at_ms=now,
                abort_reason=reason or DEFAULT_ABORT_REASON,
            )
            ops: list[Op] = [SetData(_gen_path(app_id, generation), encode_snapshot(header), stored.version)]
            ops += self._ended_ops(header)
            try:
                self._metadata.transaction(ops)
            except TransactionFailed as e:
                if isinstance(e.cause, NoNodeError):
                    self._retention.forget(header.ended_at_ms)
                continue
            except CommitOutcomeUnknown:
                continue
            self._metrics.snapshots_aborted.labels("timeout" if reason == TIMEOUT_REASON else "request").inc()
            _log.info("app %s generation %d aborted: %s", app_id, generation, header.abort_reason)
            return Snapshot(header, ())
        raise Aborted(f"app {app_id!r} generation {generation} is heavily contended; retry the abort")

    def delete(self, app_id: str, generation: int) -> bool:
        """Delete an ended snapshot and its payloads; False when there was none."""
        require_id("app_id", app_id)
        for _ in range(MAX_ATTEMPTS):
            stored = self._read(app_id, generation) if generation > 0 else None
            if stored is None:
                return False
            if stored.record.state is State.CREATED:
                raise FailedPrecondition(
                    f"app {app_id!r} generation {generation} is still CREATED: abort it before deleting it",
                    reason=Reason.SNAPSHOT_IN_PROGRESS,
                    metadata={"app_id": app_id, "generation": generation},
                )
            pinned, guard = self.pin_state(app_id, generation)
            if pinned:
                raise FailedPrecondition(
                    f"app {app_id!r} generation {generation} is held by a lease; release the lease first",
                    reason=Reason.LEASE_HELD,
                    metadata={"app_id": app_id, "generation": generation},
                )
            try:
                self._delete_snapshot(stored, guard)
            except TransactionFailed:
                continue
            return True
        raise Aborted(f"app {app_id!r} generation {generation} is heavily contended; retry the delete")

    def set_retention(self, app_id: str, keep_last_completed: int, completed_ttl_ms: int) -> RetentionPolicy:
        """Store the app's override (0 = server default) and return the policy now in force."""
        validate_retention(app_id, keep_last_completed, completed_ttl_ms, self._policy)
        self._ensure_apps()
        policy = RetentionPolicy(keep_last_completed, completed_ttl_ms)
        try:  # an app may get its policy before its first snapshot
            self._metadata.transaction(
                [Create(_app_path(app_id), encode_app(0)), Create(_gens_path(app_id), b"")]
            )
        except TransactionFailed as e:
            if not isinstance(e.cause, NodeExistsError):
                raise
        path = f"{_app_path(app_id)}/retention"
        now = self._clock.now_ms()
        self._retention.prepare(now)
        for _ in range(MAX_ATTEMPTS):
            node = self._metadata.get(path)
            write: Op = (
                Create(path, encode_retention(policy))
                if node is None
                else SetData(path, encode_retention(policy), node.version)
            )
            trigger = self._retention.entry(now, f"{app_id}@policy")
            ops: list[Op] = [write]
            if self._metadata.get(trigger) is None:
                ops.append(Create(trigger, b""))
            try:
                self._metadata.transaction(ops)
            except TransactionFailed as e:
                if isinstance(e.cause, NoNodeError):
                    self._retention.forget(now)
                    self._retention.prepare(now)
                continue
            return policy.effective(self._policy)
        raise Aborted(f"app {app_id!r} is heavily contended; retry SetRetentionPolicy")

    def pin_state(self, app_id: str, generation: int) -> tuple[bool, list[Op]]:
        """Is the snapshot pinned by a live lease? And the ops that keep the answer true until commit.

        The one question DeleteSnapshot, retention and TTL ask before deleting, answered by one
        read of the snapshot's pin index (lease id -> expiry; leases keep it current). A lease
        counts until its expiry plus the clock-skew margin, even before the janitor removes it.
        The returned guard goes into the delete transaction, so that a pin landing concurrently
        fails the delete: a Check on the index's version, or, when there is no index, a create and
        delete of it (which fails if a lease created it meanwhile).
        """
        path = pin_path(app_id, generation)
        node = self._metadata.get(path)
        if node is None:
            if not self._pins_ready:
                self._metadata.ensure_path(PINS)
                self._pins_ready = True
            return False, [Create(path, b""), Delete(path, None)]
        holders = decode_pins(node.data)
        pinned = pinned_by_live_lease(holders, self._clock.now_ms(), self._policy.max_clock_skew_ms)
        return pinned, [Check(path, node.version)]

    def retention_triggers(self, app_ids: Iterable[str]) -> list[Op]:
        """Ops that have retention look at these apps on the next pass (after pins went away)."""
        now = self._clock.now_ms()
        self._retention.prepare(now)
        return [
            Create(self._retention.entry(now, f"{app_id}@unpinned-{uuid.uuid4().hex[:12]}"), b"")
            for app_id in sorted(set(app_ids))
        ]

    # --- the janitor's steps ----------------------------------------------------------------

    def abort_timed_out(self, limit: int) -> int:
        """Abort up to ``limit`` snapshots still CREATED after their timeout (reason "timeout")."""
        now = self._clock.now_ms()
        aborted = 0
        for path, name in self._deadlines.due(now):
            if aborted >= limit:
                break
            ref = _parse_ref(name)
            stored = self._read(ref[0], int(ref[1])) if ref and ref[1].isdigit() else None
            if stored is None or stored.record.state is not State.CREATED:
                self._deadlines.remove(path)  # cannot happen (they change together); do not keep it due
                continue
            if now < stored.record.deadline_ms:
                continue
            try:
                self.abort(stored.record.app_id, stored.record.generation, TIMEOUT_REASON)
            except FailedPrecondition:
                continue  # completed meanwhile: its deadline entry went with the completion
            aborted += 1
        return aborted

    def apply_retention(self, limit: int) -> int:
        """Evaluate the retention of every app with a due trigger; delete up to ``limit`` snapshots."""
        now = self._clock.now_ms()
        deleted = 0
        evaluated: set[str] = set()
        for path, name in self._retention.due(now):
            if deleted >= limit:
                break
            ref = _parse_ref(name)
            # Consumed first: the evaluation below schedules the app's next trigger itself, and
            # may put it in this very bucket.
            self._retention.remove(path)
            if ref is None or ref[0] in evaluated:
                continue
            evaluated.add(ref[0])
            done, finished = self._evaluate_app(ref[0], now, limit - deleted)
            deleted += done
            if not finished:  # more victims than this pass may delete: come back next pass
                self._retention.prepare(now)
                with contextlib.suppress(NodeExistsError):
                    self._metadata.create(self._retention.entry(now, f"{ref[0]}@more"), b"")
        return deleted

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` checkpoint objects older than ``grace_ms`` that no report references."""

        def owner_of(key: str) -> tuple[str, int, str] | None:
            parts = key.split("/")  # snapshots/<app>/<generation>/<task>/<uuid>
            return (parts[1], int(parts[2]), parts[3]) if len(parts) == 5 and parts[2].isdigit() else None

        def referenced_by(owner: tuple[str, int, str]) -> frozenset[str]:
            app_id, generation, task_id = owner
            report = self._read_report(app_id, generation, task_id)
            return frozenset(c.object_key for c in report.checkpoints) if report else frozenset()

        deleted = sweep_unreferenced(
            self._blobs,
            OBJECT_PREFIX,
            modified_before_ms=self._clock.now_ms() - grace_ms,
            limit=limit,
            owner_of=owner_of,
            referenced_by=referenced_by,
        )
        if deleted:
            self._metrics.orphans_deleted.labels("snapshot").inc(deleted)
        return deleted

    # --- internals ------------------------------------------------------------------------------

    def _ensure_apps(self) -> None:
        if not self._apps_ready:
            self._metadata.ensure_path(APPS)
            self._apps_ready = True

    def _read(self, app_id: str, generation: int) -> _Stored | None:
        node = self._metadata.get(_gen_path(app_id, generation))
        return _Stored(decode_snapshot(node.data), node.version) if node is not None else None

    def _read_report(self, app_id: str, generation: int, task_id: str) -> TaskReport | None:
        node = self._metadata.get(_task_path(app_id, generation, task_id))
        return decode_task_report(node.data) if node is not None else None

    def _read_reports(self, app_id: str, generation: int) -> list[TaskReport]:
        reports = []
        for task_id in self._metadata.children(_tasks_path(app_id, generation)):
            report = self._read_report(app_id, generation, task_id)
            if report is not None:
                reports.append(report)
        return reports

    def _load_current(self, app_id: str) -> Snapshot:
        node = self._metadata.get(_app_path(app_id))
        current = decode_app(node.data) if node is not None else 0
        stored = self._read(app_id, current) if current else None
        return Snapshot(stored.record, ()) if stored is not None else empty_snapshot(app_id, current)

    def _fence(self, app_id: str, generation: int, stored: _Stored | None) -> None:
        if stored is not None and stored.record.state is State.CREATED:
            return  # only the current generation can be CREATED: no need to read the pointer
        node = self._metadata.get(_app_path(app_id))
        current = decode_app(node.data) if node is not None else 0
        where = {"app_id": app_id, "generation": generation, "current_generation": current}
        if stored is None or generation != current:
            if generation > current:
                raise FailedPrecondition(
                    f"generation {generation} of app {app_id!r} does not exist; "
                    f"the current generation is {current}",
                    reason=Reason.SNAPSHOT_FENCED,
                    metadata=where,
                )
            raise FailedPrecondition(
                f"generation {generation} of app {app_id!r} is fenced: the current generation is {current}",
                reason=Reason.SNAPSHOT_FENCED,
                metadata=where,
            )
        raise FailedPrecondition(
            f"generation {generation} of app {app_id!r} is {stored.record.state.value}, no longer accepting "
            f"reports; the current generation is {current}",
            reason=Reason.SNAPSHOT_NOT_CREATED,
            metadata={**where, "state": stored.record.state.value},
        )

    def _after_report(self, record: SnapshotRecord) -> SnapshotRecord:
        reported = record.reported + 1
        if reported < len(record.task_ids):
            return replace(record, reported=reported)
        now = self._clock.now_ms()
        return replace(record, reported=reported, state=State.COMPLETED, completed_at_ms=now, ended_at_ms=now)

    def _deadline_entry(self, record: SnapshotRecord) -> str:
        return self._deadlines.entry(record.deadline_ms, _ref(record.app_id, record.generation))

    def _ended_ops(self, ended: SnapshotRecord) -> list[Op]:
        """A snapshot leaving CREATED: drop its deadline, and have retention look at the app now."""
        self._retention.prepare(ended.ended_at_ms)
        return [
            Delete(self._deadline_entry(ended), None),
            Create(self._retention.entry(ended.ended_at_ms, _ref(ended.app_id, ended.generation)), b""),
        ]

    def _upload(
        self, app_id: str, generation: int, task_id: str, checkpoints: Mapping[str, bytes]
    ) -> tuple[CheckpointRef, ...]:
        refs = []
        try:
            for store, payload in sorted(checkpoints.items()):
                key = f"{OBJECT_PREFIX}{app_id}/{generation}/{task_id}/{uuid.uuid4().hex}"
                self._blobs.put(key, payload)
                refs.append(CheckpointRef(store, key, len(payload), hashlib.sha256(payload).hexdigest()))
        except Exception:
            self._delete_objects(ref.object_key for ref in refs)
            raise
        return tuple(refs)

    def _delete_snapshot(self, stored: _Stored, guard: list[Op]) -> None:
        """Delete a snapshot's nodes in one transaction (checked against pins), then its objects."""
        app_id, generation = stored.record.app_id, stored.record.generation
        reports = self._read_reports(app_id, generation)
        ops: list[Op] = [*guard]
        ops += [Delete(_task_path(app_id, generation, r.task_id), None) for r in reports]
        ops += [
            Delete(_tasks_path(app_id, generation), None),
            Delete(_gen_path(app_id, generation), stored.version),
        ]
        self._metadata.transaction(ops)
        self._delete_objects(ref.object_key for r in reports for ref in r.checkpoints)
        self._metrics.snapshots_deleted.inc()
        _log.info("deleted app %s generation %d (%s)", app_id, generation, stored.record.state.value)

    def _evaluate_app(self, app_id: str, now: int, limit: int) -> tuple[int, bool]:
        """Apply the app's retention now (at most ``limit`` deletions; the flag says whether that
        was all), and schedule its next evaluation for when the next survivor's TTL ends."""
        node = self._metadata.get(f"{_app_path(app_id)}/retention")
        retention = (decode_retention(node.data) if node else DEFAULT_RETENTION).effective(self._policy)
        stored: dict[int, _Stored] = {}
        for name in self._metadata.children(_gens_path(app_id)):
            if name.isdigit():
                item = self._read(app_id, int(name))
                if item is not None:
                    stored[item.record.generation] = item
        retained = [
            Retained(g, s.record.state, s.record.ended_at_ms, s.record.ttl_ms) for g, s in stored.items()
        ]
        pins = {g: self.pin_state(app_id, g) for g, s in stored.items() if s.record.is_ended}
        victims = retention_victims(
            retained, retention, now, [g for g, (pinned, _) in pins.items() if pinned]
        )
        deleted = 0
        for generation in victims[:limit]:
            try:
                self._delete_snapshot(stored[generation], pins[generation][1])
                deleted += 1
            except (TransactionFailed, CommitOutcomeUnknown):
                continue  # pinned or changed meanwhile: the next evaluation decides again
        # The next time one of the survivors can expire, look at the app again.
        for generation, item in stored.items():
            if generation in victims or not item.record.is_ended:
                continue
            due = item.record.ended_at_ms + (item.record.ttl_ms or retention.completed_ttl_ms)
            if due > now:
                self._retention.prepare(due)
                with contextlib.suppress(NodeExistsError):
                    self._metadata.create(self._retention.entry(due, _ref(app_id, generation)), b"")
        return deleted, len(victims) <= limit

    def _delete_objects(self, keys: Iterable[str]) -> None:
        """Best effort: an object left behind is an orphan, which the janitor sweeps later."""
        for key in keys:
            try:
                self._blobs.delete(key)
            except StoreUnavailable as e:
                _log.warning("could not delete %s now (the orphan sweep will): %s", key, e)


def _backoff(attempt: int) -> None:
    """A short jittered pause after losing a compare-and-set, so many reporters do not stampede."""
    time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** min(attempt, 10))))


class CurrentSnapshotCache:
    """GetCurrentSnapshot(consistent=false) from memory, kept fresh by metadata watches.

    An entry watches the app's pointer and the current header. Watches are set before the reads
    they guard, and any callback (a change, or a reconnect after which events may have been
    missed) drops the entry; a read raced by a callback is returned but not cached.
    """

    def __init__(self, metadata: MetadataStore, load: Callable[[str], Snapshot], *, max_apps: int) -> None:
        self._metadata = metadata
        self._load = load
        self._max_apps = max_apps
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _CacheEntry] = OrderedDict()

    def get(self, app_id: str) -> Snapshot:
        with self._lock:
            entry = self._entries.get(app_id)
            if entry is not None and entry.snapshot is not None:
                self._entries.move_to_end(app_id)
                return entry.snapshot
            entry = _CacheEntry()
            old = self._entries.pop(app_id, None)
            self._entries[app_id] = entry
        if old is not None:
            old.cancel()
        entry.cancels.append(
            self._metadata.watch(_app_path(app_id), lambda _p: self._invalidate(app_id, entry))
        )
        snapshot = self._load(app_id)
        if snapshot.record.generation:
            path = _gen_path(app_id, snapshot.record.generation)
            entry.cancels.append(self._metadata.watch(path, lambda _p: self._invalidate(app_id, entry)))
            snapshot = self._load(app_id)  # re-read under the header watch
        evicted: list[_CacheEntry] = []
        with self._lock:
            if self._entries.get(app_id) is entry and entry.valid:
                entry.snapshot = snapshot
                while len(self._entries) > self._max_apps:
                    evicted.append(self._entries.popitem(last=False)[1])
        for item in evicted:
            item.cancel()
        return snapshot

    def _invalidate(self, app_id: str, entry: _CacheEntry) -> None:
        with self._lock:
            entry.valid = False
            if self._entries.get(app_id) is entry:
                del self._entries[app_id]
        entry.cancel()


class _CacheEntry:
    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.valid = True
        self.cancels: list[Callable[[], None]] = []

    def cancel(self) -> None:
        for cancel in self.cancels:
            cancel()
