"""The commit kernel: the one read-decide-commit loop every registry operation runs in.

A registry operation is data plus a pure function: what to read and ``decide(reads, pending) ->
Done | Commit | More``, all defined in ``decision``.

The kernel owns everything around that: reading (independent reads in one ``get_many``), the
attempts-and-backoff policy, re-reading after a lost compare-and-set (``TransactionFailed``) or a
commit whose outcome is unknown (``CommitOutcomeUnknown``: never assumed lost; the next ``decide``
gets it as ``pending`` and recognises it in what it reads), uploading payloads before the commit
that references them, best-effort deletion of objects nobody references any more, the one
``Aborted`` error, and the conflicts metric.

Reads are not synced: a replica's ZooKeeper server may be a follower behind the leader, so a
record a client just created through another replica may not be visible yet. That only matters
when it makes ``decide`` refuse ("no such lease", "that generation does not exist yet"): then the
kernel syncs, re-reads everything and decides once more (``STALE_REFUSALS``). The fast path pays
no extra round trip.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from snapcoord.coordinator.errors import (
    Aborted,
    CommitOutcomeUnknown,
    CorruptRecord,
    NodeExistsError,
    NoNodeError,
    Reason,
    SnapcoordError,
    StoreUnavailable,
    TransactionFailed,
)
from snapcoord.coordinator.kernel import intents
from snapcoord.coordinator.kernel.corruption import locate
from snapcoord.coordinator.kernel.decision import (
    Commit,
    Decide,
    Done,
    More,
    Read,
    ReadChildren,
    ReadNode,
    Reads,
)
from snapcoord.coordinator.kernel.expiry_index import ExpiryIndex
from snapcoord.coordinator.kernel.intents import IntentIndex
from snapcoord.coordinator.observability.metrics import CoordinatorMetrics
from snapcoord.coordinator.storage.blobs import BlobStore
from snapcoord.coordinator.storage.metadata import Create, MetadataStore, Op

_log = logging.getLogger(__name__)

#: Payload puts of all calls share these threads: a report's uploads run in parallel, and the
#: process never runs more puts at once than this, however many reports arrive together.
UPLOAD_THREADS = 16
_UPLOADS = concurrent.futures.ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="upload")

R = TypeVar("R")
T = TypeVar("T")

#: Refusals that an unsynced read can cause wrongly: the record (or generation) was created
#: through another replica and this replica's ZooKeeper server has not applied it yet. Before
#: answering one of these the kernel syncs and decides again. (EXPIRED is left as it is: a stale
#: read shows a past expiry only when a renewal elsewhere landed within one follower lag of the
#: expiry moment, and a client renews well before expiry.)
STALE_REFUSALS = frozenset({Reason.NOT_FOUND, Reason.SNAPSHOT_FENCED, Reason.SNAPSHOT_NOT_CREATED})


def may_be_stale(error: SnapcoordError) -> bool:
    """True when ``error`` may only be the answer of a replica behind the leader."""
    return error.reason in STALE_REFUSALS


def synced_retry(metadata: MetadataStore, attempt: Callable[[], T]) -> T:
    """``attempt()``; when it refuses with a ``STALE_REFUSALS`` reason, sync and ``attempt()`` once
    more (for read-only calls outside the kernel: GetLease, GetSnapshot, GetProducerOffsets)."""
    try:
        return attempt()
    except SnapcoordError as e:
        if not may_be_stale(e):
            raise
    metadata.sync("/")
    return attempt()


class Reread(Exception):
    """Raised by a ``finish`` whose extra reads found the decision stale (a record deleted between
    two reads): the kernel reads and decides again, as after a lost commit."""


def _creates_a_deferred_node(ops: Sequence[Op], failed: TransactionFailed, defer: Collection[Read]) -> bool:
    """True when the transaction failed on creating a node whose read the first round deferred
    (decided as absent without reading it): the guess was wrong, no rival beat the commit."""
    if not defer or not isinstance(failed.cause, NodeExistsError) or not 0 <= failed.index < len(ops):
        return False
    op = ops[failed.index]
    return isinstance(op, Create) and any(isinstance(r, ReadNode) and r.path == op.path for r in defer)


@dataclass(frozen=True)
class RetryPolicy:
    """Rounds before a contended call gives up, and the pause after a lost one.

    Every lost round means another caller committed, so the limit is only reached under
    pathological contention. An operation whose rivals grow with its input (a task report races
    every task of its snapshot) declares ``contenders``: each may win one round before it.
    """

    attempts: int = 64
    per_contender: int = 4
    #: Jittered exponential backoff: uniform(0, min(cap, base * 2**round)), so that many callers
    #: losing to one winner do not collide again in lockstep.
    backoff_base_s: float = 0.0005
    backoff_cap_s: float = 0.05

    def rounds(self, contenders: int) -> int:
        return self.attempts + self.per_contender * contenders

    def pause_s(self, lost: int) -> float:
        return random.uniform(0, min(self.backoff_cap_s, self.backoff_base_s * 2 ** min(lost, 10)))


#: Intents withdrawn per transaction by ``CommitKernel.withdrawing_later`` (a Delete op each: about
#: 100 bytes, far below any request limit).
WITHDRAW_BATCH = 256


class CommitKernel:
    """Runs operations against one metadata store and one blob store; shared by the registries
    (it caches which expiry buckets and layout paths exist)."""

    def __init__(
        self,
        metadata: MetadataStore,
        blobs: BlobStore | None,
        metrics: CoordinatorMetrics,
        policy: RetryPolicy | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._metadata = metadata
        self._now_ms = now_ms
        self._blobs = blobs
        self._metrics = metrics
        self._policy = policy or RetryPolicy()
        self._sleep = sleep
        self._indexes: dict[str, ExpiryIndex] = {}
        self._ensured: set[str] = set()  # made on the first commit that needs them: no I/O at build
        self.intents = IntentIndex(metadata, self.expiry(intents.ROOT))
        self._local = threading.local()  # withdrawals held back in this thread (``withdrawing_later``)

    @contextlib.contextmanager
    def withdrawing_later(self) -> Iterator[None]:
        """Within (in this thread): the intents that commits made for the objects they unreferenced
        are withdrawn together on the way out, ``WITHDRAW_BATCH`` per transaction, instead of one
        request per commit (a janitor pass expiring many records). A crash meanwhile leaves them
        to the sweep, which finds their objects already gone."""
        held: list[str] = []
        self._local.withdrawals = held
        try:
            yield
        finally:
            self._local.withdrawals = None
            for i in range(0, len(held), WITHDRAW_BATCH):
                self.intents.withdraw_each(held[i : i + WITHDRAW_BATCH])

    def expiry(self, root: str) -> ExpiryIndex:
        """The expiry index under ``root`` (one per root, so its bucket cache is shared)."""
        index = self._indexes.get(root)
        if index is None:
            index = self._indexes[root] = ExpiryIndex(self._metadata, root)
        return index

    @overload
    def run(
        self,
        operation: str,
        resource: Mapping[str, object],
        reads: Sequence[Read],
        decide: Decide[R],
        *,
        assume: Reads | None = None,
        announce: Collection[str] = (),
        announced: Mapping[str, frozenset[str]] | None = None,
        defer: Collection[Read] = (),
        contenders: int = 0,
    ) -> R: ...

    @overload
    def run(
        self,
        operation: str,
        resource: Mapping[str, object],
        reads: Sequence[Read],
        decide: Decide[R],
        *,
        finish: Callable[[R], T],
        assume: Reads | None = None,
        announce: Collection[str] = (),
        announced: Mapping[str, frozenset[str]] | None = None,
        defer: Collection[Read] = (),
        contenders: int = 0,
    ) -> T: ...

    def run(
        self,
        operation: str,
        resource: Mapping[str, object],
        reads: Sequence[Read],
        decide: Decide[R],
        *,
        finish: Callable[[R], T] | None = None,
        assume: Reads | None = None,
        announce: Collection[str] = (),
        announced: Mapping[str, frozenset[str]] | None = None,
        defer: Collection[Read] = (),
        contenders: int = 0,
    ) -> R | T:
        """Read, decide and commit until ``decide`` is satisfied; return ``finish(result)``.

        ``operation`` labels the conflicts and stale-copies metrics; ``resource`` names what is
        contended in the ``Aborted`` error. ``assume`` stands in for the first round's reads (a
        guess the commit's version checks verify, e.g. "no record yet"); later rounds read; a
        refusal of that first round is counted as a stale copy (not as a conflict).
        ``finish`` presents the result with reads ``decide`` cannot make (payloads) and may raise
        ``Reread``.

        ``announce``: the object keys the commit will upload, when the caller knows them before
        deciding (fixed per call). Their intent is then created in the first round's read round
        trip (``create_and_get_many``) instead of a round trip of its own before the puts; a
        decision that uploads nothing withdraws it. Not when the minute's intent bucket is not
        known to exist yet (a refusal would leave the bucket it made: once a minute, the intent
        waits for the commit as without ``announce``), nor with ``assume`` (no first read).

        ``announced``: intents made before the call for the objects it will upload (path -> keys;
        an ``IntentPool``'s): the call owns them from here on, like the intents it makes: its
        commit retires them, and it withdraws the ones its outcome leaves unused.

        ``defer``: reads of ``reads`` left out of the first round, for a record that is nearly
        always absent and whose absence the commit checks anyway (a ``Create`` of it). ``decide``
        then finds them not read (``Reads.has``) and either relies on the commit (a lost commit
        re-reads everything) or asks for them with ``More``. Later rounds read them. A first
        round refused because a deferred node exists counts as a stale copy, as with ``assume``.
        """
        synced = [False]  # one sync per call: after it, a refusal is the answer
        uploaded: set[str] = set()  # objects this call put that no landed commit owns yet
        # Intents this call owns (path -> the keys it announces: ``announced``, and the ones it
        # makes), each made before its objects' puts; the commit that owns the objects retires the
        # intent in its own transaction.
        mine: dict[str, frozenset[str]] = dict(announced or {})
        # Uploads of the commits whose outcome is unknown: kept until a decision made on a synced
        # read settles them (a Done keeping what landed references), never deleted on the way out.
        in_doubt: frozenset[str] = frozenset()
        pending: Commit[R] | None = None
        lost = 0
        try:
            for attempt in range(self._policy.rounds(contenders)):
                first = [r for r in reads if r not in defer] if attempt == 0 else reads
                given = assume if attempt == 0 else None
                now = self._now_ms()
                if attempt == 0 and announce and assume is None and self.intents.ready(now):
                    given = self._announce_and_read(first, announce, mine, now)
                decision = self._decide(first, decide, pending, given, synced)
                if isinstance(decision, Done):
                    # What was read (synced) after a commit in doubt settles whether it landed: a
                    # Done that keeps uploads says they are referenced, whatever ``finish`` raises.
                    # A new commit settles nothing: a commit in doubt may still have landed.
                    in_doubt = frozenset(decision.keep)
                    if finish is None:
                        result: R | T = decision.result
                    else:
                        try:
                            result = finish(decision.result)
                        except Reread:
                            continue  # ``pending`` stays: still this call's last commit
                    unused = sorted(uploaded - set(decision.keep))
                    kept = self._delete(unused, decision.cleanup, decision.withdraw)
                    uploaded.clear()
                    # Their objects are gone (or kept: then a landed commit retired the intent).
                    self._withdraw(mine, kept)
                    return result
                pending = None
                todo = {k: v for k, v in decision.uploads.items() if k not in uploaded}
                # Every object is announced before its put: by the intent of the first read
                # round (``announce``), of an earlier round, or by one made now.
                covered = {k for keys in mine.values() for k in keys}
                fresh = sorted(k for k in todo if k not in covered)
                if fresh:
                    path, _ = self.intents.announce(fresh, self._now_ms())
                    mine[path] = frozenset(fresh)
                self._upload(todo, uploaded)
                self._prepare(decision)
                owned = frozenset(decision.uploads)
                # An intent announcing any object the commit references goes in the commit itself
                # (version-checked against the sweep's claim): withdrawn after it, the sweep could
                # claim it in between and delete a referenced object. Its other keys, if any, were
                # never put or are deleted below with the rest of ``uploaded - owned``.
                retire = [path for path, keys in mine.items() if keys & owned]
                ops = [*decision.ops, *(intents.commit_op(p, intents.CREATED_VERSION) for p in retire)]
                try:
                    self._metadata.transaction(ops)
                except TransactionFailed as e:
                    if isinstance(e.cause, NoNodeError):  # an expiry bucket vanished under us
                        for root, due_ms in decision.buckets:
                            self.expiry(root).forget(due_ms)
                    self._check_announced(mine, resource)
                    if (given is assume and assume is not None) or (
                        attempt == 0 and _creates_a_deferred_node(ops, e, defer)
                    ):
                        # Decided on a copy or a guess (``assume``; a deferred read's "absent")
                        # that the store found stale: counted apart from the races lost after a
                        # read (a repeat registration, or a retried report, lands here every time).
                        # It still pauses: a copy goes stale because another process writes the
                        # same record, and retrying at once collides with it again (measured: 2
                        # processes reporting progress on one job lost 10% of their throughput).
                        self._metrics.commit_stale_copies.labels(operation).inc()
                    else:
                        self._metrics.commit_conflicts.labels(operation).inc()
                    lost += 1
                    self._sleep(self._policy.pause_s(lost))
                    continue
                except CommitOutcomeUnknown:
                    pending, in_doubt = decision, in_doubt | owned
                    continue  # re-read (synced): the next decision sees whether it landed
                for path in retire:
                    del mine[path]
                kept = self._delete(sorted(uploaded - owned), decision.cleanup, decision.withdraw)
                uploaded.clear()
                self._withdraw(mine, kept)
                return decision.result if finish is None else finish(decision.result)
            describe = " ".join(
                f"{k} {v!r}" if isinstance(v, str) else f"{k} {v}" for k, v in resource.items()
            )
            raise Aborted(
                f"{describe} is heavily contended; retry", reason=Reason.CONTENDED, metadata=resource
            )
        except Exception:
            # Our uploads are unreferenced unless a commit in doubt may own them; remove them now
            # rather than leave them to the orphan sweep, then their intents. A commit in doubt
            # keeps its intents: if it landed they are gone, if not the sweep takes intent and
            # objects together. (A crash skips all this: the intents lead the sweep to them.)
            kept = self._delete(sorted(uploaded - in_doubt), ())
            self._withdraw(mine, kept | in_doubt)
            raise

    def _announce_and_read(
        self, first: Sequence[Read], keys: Collection[str], announced: dict[str, frozenset[str]], now_ms: int
    ) -> Reads:
        """The first round's reads, with the intent for ``keys`` created in the same round trip
        (sent ahead of the node reads; acknowledged before this returns, so before any put)."""
        paths = [r.path for r in first if isinstance(r, ReadNode)]
        path, _, nodes = self.intents.announce_and_read(sorted(keys), now_ms, paths)
        announced[path] = frozenset(keys)
        return Reads(nodes, self._listings(first))

    def _withdraw(self, announced: Mapping[str, frozenset[str]], left: frozenset[str]) -> None:
        """Remove the intents whose objects were deleted (best effort: the sweep takes what is
        left); one naming an object in ``left`` (a failed delete, a commit in doubt) stays, so that
        the sweep finds that object."""
        for path, keys in announced.items():
            if keys & left:
                continue
            try:
                self.intents.withdraw(path, intents.CREATED_VERSION)
            except StoreUnavailable as e:
                _log.warning("could not remove upload intent %s now (the orphan sweep will): %s", path, e)

    def _check_announced(
        self, announced: Mapping[str, frozenset[str]], resource: Mapping[str, object]
    ) -> None:
        """After a lost commit: if the orphan sweep claimed one of our intents (the call outlived
        the grace), its objects are going and no later round can commit them; give up."""
        if not announced:
            return
        nodes = self._metadata.get_many(list(announced))
        if all(n is not None and n.version == intents.CREATED_VERSION for n in nodes.values()):
            return
        raise Aborted(
            "the payload of this call was collected by the orphan sweep before it could commit (the call "
            "took longer than --orphan-grace); retry",
            reason=Reason.CONTENDED,
            metadata=resource,
        )

    def _upload(self, todo: Mapping[str, bytes], uploaded: set[str]) -> None:
        """Put ``todo``'s payloads in parallel (a report may carry dozens), all before the commit.
        Every key counts as uploaded before its put starts (a put that fails midway may have
        landed); a failure is raised only once no put is still running, so the caller's cleanup
        never races an upload."""
        if not todo:
            return
        assert self._blobs is not None, "an operation uploads without a blob store"
        blobs = self._blobs
        uploaded.update(todo)
        if len(todo) == 1:
            key, payload = next(iter(todo.items()))
            blobs.put(key, payload)
            return
        futures = [_UPLOADS.submit(blobs.put, key, payload) for key, payload in todo.items()]
        concurrent.futures.wait(futures)
        for future in futures:
            future.result()  # the first failure, if any

    def read(self, reads: Iterable[Read], *, sync: bool = False) -> Reads:
        """Issue ``reads`` together: every node in one ``get_many``, then the listings; ``sync``:
        sync first (sent with the node reads), so that they see every write committed before."""
        wanted = list(reads)
        paths = [r.path for r in wanted if isinstance(r, ReadNode)]
        nodes = self._metadata.synced_get_many("/", paths) if sync else self._metadata.get_many(paths)
        return Reads(nodes, self._listings(wanted))

    def _listings(self, reads: Iterable[Read]) -> dict[str, tuple[str, ...]]:
        return {r.path: tuple(self._metadata.children(r.path)) for r in reads if isinstance(r, ReadChildren)}

    def delete_objects(self, keys: Iterable[str]) -> bool:
        """Best effort: an object left behind is an orphan, which the janitor sweeps later.
        Returns whether every one was deleted."""
        return not self._delete_each(keys)

    def _delete_each(self, keys: Iterable[str]) -> frozenset[str]:
        """Delete each object; returns the ones left behind (the store failed)."""
        if self._blobs is None:
            return frozenset()
        left: set[str] = set()
        for key in keys:
            try:
                self._blobs.delete(key)
            except StoreUnavailable as e:
                left.add(key)
                _log.warning("could not delete %s now (the orphan sweep will): %s", key, e)
        return frozenset(left)

    def _decide(
        self,
        first: Sequence[Read],
        decide: Decide[R],
        pending: Commit[R] | None,
        assume: Reads | None,
        synced: list[bool],
    ) -> Done[R] | Commit[R]:
        if assume is not None:
            reads = assume
        elif pending is not None:
            # After a commit in doubt: the ZooKeeper server kazoo reconnected to may not have
            # applied it yet; a read that missed it would decide again as if it never landed.
            synced[0] = True
            reads = self.read(first, sync=True)
        else:
            reads = self.read(first)
        while True:
            try:
                decision = decide(reads, pending)
            except CorruptRecord as e:  # name the node among the reads: the caller's log and status do
                raise locate(e, reads.nodes) from e.__cause__
            except SnapcoordError as e:
                if synced[0] or not may_be_stale(e):
                    raise
                # A refusal that may only say "this replica's ZooKeeper server is behind": sync,
                # read everything again (the dependent reads too: they may differ now) and
                # decide anew. Once per call, so a true refusal costs one extra round trip.
                synced[0] = True
                known = [ReadNode(p) for p in reads.nodes] + [ReadChildren(p) for p in reads.lists]
                reads = self.read(known or first, sync=True)
                continue
            if not isinstance(decision, More):
                return decision
            missing = [r for r in decision.reads if not reads.has(r)]
            if not missing:
                raise AssertionError(f"decide asked again for what it has read: {decision.reads}")
            reads = reads.merged(self.read(missing))

    def _prepare(self, commit: Commit[Any]) -> None:
        for path in commit.ensure:
            if path not in self._ensured:
                self._metadata.ensure_path(path)
                self._ensured.add(path)
        for root, due_ms in commit.buckets:
            self.expiry(root).prepare(due_ms)

    def _delete(
        self, unowned: Sequence[str], cleanup: Sequence[str], withdraw: Sequence[str] = ()
    ) -> frozenset[str]:
        """Delete a call's unowned uploads and the objects its commit unreferenced; returns the
        uploads left behind (a failed delete), whose intents must stay."""
        unreferenced = not self._delete_each(cleanup)
        left = self._delete_each(unowned)
        if unreferenced and withdraw:
            # Their objects are gone: so is the intent's reason. Left (a failed delete), it leads
            # the sweep to them.
            held: list[str] | None = getattr(self._local, "withdrawals", None)
            if held is not None:
                held.extend(withdraw)
            else:
                self.intents.withdraw_each(withdraw)
        return left
