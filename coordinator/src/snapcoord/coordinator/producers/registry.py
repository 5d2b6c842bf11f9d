"""The producer offset registry: the ProducerOffsetService logic on the commit kernel.

The rules of each change are in ``decide``, the paths in ``layout``, the janitor's two steps in
``janitor``. Here: validation, the reads that are not decisions (payloads, pages), and metrics.
"""

from __future__ import annotations

import bisect
import hashlib
import uuid
from collections.abc import Iterable

from snapcoord.coordinator.domain.clock import Clock
from snapcoord.coordinator.domain.documents import corrupt
from snapcoord.coordinator.domain.ids import require_id
from snapcoord.coordinator.domain.offsets import Offset
from snapcoord.coordinator.domain.paging import decode_name_token, encode_name_token
from snapcoord.coordinator.domain.producer_codec import (
    decode_producer_offsets,
    encode_producer_offsets,
    inline_offsets_bytes,
)
from snapcoord.coordinator.domain.producers import (
    ProducerPolicy,
    ProducerRecord,
    ProducerSnapshot,
    Registration,
    new_inline_record,
    new_record,
    validate_registration,
)
from snapcoord.coordinator.errors import BlobNotFound, CorruptRecord, InvalidArgument, NotFound, Reason
from snapcoord.coordinator.kernel.commit import CommitKernel, Reread, synced_retry
from snapcoord.coordinator.kernel.corruption import at, skipped
from snapcoord.coordinator.kernel.decision import ReadNode, Reads
from snapcoord.coordinator.kernel.intent_pool import IntentPool
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.producers import decide
from snapcoord.coordinator.producers.janitor import ProducerJanitor
from snapcoord.coordinator.producers.layout import OBJECT_PREFIX, RECORDS, record_path
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import MetadataStore

DEFAULT_PAGE_SIZE = 100
#: How long a pooled intent may wait for its registration (``Services`` passes a quarter of the
#: orphan grace, at most this).
DEFAULT_INTENT_MAX_AGE_MS = 30_000
MAX_PAGE_SIZE = 1000
#: A ListProducerOffsets page ends early once its records' stored offsets reach this many bytes (a
#: record may hold 100k offsets: 100 of them would be GBs in the server and in one response).
LIST_PAGE_BYTES = 8 * 1024 * 1024


