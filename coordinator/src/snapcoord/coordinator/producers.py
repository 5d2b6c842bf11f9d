"""The producer offset registry on the metadata and blob stores: the ProducerOffsetService logic
and the janitor's two producer steps.

Layout. Metadata (the commit point): ``/producers/records/<producer_id>`` holds a small versioned
record pointing at the payload; ``/producers/expiry/<minute>/<producer_id>@<registration>`` is
the expiry index, written in the same transaction as the record, so the janitor reads only the
buckets that are due. Blobs: ``producers/<producer_id>/<uuid>.json`` holds the offsets.

Ordering. The payload is written before the record that references it and deleted after the
record is gone, so a reader never sees a record without its payload; a crash in between leaves an
unreferenced object, which the orphan sweep deletes once it is older than the grace period.

Identity. A record's znode version alone cannot tell two registrations apart (delete and create
again restarts at version 0), so every conditional change also deletes or checks the index entry
named after the registration's UUID: a janitor that read an old registration can never delete
the new one that replaced it.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.codec import (
    decode_producer_offsets,
    decode_producer_record,
    encode_producer_offsets,
    encode_producer_record,
)
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.paging import decode_name_token, encode_name_token
from snapcoord.coordinator.domain.producers import (
    ProducerPolicy,
    ProducerRecord,
    ProducerSnapshot,
    Registration,
    new_record,
    parse_index_entry,
    producer_of_object,
    validate_registration,
)
from snapcoord.coordinator.errors import (
    Aborted,
    BlobNotFound,
    CommitOutcomeUnknown,
    Internal,
    InvalidArgument,
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
from snapcoord.coordinator.storage.metadata import Create, Delete, MetadataStore, Op, SetData

_log = logging.getLogger(__name__)

RECORDS = "/producers/records"
EXPIRY = "/producers/expiry"
OBJECT_PREFIX = "producers/"

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
#: Rounds of read-decide-commit before a contended call gives up with ABORTED. Each lost round
#: means another caller committed, so this is only reached under pathological contention.
MAX_ATTEMPTS = 16


@dataclass(frozen=True)
class _Stored:
    """A record as read, with the version a compare-and-set needs."""

    record: ProducerRecord
    version: int


def _record_path(producer_id: str) -> str:
    return f"{RECORDS}/{producer_id}"


class ProducerRegistry:
    """Register, read, delete and list producer offset snapshots; expire and sweep for the janitor."""

    def __init__(
        self,
        metadata: MetadataStore,
        blobs: BlobStore,
        clock: Clock,
        policy: ProducerPolicy,
        metrics: CoordinatorMetrics,
    ) -> None:
        self._metadata = metadata
        self._blobs = blobs
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._expiry = ExpiryIndex(metadata, EXPIRY)
        self._layout_ready = False  # created on the first write, so building a server does no I/O

    # --- the API ----------------------------------------------------------------------------

    def register(self, producer_id: str, offsets: Iterable[Offset], ttl_ms: int) -> Registration:
        """Create the record unless a live one exists; exactly one concurrent caller wins."""
        items, ttl = validate_registration(producer_id, offsets, ttl_ms, self._policy)
        uploaded: ProducerRecord | None = None
        outcome_unknown = False
        try:
            for attempt in range(MAX_ATTEMPTS):
                now = self._clock.now_ms()
                # The first round assumes no record (the common case: a sink's first start) and
                # lets the create-if-absent commit tell otherwise; later rounds read first.
                current = self._read(producer_id) if attempt else None
                if current is not None and not current.record.is_expired(now):
                    try:
                        snapshot = self._snapshot(current.record)
                    except NotFound:
                        continue  # deleted between our two reads: decide again
                    if uploaded is not None:  # an earlier round of ours lost the race
                        self._delete_object(uploaded.object_key)
                    self._metrics.producer_registrations.labels("existing").inc()
                    return Registration(registered=False, snapshot=snapshot)
                if uploaded is None:
                    uploaded = new_record(producer_id, now, ttl)
                    # Payload first: once the record commits, its object must already exist.
                    self._blobs.put(uploaded.object_key, encode_producer_offsets(producer_id, items))
                record = replace(uploaded, created_at_ms=now, expires_at_ms=now + ttl)
                outcome_unknown = False
                try:
                    self._commit(record, current)
                except TransactionFailed as e:
                    # Another caller won, or our expiry bucket vanished: read again and decide.
                    if isinstance(e.cause, NoNodeError):
                        self._expiry.forget(record.expires_at_ms)
                    continue
                except CommitOutcomeUnknown:
                    outcome_unknown = True
                    after = self._read(producer_id)  # may raise: then the object must stay
                    outcome_unknown = False
                    if after is None or after.record.object_key != record.object_key:
                        continue  # ours did not land (or was replaced): decide again
                    record = after.record
                uploaded = None  # committed: the record owns the object now
                if current is not None:  # we replaced an expired record: its payload is garbage
                    self._delete_object(current.record.object_key)
                self._metrics.producer_registrations.labels("registered").inc()
                return Registration(
                    registered=True,
                    snapshot=ProducerSnapshot(producer_id, items, record.created_at_ms, record.expires_at_ms),
                )
            raise Aborted(f"producer_id {producer_id!r} is heavily contended; retry the registration")
        except Exception:
            # Our upload is unreferenced unless a commit may have landed; remove it now rather than
            # leave it to the orphan sweep. (A crash skips this: the sweep is the backstop.)
            if uploaded is not None and not outcome_unknown:
                self._delete_object(uploaded.object_key)
            raise

    def get(self, producer_id: str) -> ProducerSnapshot:
        """The live snapshot; NOT_FOUND when absent or expired (even before the janitor runs)."""
        require_id("producer_id", producer_id)
        current = self._read(producer_id)
        now = self._clock.now_ms()
        if current is None:
            raise NotFound(f"no producer offsets are registered for producer_id {producer_id!r}")
        if current.record.is_expired(now):
            raise NotFound(
                f"the producer offsets of producer_id {producer_id!r} expired at "
                f"{current.record.expires_at_ms} (now {now})",
                reason=Reason.EXPIRED,
                metadata={"producer_id": producer_id, "expires_at_ms": current.record.expires_at_ms},
            )
        return self._snapshot(current.record)

    def delete(self, producer_id: str) -> bool:
        """Remove the record (metadata first, then the payload); True when a live one was removed."""
        require_id("producer_id", producer_id)
        for _ in range(MAX_ATTEMPTS):
            current = self._read(producer_id)
            if current is None:
                return False
            was_live = not current.record.is_expired(self._clock.now_ms())
            try:
                self._metadata.transaction(self._delete_ops(current))
            except TransactionFailed:
                continue  # replaced or deleted meanwhile: look again
            except CommitOutcomeUnknown:
                after = self._read(producer_id)
                if after is not None and after.record.object_key == current.record.object_key:
                    continue  # it did not land
            self._delete_object(current.record.object_key)
            return was_live
        raise Aborted(f"producer_id {producer_id!r} is heavily contended; retry the delete")

    def list_page(self, page_size: int, page_token: str) -> tuple[list[ProducerSnapshot], str]:
        """One page of live snapshots in producer_id order, and the token of the next page."""
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(
                f"page_size is {page_size}; use 1-{MAX_PAGE_SIZE}, or 0 for {DEFAULT_PAGE_SIZE}"
            )
        size = page_size or DEFAULT_PAGE_SIZE
        after = decode_name_token(page_token)  # harden D1: was _decode_token
        names = self._metadata.children(RECORDS)
        i = bisect.bisect_right(names, after) if after else 0
        page: list[ProducerSnapshot] = []
        now = self._clock.now_ms()
        while i < len(names) and len(page) < size:
            current = self._read(names[i])
            i += 1
            if current is None or current.record.is_expired(now):
                continue
            try:
                page.append(self._snapshot(current.record))
            except NotFound:
                continue  # deleted while we paged
        return page, (encode_name_token(names[i - 1]) if i < len(names) else "")

    # --- the janitor's steps ----------------------------------------------------------------

    def expire_due(self, limit: int) -> int:
        """Delete up to ``limit`` expired records, reading only the expiry buckets that are due."""
        now = self._clock.now_ms()
        expired = 0
        for path, name in self._expiry.due(now):
            if expired >= limit:
                break
            expired += self._expire_entry(path, name, now)
        if expired:
            self._metrics.producer_records_expired.inc(expired)
        return expired

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` payload objects that no record references and that are older than
        ``grace_ms`` (younger ones may belong to a registration still in flight)."""

        def referenced_by(producer_id: str) -> set[str]:
            current = self._read(producer_id)
            return {current.record.object_key} if current else set()

        deleted = sweep_unreferenced(
            self._blobs,
            OBJECT_PREFIX,
            modified_before_ms=self._clock.now_ms() - grace_ms,
            limit=limit,
            owner_of=producer_of_object,
            referenced_by=referenced_by,
        )
        if deleted:
            self._metrics.orphans_deleted.labels("producer").inc(deleted)
        return deleted

    # --- internals ------------------------------------------------------------------------------

    def _read(self, producer_id: str) -> _Stored | None:
        node = self._metadata.get(_record_path(producer_id))
        if node is None:
            return None
        return _Stored(decode_producer_record(node.data), node.version)

    def _snapshot(self, record: ProducerRecord) -> ProducerSnapshot:
        """The record with its offsets from the payload; NOT_FOUND if it was deleted meanwhile."""
        try:
            payload = self._blobs.get(record.object_key)
        except BlobNotFound:
            # Deletes remove the record first, so a missing object means the record is gone
            # too by now, unless the invariant broke.
            after = self._read(record.producer_id)
            if after is None or after.record.object_key != record.object_key:
                raise NotFound(f"producer_id {record.producer_id!r} was deleted meanwhile") from None
            raise Internal(
                f"the payload {record.object_key} of producer_id {record.producer_id!r} is missing"
            ) from None
        _, offsets = decode_producer_offsets(payload)
        return ProducerSnapshot(record.producer_id, offsets, record.created_at_ms, record.expires_at_ms)

    def _commit(self, record: ProducerRecord, current: _Stored | None) -> None:
        """Create the record and its index entry, or replace an expired one, in one transaction."""
        if not self._layout_ready:
            self._metadata.ensure_path(RECORDS)
            self._layout_ready = True
        self._expiry.prepare(record.expires_at_ms)
        data = encode_producer_record(record)
        ops: list[Op]
        if current is None:
            ops = [Create(_record_path(record.producer_id), data), Create(self._index_path(record), b"")]
        else:
            # SetData, not delete + create: the version check then also fences a janitor that
            # read the expired record and is about to delete it.
            ops = [
                SetData(_record_path(record.producer_id), data, current.version),
                Delete(self._index_path(current.record), None),
                Create(self._index_path(record), b""),
            ]
        self._metadata.transaction(ops)

    def _index_path(self, record: ProducerRecord) -> str:
        return self._expiry.entry(record.expires_at_ms, record.index_entry)

    def _delete_ops(self, current: _Stored) -> list[Op]:
        return [
            Delete(_record_path(current.record.producer_id), current.version),
            Delete(self._index_path(current.record), None),
        ]

    def _expire_entry(self, path: str, entry: str, now: int) -> int:
        parsed = parse_index_entry(entry)
        if parsed is None:
            _log.warning("ignoring a foreign node %s in the producer expiry index", path)
            return 0
        producer_id, registration = parsed
        current = self._read(producer_id)
        if current is None or current.record.registration_id != registration:
            # An index entry without its record cannot arise (they change in one transaction),
            # except from a bug or a hand edit; drop it so it does not stay due forever.
            self._expiry.remove(path)
            return 0
        if not current.record.is_expired(now):
            return 0  # the current minute's bucket is only partly due
        try:
            self._metadata.transaction(self._delete_ops(current))
        except TransactionFailed:
            return 0  # re-registered or deleted meanwhile: not ours to remove
        except CommitOutcomeUnknown:
            return 0  # the next pass sees what happened
        self._delete_object(current.record.object_key)
        _log.info("expired producer offsets of %s (expired at %d)", producer_id, current.record.expires_at_ms)
        return 1

    def _delete_object(self, key: str) -> None:
        """Best effort: an object left behind is an orphan, which the janitor sweeps later."""
        try:
            self._blobs.delete(key)
        except StoreUnavailable as e:
            _log.warning("could not delete %s now (the orphan sweep will): %s", key, e)
