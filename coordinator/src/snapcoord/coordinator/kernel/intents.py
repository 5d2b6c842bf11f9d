"""The upload-intent index: every payload object the server writes is announced here first.

Before a payload goes to the blob store, an intent node naming its key(s) is created at
``/intents/<minute>/<id>`` (the minute it was made). The transaction that commits the record
referencing the payload deletes the intent in the same ``multi``, with the version its writer
knows. So at any moment an object is in exactly one of three states: announced by an intent (not
committed yet), referenced by a record (committed), or on its way out (its intent claimed by the
sweep, or deleted by a writer that gave up). The way out of a committed object is announced too,
where no listing sweep could find it (``doom``): the commit that unreferences it makes an intent
for it, withdrawn once the object is deleted.

The orphan sweep walks only intents older than the grace (``sweep``), so its cost follows the
number of uncommitted uploads, not the number of payloads. For each it first *claims* the intent
(a version-checked write that marks it swept), then deletes the objects, then the intent. A commit
and a claim race on the intent's version: exactly one wins. If the commit wins, the intent is gone
and the sweep leaves the objects alone; if the claim wins, the commit's ``Delete(intent,
version)`` fails and the record is never written. A sweep that dies between the claim and the
deletes leaves a claimed intent, which the next sweep finishes. No committed record can therefore
point at an object the sweep deleted.

UploadCheckpoint intents carry what was uploaded (app, generation, task, store, and once the
stream ended, size and SHA-256); a report checks them in its commit. They stay while their
snapshot is CREATED (a report may still come), and go once it is not and the grace has passed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from snapcoord.coordinator.domain.documents import SHAPE_ERRORS, load, malformed
from snapcoord.coordinator.errors import (
    BadVersionError,
    CorruptRecord,
    NoNodeError,
    StoreUnavailable,
    TransactionFailed,
)
from snapcoord.coordinator.kernel.corruption import at
from snapcoord.coordinator.kernel.expiry_index import ExpiryIndex, bucket_of
from snapcoord.coordinator.storage.metadata import Create, Delete

if TYPE_CHECKING:
    from snapcoord.coordinator.storage.blobs import BlobStore
    from snapcoord.coordinator.storage.metadata import MetadataStore, Node, Op

_log = logging.getLogger(__name__)

ROOT = "/intents"
INTENT_VERSION = 1
#: The version of an intent as created (what a kernel commit deletes), and after an upload's
#: ``complete`` (what a report deletes).
CREATED_VERSION = 0
COMPLETED_VERSION = 1


@dataclass(frozen=True)
class UploadInfo:
    """What an UploadCheckpoint stored: its target, and once complete, its size and hash."""

    app_id: str
    generation: int
    task_id: str
    store: str
    size: int = -1
    sha256: str = ""

    @property
    def complete(self) -> bool:
        return self.size >= 0


@dataclass(frozen=True)
class Intent:
    """One intent: the object keys it announces, when it was made, and whether a sweep claimed it."""

    keys: tuple[str, ...]
    created_ms: int
    upload: UploadInfo | None = None
    swept: bool = False


def encode(intent: Intent) -> bytes:
    doc: dict[str, Any] = {
        "version": INTENT_VERSION,
        "keys": list(intent.keys),
        "created_ms": intent.created_ms,
        "swept": intent.swept,
    }
    if intent.upload is not None:
        u = intent.upload
        doc["upload"] = {
            "app_id": u.app_id,
            "generation": u.generation,
            "task_id": u.task_id,
            "store": u.store,
            "size": u.size,
            "sha256": u.sha256,
        }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes) -> Intent:
    doc = load(data, "upload intent", INTENT_VERSION)
    try:
        u = doc.get("upload")
        upload = (
            UploadInfo(
                str(u["app_id"]),
                int(u["generation"]),
                str(u["task_id"]),
                str(u["store"]),
                int(u["size"]),
                str(u["sha256"]),
            )
            if u is not None
            else None
        )
        return Intent(tuple(str(k) for k in doc["keys"]), int(doc["created_ms"]), upload, bool(doc["swept"]))
    except SHAPE_ERRORS as e:
        raise malformed("upload intent", e, data) from e


def new_name(now_ms: int) -> tuple[str, str]:
    """(path, id) of a new intent made at ``now_ms``; the id names it (``upload_id``)."""
    bucket = bucket_of(now_ms)
    unique = uuid.uuid4().hex
    return f"{ROOT}/{bucket}/{unique}", f"{bucket}-{unique}"


def path_of(intent_id: str) -> str | None:
    """The path of the intent ``intent_id`` names; None when it is not an intent id as ``new_name``
    writes it (a zero-padded minute would name the same intent under another id: a report naming
    it and one naming the real id would differ in their digests)."""
    bucket, sep, unique = intent_id.partition("-")
    if not sep or not bucket.isascii() or not bucket.isdigit() or len(bucket) > 12:
        return None
    if bucket != str(int(bucket)):
        return None
    if len(unique) != 32 or not all(c in "0123456789abcdef" for c in unique):
        return None
    return f"{ROOT}/{int(bucket)}/{unique}"


#: The longest intent path (a 12-digit minute: far beyond any clock), and what retiring one adds to
#: a transaction: the path and a Delete op's framing, with a chroot (``decide.DELETE_OP_OVERHEAD``).
MAX_PATH_BYTES = len(f"{ROOT}/{10**12 - 1}/{'0' * 32}")
RETIRE_OP_BYTES = MAX_PATH_BYTES + 96


def doom(keys: Sequence[str], now_ms: int, unique: str) -> tuple[str, Create]:
    """(path, op) of an intent for objects a commit unreferences, made by that commit (``unique``:
    32 hex digits that name what the commit unreferences, so that every attempt of it names the
    same intent). The caller deletes the objects once the commit landed, then withdraws the
    intent; a failed delete or a crash in between leaves the intent, which leads the sweep to the
    objects. Needed for keys the listing sweep cannot judge: the intent pool's do not name their
    record."""
    path = f"{ROOT}/{bucket_of(now_ms)}/{unique}"
    return path, Create(path, encode(Intent(tuple(keys), now_ms)))


def commit_op(path: str, version: int) -> Delete:
    """The op that retires an intent inside the commit referencing its objects: version-checked,
    so a commit never lands once the sweep claimed the intent."""
    return Delete(path, version)


class IntentIndex:
    """Writes, retires and sweeps intents in one metadata store (shared per kernel)."""

    def __init__(self, metadata: MetadataStore, buckets: ExpiryIndex | None = None) -> None:
        """``buckets``: the index of ``ROOT`` to share (a kernel's, whose commits also make
        intents: ``doom``), so that a bucket is made, and known, once."""
        self._metadata = metadata
        self._buckets = buckets or ExpiryIndex(metadata, ROOT)

    def announce(self, keys: Sequence[str], now_ms: int, upload: UploadInfo | None = None) -> tuple[str, str]:
        """Create an intent for ``keys`` (before any of them is put); returns (path, id)."""
        path, intent_id, _ = self.announce_and_read(keys, now_ms, (), upload)
        return path, intent_id

    def ready(self, now_ms: int) -> bool:
        """True when an intent made at ``now_ms`` needs no bucket made first (this index made or
        found it). A call that may still be refused announces early only then: its withdrawal
        leaves the store as it was, an empty bucket it made would not."""
        return self._buckets.known(now_ms)

    def announce_and_read(
        self, keys: Sequence[str], now_ms: int, paths: Sequence[str], upload: UploadInfo | None = None
    ) -> tuple[str, str, dict[str, Node | None]]:
        """``announce``, with ``paths`` read in the same round trip (``create_and_get_many``);
        returns once the intent is created: (path, id, the nodes read)."""
        path, intent_id = new_name(now_ms)
        data = encode(Intent(tuple(keys), now_ms, upload))
        self._buckets.prepare(now_ms)
        try:
            nodes = self._create(path, data, paths)
        except NoNodeError:  # the bucket went (a sweep of a clock far ahead): make it again
            self._buckets.forget(now_ms)
            self._buckets.prepare(now_ms)
            nodes = self._create(path, data, paths)
        return path, intent_id, nodes

    def announce_each(self, keys: Sequence[str], now_ms: int, withdraw: Sequence[str] = ()) -> list[str]:
        """One intent per key in ``keys``, all in one transaction that also deletes the unused
        intents ``withdraw`` (as created); returns the new intents' paths, in order. An intent of
        ``withdraw`` that the sweep claimed or removed meanwhile is the sweep's: the transaction is
        sent again without the withdrawals."""
        named = [new_name(now_ms)[0] for _ in keys]
        creates = [
            Create(path, encode(Intent((key,), now_ms))) for path, key in zip(named, keys, strict=True)
        ]
        ops: list[Op] = [*creates, *(Delete(path, CREATED_VERSION) for path in withdraw)]
        self._buckets.prepare(now_ms)
        try:
            self._metadata.transaction(ops)
        except TransactionFailed as e:
            if e.index < len(creates):
                if not isinstance(e.cause, NoNodeError):
                    raise
                self._buckets.forget(now_ms)  # the bucket went (a sweep of a clock far ahead)
                self._buckets.prepare(now_ms)
            self._metadata.transaction(creates)
        return named

    def _create(self, path: str, data: bytes, paths: Sequence[str]) -> dict[str, Node | None]:
        if not paths:
            self._metadata.create(path, data)
            return {}
        return self._metadata.create_and_get_many(path, data, paths)

    def complete(self, path: str, intent: Intent, version: int = CREATED_VERSION) -> None:
        """Record a finished upload's size and hash (``BadVersionError``/``NoNodeError``: the sweep
        claimed it meanwhile, and its object is going)."""
        self._metadata.set(path, encode(intent), version=version)

    def withdraw(self, path: str, version: int) -> None:
        """Remove an intent whose objects are already deleted (or were never put). A claimed or
        vanished intent is the sweep's now: leave it."""
        with contextlib.suppress(NoNodeError, BadVersionError):
            self._metadata.delete(path, version=version)

    def withdraw_each(self, paths: Sequence[str]) -> None:
        """``withdraw`` every intent of ``paths`` (as created), in one transaction when none was
        claimed meanwhile; best effort: what is left is the sweep's."""
        if not paths:
            return
        try:
            try:
                self._metadata.transaction([Delete(path, CREATED_VERSION) for path in paths])
            except TransactionFailed:
                for path in paths:
                    self.withdraw(path, CREATED_VERSION)
        except StoreUnavailable as e:
            _log.warning(
                "could not remove %d unused upload intents now (the orphan sweep will): %s", len(paths), e
            )

    def announced_keys(self) -> frozenset[str]:
        """Every object key a live intent announces (for the listing sweep of objects written
        before intents existed, which must spare them: they are not committed yet).
        ``CorruptRecord`` (naming its path) when an intent cannot be decoded: any object may then
        be one it announces."""
        keys: set[str] = set()
        for bucket in self._metadata.children(ROOT):
            paths = [f"{ROOT}/{bucket}/{name}" for name in self._metadata.children(f"{ROOT}/{bucket}")]
            for path, node in self._metadata.get_many(paths).items():
                if node is not None:
                    with at(path):
                        keys.update(decode(node.data).keys)
        return frozenset(keys)

    def sweep(
        self,
        blobs: BlobStore,
        now_ms: int,
        grace_ms: int,
        limit: int,
        keep: Callable[[Intent], bool] = lambda intent: False,
        corrupt: Callable[[CorruptRecord], None] | None = None,
    ) -> int:
        """Delete the objects of up to ``limit`` intents older than ``grace_ms`` (claim, delete the
        objects, delete the intent); ``keep(intent)`` spares an intent (an upload whose snapshot
        may still be reported). An intent that cannot be decoded is told to ``corrupt`` (with its
        path) and left, objects and all (which objects it names is unknown); without ``corrupt``
        the error is raised. Returns how many intents went."""
        cutoff = now_ms - grace_ms
        swept = 0
        # Buckets before the cutoff's minute hold only intents older than the cutoff; the cutoff's
        # own bucket is walked too and each intent's time checked.
        for path, _name in self._buckets.due(cutoff):
            if swept >= limit:
                break
            node = self._metadata.get(path)
            if node is None:
                continue
            try:
                with at(path):
                    intent = decode(node.data)
            except CorruptRecord as e:
                if corrupt is None:
                    raise
                corrupt(e)
                continue
            version = node.version
            if not intent.swept:
                if intent.created_ms >= cutoff or keep(intent):
                    continue
                try:  # the claim: from here on no commit can retire this intent
                    version = self._metadata.set(
                        path, encode(replace(intent, swept=True)), version=version
                    ).version
                except (BadVersionError, NoNodeError):
                    continue  # committed (or completed, or claimed) meanwhile: look next pass
            try:
                for key in intent.keys:
                    blobs.delete(key)
            except StoreUnavailable as e:
                _log.warning("orphan sweep: could not delete the objects of %s (next pass): %s", path, e)
                continue
            with contextlib.suppress(NoNodeError, BadVersionError):
                self._metadata.delete(path, version=version)
            swept += 1
        return swept