class ProducerRegistry:
    """Register, read, delete and list producer offset snapshots; expire and sweep for the janitor."""

    def __init__(
        self,
        metadata: MetadataStore,
        blobs: BlobStore,
        clock: Clock,
        policy: ProducerPolicy,
        metrics: CoordinatorMetrics,
        *,
        intent_max_age_ms: int = DEFAULT_INTENT_MAX_AGE_MS,
        list_page_bytes: int = LIST_PAGE_BYTES,
        kernel: CommitKernel | None = None,
    ) -> None:
        self._metadata = metadata
        self._list_page_bytes = list_page_bytes
        self._blobs = blobs
        self._clock = clock
        self._policy = policy
        self._metrics = metrics
        self._kernel = kernel or CommitKernel(metadata, blobs, metrics, now_ms=clock.now_ms)
        self._janitor = ProducerJanitor(self._kernel, metadata, blobs, clock, metrics)
        # A registration has no read its intent could ride with: its intents are made ahead, in
        # batches (intent_pool), so that most registrations are one transaction.
        self._intents = IntentPool(self._kernel.intents, OBJECT_PREFIX, intent_max_age_ms, clock.now_ms)

    # --- the API ----------------------------------------------------------------------------

    def register(self, producer_id: str, offsets: Iterable[Offset], ttl_ms: int) -> Registration:
        """Create the record unless a live one exists; exactly one concurrent caller wins."""
        items, ttl = validate_registration(producer_id, offsets, ttl_ms, self._policy)
        request, announced = self._request(producer_id, items, ttl)
        path = record_path(producer_id)
        registration = self._kernel.run(
            "producer_register",
            {"producer_id": producer_id},
            [ReadNode(path)],
            lambda reads, pending: decide.register(request, reads, pending, self._clock.now_ms()),
            finish=lambda outcome: self._present(outcome, items),
            # The first round assumes no record (the common case: a sink's first start) and lets
            # the create-if-absent commit tell otherwise; later rounds read first.
            assume=Reads({path: None}),
            announced=announced,
        )
        self._count(registration)
        return registration

    def advance(
        self, producer_id: str, offsets: Iterable[Offset], ttl_ms: int, previous_id: str
    ) -> tuple[Registration, bool]:
        """Delete ``previous_id``'s record and register ``producer_id`` (create-if-absent) in one
        transaction; returns the registration and whether a live previous record was deleted."""
        items, ttl = validate_registration(producer_id, offsets, ttl_ms, self._policy)
        if not previous_id:
            raise InvalidArgument(
                "previous_producer_id is empty; name the record to delete, or use RegisterProducerOffsets "
                "to register without deleting one"
            )
        require_id("previous_producer_id", previous_id)
        if previous_id == producer_id:
            raise InvalidArgument(
                f"previous_producer_id equals producer_id ({producer_id!r}); an advance deletes one "
                "record and registers another"
            )
        request, announced = self._request(producer_id, items, ttl)

        def present(outcome: decide.Advanced) -> tuple[Registration, bool]:
            return self._present(outcome.registration, items), outcome.previous_deleted

        registration, deleted = self._kernel.run(
            "producer_advance",
            {"producer_id": producer_id, "previous_producer_id": previous_id},
            [ReadNode(record_path(producer_id)), ReadNode(record_path(previous_id))],
            lambda reads, pending: decide.advance(request, previous_id, reads, pending, self._clock.now_ms()),
            finish=present,
            announced=announced,
        )
        self._count(registration)
        return registration, deleted

    def _request(
        self, producer_id: str, items: tuple[Offset, ...], ttl: int
    ) -> tuple[decide.Register, dict[str, frozenset[str]]]:
        """This call's registration: inline when the offsets fit ``inline_max_bytes`` (no object,
        no intent), else an object key from the intent pool (the intents the call then owns)."""
        now = self._clock.now_ms()
        if inline_offsets_bytes(items) <= self._policy.inline_max_bytes:
            record = new_inline_record(producer_id, now, ttl, items, uuid.uuid4().hex)
            return decide.Register(record, ttl, None), {}
        payload = encode_producer_offsets(producer_id, items)
        intent = self._intents.take()  # from here on, the kernel call owns it (and withdraws it)
        record = new_record(producer_id, now, ttl, intent.key, hashlib.sha256(payload).hexdigest())
        return decide.Register(record, ttl, payload), {intent.path: frozenset({intent.key})}

    def _present(self, outcome: decide.Registered, items: tuple[Offset, ...]) -> Registration:
        if outcome.registered:
            record = outcome.record
            return Registration(
                True, ProducerSnapshot(record.producer_id, items, record.created_at_ms, record.expires_at_ms)
            )
        try:
            return Registration(False, self._snapshot(outcome.record))
        except NotFound:
            raise Reread from None  # deleted between our two reads: decide again

    def _count(self, registration: Registration) -> None:
        self._metrics.producer_registrations.labels(
            "registered" if registration.registered else "existing"
        ).inc()

    def close(self) -> None:
        """Delete the pool's unused intents (best effort: the orphan sweep takes what is left)."""
        self._kernel.intents.withdraw_each(self._intents.drain())

    def get(self, producer_id: str) -> ProducerSnapshot:
        """The live snapshot; NOT_FOUND when absent or expired (even before the janitor runs).
        Absent is checked again after a sync: it may have been registered through another replica."""
        require_id("producer_id", producer_id)
        return synced_retry(self._metadata, lambda: self._get(producer_id))

    def _get(self, producer_id: str) -> ProducerSnapshot:
        current = self._read(producer_id)
        now = self._clock.now_ms()
        if current is None:
            raise NotFound(f"no producer offsets are registered for producer_id {producer_id!r}")
        if current.is_expired(now):
            raise NotFound(
                f"the producer offsets of producer_id {producer_id!r} expired at "
                f"{current.expires_at_ms} (now {now})",
                reason=Reason.EXPIRED,
                metadata={"producer_id": producer_id, "expires_at_ms": current.expires_at_ms},
            )
        return self._snapshot(current)

    def delete(self, producer_id: str) -> bool:
        """Remove the record (metadata first, then the payload); True when a live one was removed."""
        require_id("producer_id", producer_id)
        return self._kernel.run(
            "producer_delete",
            {"producer_id": producer_id},
            [ReadNode(record_path(producer_id))],
            lambda reads, pending: decide.delete(producer_id, reads, pending, self._clock.now_ms()),
        )

    def list_page(self, page_size: int, page_token: str) -> tuple[list[ProducerSnapshot], str]:
        """One page of live snapshots in producer_id order, and the token of the next page. The
        page ends early, after at least one record, once its payloads reach ``list_page_bytes``."""
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise InvalidArgument(
                f"page_size is {page_size}; use 1-{MAX_PAGE_SIZE}, or 0 for {DEFAULT_PAGE_SIZE}"
            )
        size = page_size or DEFAULT_PAGE_SIZE
        after = decode_name_token(page_token)
        names = self._metadata.children(RECORDS)
        i = bisect.bisect_right(names, after) if after else 0
        page: list[ProducerSnapshot] = []
        now = self._clock.now_ms()
        used = 0
        while i < len(names) and len(page) < size and used < self._list_page_bytes:
            batch = names[i : i + size - len(page)]  # the records of a page are read together
            nodes = self._metadata.get_many([record_path(n) for n in batch])
            for name in batch:
                i += 1
                try:
                    with at(record_path(name)):
                        current = decide.stored(nodes[record_path(name)])
                    if current is None or current.record.is_expired(now):
                        continue
                    snapshot, size_bytes = self._snapshot_sized(current.record)
                except NotFound:
                    continue  # deleted while we paged
                except CorruptRecord as e:  # its neighbours are listed; the log and metric name it
                    skipped(self._metrics, e, "ListProducerOffsets")
                    continue
                page.append(snapshot)
                used += size_bytes
                if used >= self._list_page_bytes:
                    break
        return page, (encode_name_token(names[i - 1]) if i < len(names) else "")

    # --- the janitor's steps (janitor.py) -------------------------------------------------------

    def expire_due(self, limit: int) -> int:
        """Delete up to ``limit`` expired records, reading only the expiry buckets that are due."""
        return self._janitor.expire_due(limit)

    def sweep_orphans(self, grace_ms: int, limit: int) -> int:
        """Delete up to ``limit`` unreferenced payload objects older than ``grace_ms``."""
        return self._janitor.sweep_orphans(grace_ms, limit)

    # --- internals ------------------------------------------------------------------------------

    def _read(self, producer_id: str) -> ProducerRecord | None:
        with at(record_path(producer_id)):
            current = decide.stored(self._metadata.get(record_path(producer_id)))
        return current.record if current is not None else None

    def _snapshot(self, record: ProducerRecord) -> ProducerSnapshot:
        """The record with its offsets from the payload; NOT_FOUND if it was deleted meanwhile."""
        return self._snapshot_sized(record)[0]

    def _snapshot_sized(self, record: ProducerRecord) -> tuple[ProducerSnapshot, int]:
        """``_snapshot``, and the size of the payload it was read from."""
        if record.inline is not None:
            snapshot = ProducerSnapshot(
                record.producer_id, record.inline, record.created_at_ms, record.expires_at_ms
            )
            return snapshot, inline_offsets_bytes(record.inline)
        try:
            payload = self._blobs.get(record.object_key)
        except BlobNotFound:
            # Deletes remove the record first, so a missing object means the record is gone
            # too by now, unless the invariant broke. Synced: a server that has not applied the
            # delete yet would still show the record, and a lag would read as a broken invariant.
            path = record_path(record.producer_id)
            current = decide.stored(self._metadata.synced_get_many(path, [path])[path])
            if current is None or current.record.object_key != record.object_key:
                raise NotFound(f"producer_id {record.producer_id!r} was deleted meanwhile") from None
            raise CorruptRecord(
                f"the payload of producer_id {record.producer_id!r} is missing",
                kind="producer_offsets_payload",
                path=record.object_key,
            ) from None
        with at(record.object_key):
            digest = hashlib.sha256(payload).hexdigest() if record.payload_sha256 else ""
            if digest != record.payload_sha256:
                raise corrupt(
                    "producer offsets payload",
                    f"has SHA-256 {digest}, its record says {record.payload_sha256}",
                    payload,
                )
            payload_id, offsets = decode_producer_offsets(payload)
            if payload_id != record.producer_id:
                raise corrupt("producer offsets payload", f"names producer_id {payload_id!r}", payload)
        snapshot = ProducerSnapshot(record.producer_id, offsets, record.created_at_ms, record.expires_at_ms)
        return snapshot, len(payload)
